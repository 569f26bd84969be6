"""How long a partition move takes, unthrottled and at leader.replication.throttled.rate (issue 27).

A first, small measurement: two brokers, a one-replica partition filled with 16 KiB records,
reassigned to the other broker; the time from AlterPartitionReassignments until the move is no
longer listed. ``python bench/reassign_move.py``; results in docs/performance.md.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from sluice.client import Admin, Producer
from sluice.testing import LocalCluster


def run(rate: int, mib: int) -> float:
    with tempfile.TemporaryDirectory() as d:
        cfg = {"min.insync.replicas": "1"}
        if rate > 0:
            cfg["leader.replication.throttled.rate"] = str(rate)
        with LocalCluster(brokers=2, data_dir=Path(d), config=cfg) as c:
            a = Admin(bootstrap_servers=c.bootstrap_servers)
            a.create_topic("m", partitions=1, replication_factor=1)
            owner = a.describe_topic("m").partitions[0].replicas[0]
            p = Producer(bootstrap_servers=c.bootstrap_servers, acks="all", linger_ms=5)
            fs = [p.send("m", value=b"v" * 16384) for _ in range(mib * 64)]
            for f in fs:
                f.result(timeout=120)
            p.close()
            t = time.monotonic()
            a.alter_partition_reassignments({("m", 0): [1 - owner]})
            while a.list_partition_reassignments():
                time.sleep(0.1)
                if time.monotonic() - t > 300:
                    raise SystemExit("too slow")
            took = time.monotonic() - t
            a.close()
            return took


def main() -> None:
    for rate, mib in [(-1, 64), (4 * 1024 * 1024, 32)]:
        took = run(rate, mib)
        print(f"rate={rate} moved {mib} MiB in {took:.1f} s = {mib / took:.2f} MiB/s", flush=True)


if __name__ == "__main__":
    main()
