"""kill -9 of the broker at random moments of a transactional workload, then restart on the same data.

Every acknowledged record is there exactly once, transactions whose commit was
acknowledged are complete, explicitly aborted ones are invisible, and a
transaction whose outcome the producer never learned is all-or-nothing. Group
offsets and producer state survive. Rounds and waits are bounded.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from collections import Counter
from pathlib import Path

from sluice import errors
from sluice.client import Admin, Consumer, Producer, TopicPartition
from sluice.testing import LocalCluster

from .helpers import read_topic

ROUNDS = int(os.environ.get("SLUICE_RESTART_ROUNDS", "4"))
TXN_SIZE = 20


class Workload:
    """A transactional producer that records what it knows about each transaction's outcome."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.committed: list[list[bytes]] = []
        self.aborted: list[list[bytes]] = []
        self.unknown: list[list[bytes]] = []
        self.stop = threading.Event()
        self.next_txn = 0

    def run_round(self, round_: int) -> None:
        try:
            producer = Producer(
                bootstrap_servers=self.bootstrap,
                transactional_id="restart-tx",
                linger_ms=1,
                delivery_timeout_ms=3000,
            )
            producer.init_transactions()
        except errors.SluiceError:
            return
        while not self.stop.is_set():
            txn = self.next_txn
            self.next_txn += 1
            values = [f"r{round_}-t{txn}-{i}".encode() for i in range(TXN_SIZE)]
            abort = txn % 4 == 3
            try:
                producer.begin_transaction()
                for i, v in enumerate(values):
                    producer.send(self.topic, value=v, partition=i % 2)
                if abort:
                    producer.abort_transaction()
                    self.aborted.append(values)
                else:
                    producer.commit_transaction()
                    self.committed.append(values)
            except errors.SluiceError:
                (self.aborted if abort else self.unknown).append(values)
                break
        with contextlib.suppress(Exception):  # the broker may be dead: closing is best effort
            producer.close()


def test_kill_and_restart_during_transactions(tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("SLUICE_SEED", "7")))
    with LocalCluster(
        brokers=1,
        data_dir=tmp_path,
        config={
            "transaction.max.timeout.ms": "60000",
            # compact the internal topics all the time: reloading must not depend on history
            "log.retention.check.interval.ms": "200",
        },
    ) as cluster:
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        admin.create_topic("work", partitions=2, replication_factor=1)
        admin.close()
        work = Workload(cluster.bootstrap_servers, "work")

        # committed group offsets and an idempotent producer's acknowledged records must survive too
        group_consumer = Consumer(bootstrap_servers=cluster.bootstrap_servers, group_id="restart-g")
        group_consumer.commit({TopicPartition("work", 0): 3})
        group_consumer.close()
        idem = Producer(bootstrap_servers=cluster.bootstrap_servers, linger_ms=1)
        idem_acked = [
            f.result(timeout=30) for f in [idem.send("work", value=b"idem-%d" % i, partition=0) for i in range(50)]
        ]
        idem.close()
        assert len(idem_acked) == 50

        for round_ in range(ROUNDS):
            work.stop.clear()
            thread = threading.Thread(target=work.run_round, args=(round_,), daemon=True)
            thread.start()
            time.sleep(rng.uniform(0.3, 1.5))
            cluster.kill(0)
            work.stop.set()
            thread.join(30)
            assert not thread.is_alive(), "the workload did not notice the dead broker within 30 s"
            cluster.restart(0)
            cluster.wait_until_healthy(timeout=60)

        # a last clean round: the new instance completes or aborts what the last kill left open
        work.stop.clear()
        thread = threading.Thread(target=work.run_round, args=(ROUNDS,), daemon=True)
        thread.start()
        time.sleep(1.0)
        work.stop.set()
        thread.join(30)

        records = read_topic(cluster.bootstrap_servers, "work", limit_s=120)
        seen = Counter(r[3] for r in records)
        duplicates = [v for v, n in seen.items() if n > 1]
        assert duplicates == []
        for i in range(50):
            assert seen[b"idem-%d" % i] == 1
        assert work.committed, "no transaction committed at all: the workload did not run"
        for values in work.committed:
            assert all(seen[v] == 1 for v in values), f"committed transaction lost records: {values[0]!r}"
        for values in work.aborted:
            assert not any(seen[v] for v in values), f"aborted transaction visible: {values[0]!r}"
        for values in work.unknown:
            present = [seen[v] for v in values]
            assert all(present) or not any(present), f"torn transaction: {values[0]!r}"

        check = Consumer(bootstrap_servers=cluster.bootstrap_servers, group_id="restart-g")
        assert check.committed([TopicPartition("work", 0)])[TopicPartition("work", 0)] == 3
        check.close()
