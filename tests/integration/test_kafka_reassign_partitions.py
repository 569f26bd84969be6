"""Kafka's own ``kafka-reassign-partitions`` (4.3.1's ReassignPartitionsCommand) against the Kafka listener.

Unchanged, as a Kafka operator runs it: ``--execute`` with a plan file (AlterPartitionReassignments,
after Metadata, DescribeCluster and ListPartitionReassignments), ``--verify`` until the move is
done, ``--cancel`` of a throttled move in progress. The outcome is checked in the metadata.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from sluice.client import Admin, TopicPartition
from sluice.testing import LocalCluster
from tests.support.waiting import wait_for

from .helpers import checked
from .test_kafka_java_tools import run_tool

MAIN = "org.apache.kafka.tools.reassign.ReassignPartitionsCommand"
THROTTLE = 128 * 1024
CONFIG = {"min.insync.replicas": "1", "leader.replication.throttled.rate": str(THROTTLE)}


def _plan(path: Path, topic: str, replicas: list[int]) -> Path:
    path.write_text(json.dumps({"version": 1, "partitions": [{"topic": topic, "partition": 0, "replicas": replicas}]}))
    return path


def _log_dir_sizes(jars: Path, boot: list[str], topic: str) -> dict[int, int]:
    """Broker id -> the size of ``topic``-0 there, as Kafka's LogDirsCommand prints it (its JSON line)."""
    out = run_tool(jars, "org.apache.kafka.tools.LogDirsCommand", [*boot, "--describe", "--topic-list", topic])
    described = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
    return {
        b["broker"]: p["size"]
        for b in described["brokers"]
        for d in b["logDirs"]
        for p in d["partitions"]
        if p["partition"] == f"{topic}-0"
    }


def test_execute_verify_and_cancel(tmp_path: Path) -> None:
    from bench.kafka.fetch import ensure_jars

    jars = ensure_jars()
    with checked(LocalCluster(brokers=3, data_dir=tmp_path / "cluster", config=CONFIG, kafka_listener=True)) as cluster:
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        boot = ["--bootstrap-server", cluster.kafka_bootstrap_servers]
        admin.create_topic("small", partitions=1, replication_factor=2)
        before = list(admin.describe_topic("small").partitions[0].replicas)
        target = [b for b in range(3) if b not in before] + before[:1]
        plan = _plan(tmp_path / "plan.json", "small", target)
        out = run_tool(jars, MAIN, [*boot, "--reassignment-json-file", str(plan), "--execute"])
        assert "Successfully started partition reassignment" in out, out
        deadline = time.monotonic() + 60
        while True:
            verified = run_tool(
                jars, MAIN, [*boot, "--reassignment-json-file", str(plan), "--verify", "--preserve-throttles"]
            )
            if "Reassignment of partition small-0 is completed" in verified or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert "Reassignment of partition small-0 is completed" in verified, verified
        wait_for(lambda: admin.describe_topic("small").partitions[0].replicas == target, 10, "the new replicas")

        # a throttled move of 4 MiB (31 s at least: two JVM starts fit), cancelled by Kafka's tool while it runs
        admin.create_topic("big", partitions=1, replication_factor=1)
        from sluice.client import Producer

        producer = Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all", linger_ms=5)
        for f in [producer.send("big", value=b"z" * 4096) for _ in range(1024)]:
            f.result(timeout=60)
        producer.close()
        owner = admin.describe_topic("big").partitions[0].replicas
        # Kafka's kafka-log-dirs sees its size: what the operator judges a move by
        sizes = _log_dir_sizes(jars, boot, "big")
        assert list(sizes) == [owner[0]], sizes
        assert 4 << 20 <= sizes[owner[0]] <= (4 << 20) + (256 << 10), sizes  # the values, plus headers
        spare = next(b for b in range(3) if b not in owner)
        big = _plan(tmp_path / "big.json", "big", [spare])
        run_tool(jars, MAIN, [*boot, "--reassignment-json-file", str(big), "--execute"])
        assert TopicPartition("big", 0) in admin.list_partition_reassignments()
        listed = run_tool(jars, MAIN, [*boot, "--list"])
        assert "big-0" in listed, listed
        out = run_tool(jars, MAIN, [*boot, "--reassignment-json-file", str(big), "--cancel", "--preserve-throttles"])
        assert "Successfully cancelled partition reassignment for: big-0" in out, out
        assert admin.list_partition_reassignments() == {}
        wait_for(lambda: admin.describe_topic("big").partitions[0].replicas == owner, 10, "the original replicas")
        admin.close()
