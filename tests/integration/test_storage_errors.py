"""A full disk is a retriable storage error, not a broken broker (issue 13, section 2).

Three real brokers, replication factor 3, min.insync.replicas 2; broker 2's data directory is a
small tmpfs of its own (mounted by the test: it runs as root, as CI does). While an idempotent
acks=all producer writes, the test fills that filesystem with a file of its own, the way any
other writer on a shared volume would. Then, each bounded in time:

- broker 2 warns that its volume is low on space (the controller logs it);
- broker 2 answers every request KAFKA_STORAGE_ERROR (retriable), its readiness turns
  NOT_SERVING (liveness stays SERVING: restarting it would not free space), its metrics say
  ``sluice_log_dir_offline 1``, and the controller fences it: leadership of every partition
  moves to a broker that can write and it leaves every ISR, so acks=all goes on with two;
- a topic deleted meanwhile is deleted without an error (its data on broker 2 goes when the
  broker restarts, as a stray partition);
- a clean stop exits 0; started on the still-full disk it exits 1 saying to free space; started
  again once the space is freed, broker 2 catches up and rejoins every ISR;
- no acknowledged record is lost and none is stored twice.
"""

from __future__ import annotations

import errno
import threading
from pathlib import Path

from sluice import errors
from sluice.api.v1 import records_pb2 as pb
from sluice.client import Admin, Producer
from sluice.testing import LocalCluster, scrape
from tests.support.waiting import wait_for

from .helpers import read_topic, tmpfs, values
from .wire import Wire, batch_of

CONFIG = {"min.insync.replicas": "2", "replica.lag.time.max.ms": "3000"}
FULL = 2  # the broker whose disk fills
TMPFS_SIZE = "48m"  # under RocksDB's 70 MB WAL preallocation, so every append needs new pages
PARTITIONS = 3


def fill(path: Path) -> int:
    """Write ``path`` until the filesystem is full (ENOSPC); returns the bytes written."""
    written = 0
    with open(path, "wb", buffering=0) as f:
        for chunk in (1 << 20, 4096, 512):
            block = b"\0" * chunk
            for _ in range(100_000):
                try:
                    written += f.write(block) or 0
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
                    break
    return written


class AckedWriter(threading.Thread):
    """An idempotent acks=all producer that remembers every value acknowledged to it."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.producer = Producer(bootstrap_servers=bootstrap, acks="all", linger_ms=2, enable_idempotence=True)
        self.topic = topic
        self.acked: list[bytes] = []
        self.failed: list[tuple[bytes, str]] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        for i in range(200_000):
            if self.stop_event.is_set():
                break
            value = b"v%07d-" % i + b"x" * 500
            try:
                self.producer.send(self.topic, value=value, partition=i % PARTITIONS).result(timeout=120)
                self.acked.append(value)
            except errors.SluiceError as exc:
                self.failed.append((value, repr(exc)))

    def stop(self) -> None:
        self.stop_event.set()
        self.join(180)
        self.producer.close()


def test_a_full_disk_moves_leadership_away_and_the_broker_comes_back_when_space_returns(tmp_path: Path) -> None:
    with tmpfs(tmp_path / f"broker-{FULL}", TMPFS_SIZE) as volume:
        cluster = LocalCluster(brokers=3, data_dir=tmp_path, config=CONFIG, failure_timeout_ms=2000)
        with cluster:
            bootstrap = cluster.bootstrap_servers
            admin = Admin(bootstrap_servers=bootstrap)
            admin.create_topic("full", partitions=PARTITIONS, replication_factor=3)
            admin.create_topic("doomed", partitions=1, replication_factor=3)
            led = [p for p in range(PARTITIONS) if cluster.leader("full", p) == FULL]
            assert led, "broker 2 should lead a partition of the topic (placement spreads leaders)"
            writer = AckedWriter(bootstrap, "full")
            writer.start()
            try:
                wait_for(lambda: len(writer.acked) > 300, timeout=60, what="writes before the disk fills")
                filler = volume / "filler"
                fill(filler)

                # broker 2 notices at its next write and goes offline, alive but not ready
                wait_for(lambda: cluster.broker(FULL).health() == "NOT_SERVING", timeout=30, what="NOT_SERVING")
                wire = Wire(cluster.address(FULL))
                refused = wire.produce("full", led[0], batch_of([b"refused"]), acks=-1)
                wire.close()
                assert refused.error_code == pb.KAFKA_STORAGE_ERROR, refused
                assert errors.error_for(refused.error_code, refused.error_message).retriable
                assert scrape(cluster.metrics_url(FULL)).value("sluice_log_dir_offline") == 1

                # the controller fences it: no leadership, in no ISR
                def moved() -> bool:
                    states = [cluster.partition_state("full", p) for p in range(PARTITIONS)]
                    return all(s["leader"] not in (FULL, -1) and FULL not in s["isr"] for s in states)

                wait_for(moved, timeout=30, what="leadership and ISR membership off broker 2")
                assert "broker 2's log directory is offline" in cluster.controller.log_path.read_text()
                # the low-space warning (log.dir.free.space.warn.percent, 5 by default) reached the controller
                wait_for(
                    lambda: "broker 2's data volume is low on space" in cluster.controller.log_path.read_text(),
                    timeout=30,
                    what="the low-space warning",
                )
                count = len(writer.acked)
                wait_for(lambda: len(writer.acked) > count + 200, timeout=60, what="writes without broker 2")

                admin.delete_topic("doomed")  # its data on the full disk cannot go now, and that is no error
                assert cluster.topic_document("doomed") is None

                assert cluster.stop(FULL, timeout=60) == 0, cluster.broker(FULL).log_tail()
                # started again while the disk is still full, it says what to do and exits 1
                cluster.broker(FULL).start()
                wait_for(
                    lambda: not cluster.broker(FULL).is_alive(), timeout=60, what="the start on a full disk to fail"
                )
                assert cluster.broker(FULL).returncode == 1
                assert "free space on the data volume and start again" in cluster.broker(FULL).log_tail()
                filler.unlink()
                cluster.restart(FULL, timeout=90)
                wait_for(
                    lambda: all(FULL in cluster.partition_state("full", p)["isr"] for p in range(PARTITIONS)),
                    timeout=90,
                    what="broker 2 back in every ISR",
                )
                count = len(writer.acked)
                wait_for(lambda: len(writer.acked) > count + 100, timeout=60, what="writes after the return")
                controller_log = cluster.controller.log_path.read_text()
                assert "broker 2's log directory is back online" in controller_log
                assert "broker 2's data volume has space again" in controller_log
            finally:
                writer.stop()
            log = cluster.broker(FULL).log_path.read_text()
            assert "No space left on device" in log
            assert "deleted stray partition doomed-0" in log
            got = values(read_topic(bootstrap, "full", limit_s=120))
            assert len(got) == len(set(got)), "a record was stored twice"
            lost = set(writer.acked) - set(got)
            assert not lost, f"{len(lost)} acknowledged records lost"
            print(
                f"\nfull disk: {len(writer.acked)} acknowledged, {len(writer.failed)} failed after retries, "
                f"{len(got)} read back, 0 lost, 0 duplicated"
            )
            admin.close()
