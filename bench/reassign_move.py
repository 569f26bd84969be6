"""How long a partition move takes, unthrottled and at a replication throttle (issue 27).

Two brokers; a topic of ``--partitions`` one-replica partitions holding ``--mib`` MiB in all (16 KiB
records), every partition on one broker; then all of them are reassigned to the other broker at
once. Timed: from AlterPartitionReassignments until no move is listed any more (the controller's
completion included). One run per ``--rates`` value (bytes/s of ``leader.replication.throttled.rate``
on both brokers; 0: unthrottled). ``--beside-producer`` keeps an acks=all producer writing to another
topic on the same brokers during the move, and reports what it got through.

    python bench/reassign_move.py                                    # 1 GiB over 4 partitions: none, 32 and 16 MiB/s
    python bench/reassign_move.py --mib 64 --partitions 1 --rates 0 4194304   # a quick one

Results: ``bench/results/reassign-move.{json,md}`` (this run's rows; docs/performance.md quotes them).
Progress is printed as the data is written and while the move runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":
    sys.path[0] = str(ROOT)

from sluice.client import Admin, Producer  # noqa: E402
from sluice.testing import LocalCluster  # noqa: E402

RESULTS = ROOT / "bench" / "results"
RECORD = 16 * 1024
MIB = 1024 * 1024


def fill(cluster: LocalCluster, topic: str, mib: int) -> None:
    producer = Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all", linger_ms=5)
    try:
        records = mib * MIB // RECORD
        pending = []
        for i in range(records):
            pending.append(producer.send(topic, value=b"v" * RECORD))
            if len(pending) >= 2048:
                for f in pending:
                    f.result(timeout=300)
                pending.clear()
                print(f"  written {(i + 1) * RECORD // MIB} of {mib} MiB", flush=True)
        for f in pending:
            f.result(timeout=300)
    finally:
        producer.close()


class SideProducer:
    """An acks=all producer on another topic while the move runs: what it got through, and its worst wait."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.acked = 0
        self.worst_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        producer = Producer(bootstrap_servers=self.cluster.bootstrap_servers, acks="all", linger_ms=5)
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                futures = [producer.send("side", value=b"s" * 1024) for _ in range(256)]
                for f in futures:
                    f.result(timeout=120)
                self.acked += len(futures)
                self.worst_s = max(self.worst_s, time.monotonic() - started)
        finally:
            producer.close()

    def __enter__(self) -> SideProducer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=150)


def run(rate: int, mib: int, partitions: int, beside_producer: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        cfg = {"min.insync.replicas": "1"}
        if rate > 0:
            cfg["leader.replication.throttled.rate"] = str(rate)
            cfg["follower.replication.throttled.rate"] = str(rate)
        with LocalCluster(brokers=2, data_dir=Path(d), config=cfg) as c:
            admin = Admin(bootstrap_servers=c.bootstrap_servers)
            try:
                admin.create_topic("m", partitions=partitions, replication_factor=1)
                admin.create_topic("side", partitions=1, replication_factor=2)
                layout = admin.describe_topic("m").partitions
                source = layout[0].replicas[0]
                # every partition on one broker first, so the move is from it to the other
                admin.alter_partition_reassignments(
                    {("m", p.partition): [source] for p in layout if p.replicas != [source]}
                )
                for _ in range(600):
                    if not admin.list_partition_reassignments():
                        break
                    time.sleep(0.1)
                print(f"rate {rate or 'none'}: writing {mib} MiB over {partitions} partition(s)", flush=True)
                fill(c, "m", mib)
                side = SideProducer(c) if beside_producer else None
                with side if side is not None else _Nothing():
                    started = time.monotonic()
                    admin.alter_partition_reassignments({("m", p.partition): [1 - source] for p in layout})
                    last_print = started
                    while admin.list_partition_reassignments():
                        time.sleep(0.2)
                        now = time.monotonic()
                        if now - last_print >= 10:
                            print(f"  moving: {now - started:.0f} s", flush=True)
                            last_print = now
                        if now - started > 3600:
                            raise SystemExit("the move took over an hour")
                    took = time.monotonic() - started
            finally:
                admin.close()
    row: dict[str, Any] = {
        "rate_bytes_per_s": rate,
        "mib": mib,
        "partitions": partitions,
        "seconds": round(took, 1),
        "mib_per_s": round(mib / took, 2),
    }
    if rate > 0:
        row["bound_s"] = round(max(0.0, mib * MIB - rate) / rate, 1)  # one second's burst, then the rate
    if side is not None:
        row["side_producer_kib_per_s"] = round(side.acked / took, 1)
        row["side_producer_worst_batch_s"] = round(side.worst_s, 2)
    print(f"  -> {json.dumps(row)}", flush=True)
    return row


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *_: object) -> None:
        return None


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    load = os.getloadavg()[0]
    lines = [
        "# Partition moves: measured (bench/reassign_move.py)",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, load average {load:.1f} "
        f"at the end; two brokers, 16 KiB records, every partition moved from one broker to the other at once"
        + ("; an acks=all producer (1 KiB records, RF 2) ran beside the move" if args.beside_producer else "")
        + ".",
        "",
        "| throttle | moved | partitions | time | rate | bound at the throttle | side producer |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        rate = "none" if r["rate_bytes_per_s"] <= 0 else f"{r['rate_bytes_per_s'] / MIB:g} MiB/s"
        bound = f"{r['bound_s']} s" if "bound_s" in r else ""
        side = (
            f"{r['side_producer_kib_per_s']} KiB/s, worst batch {r['side_producer_worst_batch_s']} s"
            if "side_producer_kib_per_s" in r
            else ""
        )
        cells = [rate, f"{r['mib']} MiB", str(r["partitions"]), f"{r['seconds']} s", f"{r['mib_per_s']} MiB/s"]
        lines.append("| " + " | ".join([*cells, bound, side]) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=1024, help="MiB to move in all (default 1024)")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument(
        "--rates", type=int, nargs="+", default=[0, 32 * MIB, 16 * MIB], help="bytes/s per run (0: unthrottled)"
    )
    ap.add_argument("--beside-producer", action="store_true", help="an acks=all producer writes during the move")
    ap.add_argument("--stem", default="reassign-move", help="results file names in bench/results/")
    args = ap.parse_args()
    rows = [run(rate, args.mib, args.partitions, args.beside_producer) for rate in args.rates]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.stem}.json").write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    (RESULTS / f"{args.stem}.md").write_text(report(rows, args))
    print(f"results: {RESULTS / args.stem}.json, .md", flush=True)


if __name__ == "__main__":
    main()
