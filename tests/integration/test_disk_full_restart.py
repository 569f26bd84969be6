"""A broker whose disk filled restarts once a little space is freed (issue 30, item 4).

One real broker on a 64 MiB tmpfs of its own (mounted by the test as root, as CI runs), 8 MiB of it
taken by a ballast file. Produce traffic fills the rest until the broker takes its log directory
offline; it is killed (-9), the ballast deleted, and it is started again. Before the fix the start
failed: every record since the last memtable flush lives only in RocksDB's write-ahead log, which
the 64 MB write buffers let grow to the whole volume (56 MiB here), and opening the database flushes
that into a table before it deletes the log, so the start needed another 56 MiB
("No space left on device: While appending to file: .../000008.sst") where Kafka restarts at once.
Now the broker keeps its unflushed data to a sixteenth of the volume (storage.py, MemtableBudget),
so 8 MiB is room enough: it opens, turns ready, every acknowledged record is there and it takes
new writes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sluice import errors
from sluice.client import Admin, Producer
from sluice.testing import LocalCluster
from tests.support.waiting import wait_for

from .helpers import read_topic, tmpfs, values

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs for the broker's data volume: needs root")

VOLUME = "64m"
BALLAST = 8 << 20
VALUE_BYTES = 60_000  # random: RocksDB cannot compress it, so the bytes on disk are the bytes sent
MAX_VALUES = 3_000  # 180 MB: far more than the volume holds, a bound on the fill loop


def value(i: int) -> bytes:
    return b"%06d-" % i + os.urandom(VALUE_BYTES)


def test_a_broker_whose_disk_filled_restarts_after_8_of_64_mib_are_freed(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "broker-0", VOLUME) as volume:
        ballast = volume / "ballast"
        ballast.write_bytes(b"\1" * BALLAST)  # written, not sparse: it takes its 8 MiB
        with LocalCluster(brokers=1, data_dir=tmp_path) as cluster:
            bootstrap = cluster.bootstrap_servers
            admin = Admin(bootstrap_servers=bootstrap)
            admin.create_topic("fill", partitions=1, replication_factor=1)
            producer = Producer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, delivery_timeout_ms=10_000)
            acked: list[bytes] = []
            deadline = time.monotonic() + 240
            i = 0
            # fill the volume, 20 records at a time, until the broker takes its log directory offline
            while cluster.broker(0).health() != "NOT_SERVING":
                assert i < MAX_VALUES and time.monotonic() < deadline, f"the disk never filled: {len(acked)} acked"
                sent = [(b"%06d-" % n, producer.send("fill", value=value(n), partition=0)) for n in range(i, i + 20)]
                i += len(sent)
                for prefix, future in sent:
                    try:
                        future.result(timeout=60)
                        acked.append(prefix)
                    except errors.SluiceError:
                        pass  # the disk filled under it: retried until delivery_timeout_ms, then given up
            producer.close(timeout=30)
            assert "No space left on device" in cluster.broker(0).log_path.read_text()
            assert len(acked) * VALUE_BYTES > 40 << 20, f"only {len(acked)} records fit on the volume"

            cluster.kill(0)
            ballast.unlink()  # 8 of the 64 MiB free again
            cluster.broker(0).start()
            started = wait_for(
                lambda: (not cluster.broker(0).is_alive()) or cluster.broker(0).health() == "SERVING",
                timeout=120,
                what="the broker to open its log directory and turn ready (or exit)",
            )
            assert started and cluster.broker(0).is_alive(), cluster.broker(0).log_tail(5)

            got = {v[:7] for v in values(read_topic(bootstrap, "fill", limit_s=120)) if v is not None}
            lost = set(acked) - got
            assert not lost, f"{len(lost)} of {len(acked)} acknowledged records lost"
            with Producer(bootstrap_servers=bootstrap, acks="all", delivery_timeout_ms=30_000) as after:
                after.send("fill", value=b"after the restart", partition=0).result(timeout=60)
            admin.close()
            print(f"\n{len(acked)} records ({len(acked) * VALUE_BYTES >> 20} MiB) acknowledged, all read back")
