"""Kafka 4.3.1's TransactionalMessageCopier against Sluice's Kafka listener, with faults.

The copier is Kafka's own system-test tool: a Java consumer in a classic group (``--group-mode``)
reads an input partition read_committed, and a Java transactional producer copies each batch and
commits the consumer's positions in the same transaction with the consumer's group metadata
(``--use-group-metadata``: KIP-447, so the group's generation fences a zombie);
``--enable-random-aborts`` aborts about a third of the transactions and rewinds. Two faults:

* the copier is killed with SIGKILL mid-copy and a new one with the same transactional id and
  group takes over (its InitProducerId fences the old producer and aborts its open transaction;
  its consumer joins once the old member's session expired and resumes from the committed
  offsets);
* on 3 brokers with replication factor 3, the broker coordinating the group is killed with
  SIGKILL mid-copy and restarted (the group and the transaction move to other brokers).

Either way the output read read_committed holds every input value exactly once, and read
read_uncommitted it also shows the aborted copies. Every loop is bounded in count and time.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from bench.kafka.cluster import java_command
from bench.kafka.fetch import ensure_jars
from sluice.api.v1 import broker_pb2 as bpb
from sluice.client import Admin, Producer
from sluice.testing import LocalCluster
from tests.support.waiting import wait_for

from .helpers import read_topic
from .wire import Wire

COPIER = "org.apache.kafka.tools.TransactionalMessageCopier"
CONFIG = {"group.initial.rebalance.delay.ms": 300}
RF3_CONFIG = {**CONFIG, "min.insync.replicas": "2", "replica.lag.time.max.ms": "3000",
              "offsets.topic.replication.factor": 3, "transaction.state.log.replication.factor": 3}  # fmt: skip


@pytest.fixture(scope="module")
def jars() -> Path:
    return ensure_jars()


class Copier:
    """One TransactionalMessageCopier process, its JSON status lines read in a thread."""

    def __init__(self, jars: Path, cluster: LocalCluster, input_topic: str, output_topic: str, txn_id: str,
                 group: str, log_path: Path) -> None:  # fmt: skip
        args = ["--broker-list", cluster.kafka_bootstrap_servers, "--input-topic", input_topic,
                "--input-partition", "0", "--output-topic", output_topic, "--transactional-id", txn_id,
                "--consumer-group", group, "--transaction-size", "20", "--transaction-timeout", "20000",
                "--group-mode", "--use-group-metadata", "--enable-random-aborts"]  # fmt: skip
        self.stderr: IO[str] = log_path.open("a")
        self.proc = subprocess.Popen(
            java_command(jars, COPIER, args, heap="256m", tool=True),
            stdout=subprocess.PIPE, stderr=self.stderr, text=True,
        )  # fmt: skip
        self.statuses: list[dict[str, object]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                try:
                    self.statuses.append(json.loads(line))
                except ValueError:
                    continue

    def processed(self) -> int:
        return max((int(s.get("totalProcessed", 0)) for s in self.statuses), default=0)  # type: ignore[call-overload]

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)
        self.reader.join(timeout=10)
        self.stderr.close()

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout=timeout)
        self.reader.join(timeout=10)
        self.stderr.close()
        return code


def produce_input(cluster: LocalCluster, topic: str, count: int, rf: int) -> list[bytes]:
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    admin.create_topic(topic, partitions=1, replication_factor=rf)
    admin.create_topic(f"{topic}-out", partitions=2, replication_factor=rf)
    admin.close()
    values = [str(i).encode() for i in range(count)]
    producer = Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all")
    for value in values:
        producer.send(topic, value=value, partition=0)
    producer.flush()
    producer.close()
    return values


def check_output(cluster: LocalCluster, output: str, values: list[bytes]) -> None:
    committed = Counter(r[3] for r in read_topic(cluster.bootstrap_servers, output, "read_committed", limit_s=120))
    missing, extra = set(values) - set(committed), set(committed) - set(values)
    assert not missing and not extra, f"{len(missing)} values missing, unexpected: {sorted(extra)[:5]}"
    assert [v for v, n in committed.items() if n > 1] == [], "a value was copied twice in committed transactions"
    uncommitted = Counter(r[3] for r in read_topic(cluster.bootstrap_servers, output, "read_uncommitted", limit_s=120))
    assert set(uncommitted) == set(values)
    # the random aborts (about a third of the transactions): their copies are in the log, aborted
    assert sum(uncommitted.values()) > sum(committed.values())


def coordinator_of(cluster: LocalCluster, group: str) -> int:
    for b in cluster.brokers:
        if b.state != "running":
            continue
        wire = Wire(b.address)
        try:
            found = wire.stub.FindCoordinator(bpb.FindCoordinatorRequest(key=group, key_type=bpb.GROUP), timeout=5)
            if found.error_code == 0:
                return int(found.node_id)
        except Exception:
            continue
        finally:
            wire.close()
    raise AssertionError(f"no broker names the coordinator of {group!r}")


def run_to_completion(copier: Copier, timeout: float = 300.0) -> None:
    code = copier.wait(timeout)
    assert code == 0, f"the copier exited with {code}; its last statuses: {copier.statuses[-3:]}"


@pytest.fixture
def one_broker(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(brokers=1, data_dir=tmp_path / "data", config=CONFIG, kafka_listener=True) as cluster:
        yield cluster


def test_copier_killed_and_replaced_copies_every_value_exactly_once(
    jars: Path, one_broker: LocalCluster, tmp_path: Path
) -> None:
    cluster, topic, count = one_broker, "copier-in", 3000
    values = produce_input(cluster, topic, count, rf=1)
    first = Copier(jars, cluster, topic, f"{topic}-out", "copier-txn", "copier-group", tmp_path / "copier.log")
    wait_for(lambda: first.processed() >= count // 3 or first.proc.poll() is not None, timeout=240,
             interval=0.05, what="a third of the input copied")  # fmt: skip
    assert first.proc.poll() is None, "the copier finished before it could be killed: make the input larger"
    first.kill()  # SIGKILL: an open transaction, a member that never leaves
    second = Copier(jars, cluster, topic, f"{topic}-out", "copier-txn", "copier-group", tmp_path / "copier.log")
    run_to_completion(second)
    assert second.statuses and second.statuses[-1].get("remaining") == 0
    check_output(cluster, f"{topic}-out", values)


def test_copier_on_three_brokers_while_the_group_coordinator_is_killed_and_restarted(
    jars: Path, tmp_path: Path
) -> None:
    with LocalCluster(brokers=3, data_dir=tmp_path / "data", config=RF3_CONFIG, kafka_listener=True) as cluster:
        topic, count, group = "copier3-in", 3000, "copier3-group"
        values = produce_input(cluster, topic, count, rf=3)
        copier = Copier(jars, cluster, topic, f"{topic}-out", "copier3-txn", group, tmp_path / "copier.log")
        wait_for(lambda: copier.processed() >= count // 3 or copier.proc.poll() is not None, timeout=240,
                 interval=0.05, what="a third of the input copied")  # fmt: skip
        assert copier.proc.poll() is None, "the copier finished before the fault: make the input larger"
        victim = coordinator_of(cluster, group)
        cluster.kill(victim)  # SIGKILL
        time.sleep(2)
        cluster.restart(victim)
        run_to_completion(copier)
        check_output(cluster, f"{topic}-out", values)
