"""Apache Kafka 4.3.1's own Java client and tools against the Kafka listener of real broker processes.

The jars come from Maven Central through ``bench.kafka.fetch.ensure_jars`` (cached under
``~/.cache/sluice-kafka``; fetched with mvn when absent, so this test needs them, it does not skip).
VerifiableProducer (idempotent, acks=all) must see every record acknowledged at the offsets the gRPC
consumer then reads; ProducerPerformance drives the Java transactional producer (TV1: no
``transaction.version`` is advertised); ConsoleConsumer (read_committed, an assigned partition, no
group; groups are test_kafka_groups_java.py's) reads everything back.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.kafka.cluster import java_command
from bench.kafka.fetch import ensure_jars
from sluice.client import Admin, Consumer, TopicPartition
from sluice.testing import LocalCluster

TOOL_TIMEOUT_S = 240.0


@pytest.fixture(scope="module")
def jars() -> Path:
    return ensure_jars()


@pytest.fixture(scope="module")
def jcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(brokers=1, data_dir=tmp_path_factory.mktemp("kafka-java"), kafka_listener=True) as cluster:
        yield cluster


def run_tool(jars: Path, main: str, args: list[str]) -> str:
    cmd = java_command(jars, main, args, heap="256m", tool=True)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False)
    assert done.returncode == 0, f"{main} failed ({done.returncode}): {done.stderr[-2000:]}"
    return done.stdout


def grpc_values(cluster: LocalCluster, topic: str, count: int) -> list[tuple[int, bytes | None]]:
    consumer = Consumer(bootstrap_servers=cluster.bootstrap_servers, group_id=None, isolation_level="read_committed")
    consumer.assign([TopicPartition(topic, 0)])
    consumer.seek_to_beginning()
    out: list[tuple[int, bytes | None]] = []
    deadline = time.monotonic() + 60
    while len(out) < count and time.monotonic() < deadline:
        out += [(r.offset, r.value) for r in consumer.poll(timeout=0.5)]
    consumer.close()
    return out


def verifiable_produce(
    jars: Path, cluster: LocalCluster, topic: str, count: int, config: Path, settings: str
) -> list[dict[str, Any]]:
    """Create ``topic`` and run VerifiableProducer (acks=all) with ``settings`` for ``count`` records: its events."""
    config.write_text(settings)
    Admin(bootstrap_servers=cluster.bootstrap_servers).create_topic(topic, partitions=1, replication_factor=1)
    out = run_tool(
        jars,
        "org.apache.kafka.tools.VerifiableProducer",
        ["--bootstrap-server", cluster.kafka_bootstrap_servers, "--topic", topic, "--max-messages", str(count),
         "--acks", "-1", "--command-config", str(config)],
    )  # fmt: skip
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_verifiable_producer_idempotent_acks_all_every_record_acknowledged(
    jars: Path, jcluster: LocalCluster, tmp_path: Path
) -> None:
    topic = "java-verifiable"
    events = verifiable_produce(
        jars, jcluster, topic, 2000, tmp_path / "producer.properties",
        "enable.idempotence=true\nretries=2147483647\nmax.in.flight.requests.per.connection=5\n",
    )  # fmt: skip
    acked = [e for e in events if e.get("name") == "producer_send_success"]
    assert not [e for e in events if e.get("name") == "producer_send_error"]
    assert len(acked) == 2000
    assert sorted(e["offset"] for e in acked) == list(range(2000))
    # VerifiableProducer's values are the decimal strings 0..N-1, sent in order
    got = grpc_values(jcluster, topic, 2000)
    assert got == [(e["offset"], e["value"].encode()) for e in sorted(acked, key=lambda e: e["offset"])]


@pytest.mark.parametrize("codec", ["snappy", "zstd", "lz4"])
def test_the_java_clients_compressed_batches_are_stored_as_sent_and_read_by_both_clients(
    jars: Path, jcluster: LocalCluster, tmp_path: Path, codec: str
) -> None:
    """The Java client's codecs as it writes them (snappy in xerial's framing, zstd frames without a
    content size): stored as sent, decoded by Sluice's client, read back by the Java consumer."""
    topic = f"java-{codec}"
    events = verifiable_produce(
        jars, jcluster, topic, 500, tmp_path / "producer.properties",
        f"enable.idempotence=true\nretries=2147483647\ncompression.type={codec}\nlinger.ms=20\n",
    )  # fmt: skip
    acked = [e for e in events if e.get("name") == "producer_send_success"]
    assert sorted(e["offset"] for e in acked) == list(range(500))
    assert grpc_values(jcluster, topic, 500) == [(i, str(i).encode()) for i in range(500)]
    consumed = run_tool(
        jars,
        "org.apache.kafka.tools.consumer.ConsoleConsumer",
        ["--bootstrap-server", jcluster.kafka_bootstrap_servers, "--topic", topic, "--partition", "0",
         "--offset", "earliest", "--max-messages", "500", "--timeout-ms", "60000"],
    )  # fmt: skip
    assert [ln for ln in consumed.splitlines() if ln.isdigit()] == [str(i) for i in range(500)]


def test_java_transactional_producer_then_console_consumer_read_committed(jars: Path, jcluster: LocalCluster) -> None:
    topic = "java-txn"
    Admin(bootstrap_servers=jcluster.bootstrap_servers).create_topic(topic, partitions=1, replication_factor=1)
    out = run_tool(
        jars,
        "org.apache.kafka.tools.ProducerPerformance",
        ["--topic", topic, "--num-records", "3000", "--record-size", "100", "--throughput", "-1",
         "--transactional-id", "java-perf-txn", "--transaction-duration-ms", "100",
         "--command-property", f"bootstrap.servers={jcluster.kafka_bootstrap_servers}", "acks=all"],
    )  # fmt: skip
    assert "3000 records sent" in out
    consumed = run_tool(
        jars,
        "org.apache.kafka.tools.consumer.ConsoleConsumer",
        ["--bootstrap-server", jcluster.kafka_bootstrap_servers, "--topic", topic, "--partition", "0",
         "--offset", "earliest", "--max-messages", "3000", "--isolation-level", "read_committed",
         "--timeout-ms", "60000", "--formatter-property", "print.value=false",
         "--formatter-property", "print.offset=true"],
    )  # fmt: skip
    offsets = [int(line.split(":", 1)[1]) for line in consumed.splitlines() if line.startswith("Offset:")]
    assert len(offsets) == 3000
    # the same records at the same offsets as the gRPC read_committed consumer sees (markers in between)
    assert offsets == [o for o, _ in grpc_values(jcluster, topic, 3000)]


def test_topic_command_create_and_describe(jars: Path, jcluster: LocalCluster) -> None:
    """kafka-topics.sh --create: the Java AdminClient reads the created topic's configs (CreateTopics v5+)."""
    topic = "java-topic-command"
    out = run_tool(
        jars,
        "org.apache.kafka.tools.TopicCommand",
        ["--bootstrap-server", jcluster.kafka_bootstrap_servers, "--create", "--topic", topic, "--partitions", "3",
         "--replication-factor", "1", "--config", "retention.ms=3600000"],
    )  # fmt: skip
    assert f"Created topic {topic}." in out
    admin = Admin(bootstrap_servers=jcluster.bootstrap_servers)
    try:
        assert len(admin.describe_topics([topic])[0].partitions) == 3
    finally:
        admin.close()
    described = run_tool(
        jars,
        "org.apache.kafka.tools.TopicCommand",
        ["--bootstrap-server", jcluster.kafka_bootstrap_servers, "--describe", "--topic", topic],
    )
    assert "PartitionCount: 3" in described and "retention.ms=3600000" in described
