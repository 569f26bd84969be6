"""The exactly-once copier under bounces: our version of Kafka's transactions system test.

Three brokers, replication factor 3, min.insync.replicas 2; an input topic of 2 partitions
seeded with numbered messages, an output topic of 3; copier processes
(``python -m sluice.cli.copier``) copy input to output in transactions while brokers are
hard-bounced (kill -9, restart), clean-bounced (SIGTERM, restart), or the copiers themselves
are killed and restarted. At the end the output holds every input message exactly once, in
input order per partition, and a read_committed consumer reading during the bounces saw no
duplicate and no aborted record.

Counts are small by default so CI runs it in minutes; the full size is
``SLUICE_COPIER_MESSAGES=100000 SLUICE_COPIER_TXN_SIZE=750 pytest tests/integration/test_copier.py``.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from sluice.client import Admin, Consumer, Producer, TopicPartition
from sluice.testing import LocalCluster

from .helpers import OffsetMonitor, read_topic

MESSAGES = int(os.environ.get("SLUICE_COPIER_MESSAGES", "4000"))
TXN_SIZE = int(os.environ.get("SLUICE_COPIER_TXN_SIZE", "100"))
BOUNCES = int(os.environ.get("SLUICE_COPIER_BOUNCES", "3"))
COPY_LIMIT_S = float(os.environ.get("SLUICE_COPIER_LIMIT_S", "400"))
CONFIG = {"min.insync.replicas": "2", "replica.lag.time.max.ms": "3000"}


class Copiers:
    def __init__(self, cluster: LocalCluster, logs: Path, group_mode: bool) -> None:
        self.cluster = cluster
        self.logs = logs
        self.group_mode = group_mode
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, i: int) -> None:
        mode = ["--group-mode"] if self.group_mode else ["--partition", str(i)]
        log = open(self.logs / f"copier-{i}.log", "ab")  # noqa: SIM115 - the process owns it
        self.procs[i] = subprocess.Popen(
            [
                sys.executable, "-m", "sluice.cli.copier",
                "--bootstrap-server", self.cluster.bootstrap_servers,
                "--input", "input", "--output", "output", "--group", "copiers",
                "--transactional-id", f"copier-{i}", "--transaction-size", str(TXN_SIZE),
                "--max-seconds", str(COPY_LIMIT_S), *mode,
            ],
            stdout=log,
            stderr=log,
        )  # fmt: skip

    def kill(self, i: int) -> None:
        self.procs[i].kill()
        self.procs[i].wait(30)

    def running(self) -> bool:
        return any(p.poll() is None for p in self.procs.values())

    def wait(self, limit_s: float) -> dict[int, int | None]:
        deadline = time.monotonic() + limit_s
        for p in self.procs.values():
            remaining = max(deadline - time.monotonic(), 0.1)
            try:
                p.wait(remaining)
            except subprocess.TimeoutExpired:
                p.kill()
        return {i: p.returncode for i, p in self.procs.items()}

    def log_tail(self) -> str:
        return "\n".join(f"--- copier-{i}\n" + (self.logs / f"copier-{i}.log").read_text()[-1500:] for i in self.procs)


class Watcher(threading.Thread):
    """A read_committed consumer reading the output while everything bounces."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap = bootstrap
        self.seen: Counter[bytes] = Counter()
        self.stop_event = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            consumer = Consumer(bootstrap_servers=self.bootstrap, group_id=None, isolation_level="read_committed")
            consumer.assign([TopicPartition("output", p) for p in range(3)])
            while not self.stop_event.is_set():
                for r in consumer.poll(timeout=0.5):
                    if r.value is not None:
                        self.seen[r.value] += 1
            consumer.close()
        except BaseException as exc:  # reported by the test
            self.error = exc


def seed(bootstrap: str) -> list[bytes]:
    admin = Admin(bootstrap_servers=bootstrap)
    admin.create_topic("input", partitions=2, replication_factor=3)
    admin.create_topic("output", partitions=3, replication_factor=3)
    admin.close()
    producer = Producer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    sent = []
    for i in range(MESSAGES):
        p = i % 2
        value = f"{p}:{i // 2}".encode()
        producer.send("input", key=value, value=value, partition=p)
        sent.append(value)
    producer.flush()
    producer.close()
    return sent


@pytest.mark.parametrize(
    ("group_mode", "bounce"),
    [
        (False, "hard"),
        (False, "clean"),
        (False, "copiers"),
        (True, "hard"),
        (True, "clean"),
        (True, "copiers"),
    ],
    ids=[
        "partition-hard-bounce",
        "partition-clean-bounce",
        "partition-copier-bounce",
        "group-hard-bounce",
        "group-clean-bounce",
        "group-copier-bounce",
    ],
)
def test_exactly_once_copy_under_bounces(tmp_path: Path, group_mode: bool, bounce: str) -> None:
    rng = random.Random(f"{group_mode}{bounce}")
    with LocalCluster(brokers=3, data_dir=tmp_path, config=CONFIG, failure_timeout_ms=1000) as cluster:
        sent = seed(cluster.bootstrap_servers)
        watcher = Watcher(cluster.bootstrap_servers)
        watcher.start()
        # no HW or LSO of the output a client was told goes back across the bounces (issue 19)
        monitor = OffsetMonitor(
            cluster.bootstrap_servers, [TopicPartition("output", p) for p in range(3)], interval=0.25
        ).start()
        copiers = Copiers(cluster, tmp_path, group_mode)
        for i in range(2):
            copiers.start(i)
        for _ in range(BOUNCES):
            time.sleep(rng.uniform(1.0, 3.0))
            if not copiers.running():
                break
            if bounce == "copiers":
                victim = rng.randrange(2)
                copiers.kill(victim)
                copiers.start(victim)  # a new instance with the same transactional id fences the old one
                continue
            broker = rng.randrange(3)
            if bounce == "hard":
                cluster.kill(broker)
            else:
                cluster.stop(broker)
            time.sleep(rng.uniform(0.5, 2.0))
            cluster.restart(broker)
            cluster.wait_until_healthy(timeout=60)
        codes = copiers.wait(COPY_LIMIT_S)
        monitor.stop()
        monitor.check()
        assert all(code == 0 for code in codes.values()), f"copiers ended with {codes}\n{copiers.log_tail()}"

        records = read_topic(cluster.bootstrap_servers, "output", limit_s=120)
        time.sleep(1.0)
        watcher.stop_event.set()
        watcher.join(30)
        assert watcher.error is None, watcher.error

    copied = Counter(r[3] for r in records)
    assert [v for v, n in copied.items() if n > 1] == [], "duplicates in the output"
    assert set(copied) == set(sent), f"lost {len(set(sent) - set(copied))}, unexpected {len(set(copied) - set(sent))}"
    assert [v for v, n in watcher.seen.items() if n > 1] == [], "the live reader saw duplicates or aborted records"
    assert set(watcher.seen) <= set(sent)
    # per output partition, each input partition's messages appear in input order
    order: dict[tuple[int, int], list[int]] = defaultdict(list)
    for partition, _offset, _key, value in sorted(records, key=lambda r: (r[0], r[1])):
        assert value is not None
        src, seq = value.decode().split(":")
        order[(partition, int(src))].append(int(seq))
    for key, seqs in order.items():
        assert seqs == sorted(seqs), f"out of order in output partition {key[0]} for input partition {key[1]}"
