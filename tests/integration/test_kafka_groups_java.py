"""Kafka 4.3.1's Java consumer and kafka-consumer-groups against classic groups on the Kafka listener.

ConsoleConsumer with ``--group`` is the Java client's classic protocol (JoinGroup v9, SyncGroup,
Heartbeat, its default range + cooperative-sticky assignors, commits on close);
``kafka-consumer-groups --describe`` (ConsumerGroupCommand) is what an operator runs: it finds
the group through ListGroups/DescribeGroups, its committed offsets through OffsetFetch and the
log end through ListOffsets, and prints the lag per partition. The jars come from
``bench.kafka.fetch.ensure_jars`` (cached under ``~/.cache/sluice-kafka``).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.kafka.cluster import java_command
from bench.kafka.fetch import ensure_jars
from sluice.client import Admin, Consumer, Producer
from sluice.testing import LocalCluster

TOOL_TIMEOUT_S = 240.0
GROUP_COMMAND = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"


@pytest.fixture(scope="module")
def jars() -> Path:
    return ensure_jars()


@pytest.fixture(scope="module")
def jcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(
        brokers=1,
        data_dir=tmp_path_factory.mktemp("kafka-groups-java"),
        config={"group.initial.rebalance.delay.ms": 300},
        kafka_listener=True,
    ) as cluster:
        yield cluster


def run_tool(jars: Path, main: str, args: list[str]) -> str:
    done = subprocess.run(java_command(jars, main, args, heap="256m", tool=True), capture_output=True, text=True,
                          timeout=TOOL_TIMEOUT_S, check=False)  # fmt: skip
    assert done.returncode == 0, f"{main} failed ({done.returncode}): {done.stderr[-3000:]}"
    return done.stdout


def produce(cluster: LocalCluster, topic: str, partitions: int, count: int, start: int = 0) -> None:
    producer = Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all")
    for i in range(start, start + count):
        producer.send(topic, value=str(i).encode(), partition=i % partitions)
    producer.flush()
    producer.close()


def describe_rows(jars: Path, cluster: LocalCluster, group: str) -> dict[int, dict[str, str]]:
    """kafka-consumer-groups --describe: partition -> its row (CURRENT-OFFSET, LOG-END-OFFSET, LAG ...)."""
    out = run_tool(jars, GROUP_COMMAND, ["--bootstrap-server", cluster.kafka_bootstrap_servers, "--describe",
                                         "--group", group])  # fmt: skip
    lines = [line.split() for line in out.splitlines() if line.strip()]
    header = next(i for i, cols in enumerate(lines) if cols[:2] == ["GROUP", "TOPIC"])
    names = lines[header]
    return {int(cols[2]): dict(zip(names, cols, strict=False)) for cols in lines[header + 1 :] if cols[0] == group}


def test_console_consumer_in_a_group_then_consumer_groups_describe_shows_the_lag(
    jars: Path, jcluster: LocalCluster
) -> None:
    topic, group, partitions = "java-group-topic", "java-console-group", 2
    admin = Admin(bootstrap_servers=jcluster.bootstrap_servers)
    admin.create_topic(topic, partitions=partitions, replication_factor=1)
    produce(jcluster, topic, partitions, 300)
    consumed = run_tool(
        jars,
        "org.apache.kafka.tools.consumer.ConsoleConsumer",
        ["--bootstrap-server", jcluster.kafka_bootstrap_servers, "--topic", topic, "--group", group,
         "--from-beginning", "--max-messages", "300", "--timeout-ms", "90000"],
    )  # fmt: skip
    assert sorted(int(v) for v in consumed.split()) == list(range(300))
    # the commit the Java consumer made on close is the group's, seen over gRPC too
    committed = admin.list_consumer_group_offsets(group)
    assert {tp.partition: off for tp, off in committed.items()} == {0: 150, 1: 150}
    produce(jcluster, topic, partitions, 50, start=300)  # 25 new records per partition: the lag
    rows = describe_rows(jars, jcluster, group)
    assert sorted(rows) == [0, 1]
    for p in (0, 1):
        assert (rows[p]["TOPIC"], rows[p]["CURRENT-OFFSET"], rows[p]["LOG-END-OFFSET"], rows[p]["LAG"]) == (
            topic, "150", "175", "25",
        ), rows[p]  # fmt: skip
    listed = run_tool(jars, GROUP_COMMAND, ["--bootstrap-server", jcluster.kafka_bootstrap_servers, "--list"])
    assert group in listed.split()
    admin.close()


def test_console_consumer_pattern_subscription_reads_the_matching_topics(jars: Path, jcluster: LocalCluster) -> None:
    """``--include REGEX``: the Java consumer's pattern subscription, matched against an all-topics Metadata."""
    admin = Admin(bootstrap_servers=jcluster.bootstrap_servers)
    for topic in ("jp-one", "jp-two", "jq-other"):
        admin.create_topic(topic, partitions=1, replication_factor=1)
    admin.close()
    produce(jcluster, "jp-one", 1, 20)
    produce(jcluster, "jp-two", 1, 20, start=100)
    produce(jcluster, "jq-other", 1, 20, start=1000)
    consumed = run_tool(
        jars,
        "org.apache.kafka.tools.consumer.ConsoleConsumer",
        ["--bootstrap-server", jcluster.kafka_bootstrap_servers, "--include", "^jp-.*", "--group", "java-pattern",
         "--from-beginning", "--max-messages", "40", "--timeout-ms", "90000"],
    )  # fmt: skip
    assert sorted(int(v) for v in consumed.split()) == list(range(20)) + list(range(100, 120))


def test_java_consumer_with_the_kip848_protocol_joins_a_sluice_group(jars: Path, jcluster: LocalCluster) -> None:
    """ConsumerGroupHeartbeat over the listener: ``group.protocol=consumer`` is Sluice's own group protocol."""
    topic, group, partitions = "java-kip848-topic", "java-kip848-group", 2
    admin = Admin(bootstrap_servers=jcluster.bootstrap_servers)
    admin.create_topic(topic, partitions=partitions, replication_factor=1)
    produce(jcluster, topic, partitions, 200)
    consumed = run_tool(
        jars,
        "org.apache.kafka.tools.consumer.ConsoleConsumer",
        ["--bootstrap-server", jcluster.kafka_bootstrap_servers, "--topic", topic, "--group", group,
         "--command-property", "group.protocol=consumer", "--from-beginning", "--max-messages", "200",
         "--timeout-ms", "90000"],
    )  # fmt: skip
    assert sorted(int(v) for v in consumed.split()) == list(range(200))
    assert {tp.partition: off for tp, off in admin.list_consumer_group_offsets(group).items()} == {0: 100, 1: 100}
    admin.close()
    # the KIP-848 coordinator path (group epochs), not the classic one (generations)
    log = jcluster.brokers[0].log_path.read_text(errors="replace")
    assert f"group '{group}': epoch 0 -> 1" in log
    assert f"group '{group}': generation" not in log


def test_consumer_groups_describe_of_a_sluice_group_uses_consumer_group_describe(
    jars: Path, jcluster: LocalCluster
) -> None:
    """A KIP-848 group with a live Sluice member: ConsumerGroupDescribe, with its member and lag."""
    topic, group = "java-describe-kip848", "java-describe-kip848-group"
    admin = Admin(bootstrap_servers=jcluster.bootstrap_servers)
    admin.create_topic(topic, partitions=2, replication_factor=1)
    produce(jcluster, topic, 2, 100)
    member = Consumer(bootstrap_servers=jcluster.bootstrap_servers, group_id=group, max_poll_records=10)
    member.subscribe([topic])
    read: list[tuple[int, int]] = []
    deadline = time.monotonic() + 60
    while len(read) < 30 and time.monotonic() < deadline:
        read += [(r.partition, r.offset) for r in member.poll(timeout=0.5)]
    member.commit()
    committed = {tp.partition: off for tp, off in admin.list_consumer_group_offsets(group).items()}
    try:
        rows = describe_rows(jars, jcluster, group)
        assert sorted(rows) == [0, 1]
        for p in (0, 1):
            row = rows[p]
            current = committed.get(p)
            expected = ("-" if current is None else str(current), "50", "-" if current is None else str(50 - current))
            assert (row["CURRENT-OFFSET"], row["LOG-END-OFFSET"], row["LAG"]) == expected, row
            assert row["CONSUMER-ID"] != "-"  # the live member holds the partition
    finally:
        member.close()
        admin.close()
