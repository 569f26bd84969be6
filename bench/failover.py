#!/usr/bin/env python3
"""Failover time on a three-broker local cluster: kill -9 of a partition leader until the
next acknowledged write and the next committed transaction.

    python bench/failover.py                       # default failure detector (5 s) and 1 s, 3 runs each
    python bench/failover.py --timeouts 1000 --runs 5
    python bench/failover.py --stop clean         # SIGTERM: the broker's controlled shutdown

One partition, replication factor 3, min.insync.replicas 2. An idempotent producer sends
acks=all records one at a time and a transactional producer commits small transactions in a
loop, both timestamping every success. The leader is killed at t0; the figures are the first
successes after t0, and the longest time without a success in the 10 s after t0 (the
interruption clients saw; all figures are medians over the runs). With ``--stop clean`` the
leader gets SIGTERM instead and hands its leadership over before it exits (controlled
shutdown), so the failure detector's timeout does not count. Results are appended to
bench/results/failover.json (a JSON list) and printed as a table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from sluice import errors
from sluice.client import Admin, Producer
from sluice.testing import LocalCluster

RESULTS = Path(__file__).resolve().parent / "results" / "failover.json"


def first_after(times: list[float], t0: float) -> float | None:
    later = [t for t in times if t > t0]
    return min(later) - t0 if later else None


def longest_gap(times: list[float], t0: float, window_s: float = 10.0) -> float | None:
    """The longest time without a success in [t0, t0 + window_s]: the interruption clients saw."""
    inside = [t0, *(t for t in sorted(times) if t0 < t <= t0 + window_s)]
    if len(inside) < 2:
        return None
    return max(b - a for a, b in itertools.pairwise(inside))


def one_run(timeout_ms: int, run: int, stop_mode: str = "hard") -> dict[str, float | None]:
    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalCluster(
            brokers=3,
            data_dir=Path(tmp),
            config={"min.insync.replicas": "2", "replica.lag.time.max.ms": "5000"},
            failure_timeout_ms=timeout_ms,
        ) as cluster,
    ):
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        admin.create_topic("failover", partitions=1, replication_factor=3)
        acks: list[float] = []
        commits: list[float] = []
        stop = threading.Event()

        def write() -> None:
            p = Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all", linger_ms=0)
            while not stop.is_set():
                try:
                    p.send("failover", value=b"w").result(timeout=60)
                    acks.append(time.monotonic())
                except errors.SluiceError:
                    pass
            p.close()

        def transact() -> None:
            p = Producer(bootstrap_servers=cluster.bootstrap_servers, transactional_id=f"fo-{run}", linger_ms=0)
            p.init_transactions()
            while not stop.is_set():
                try:
                    p.begin_transaction()
                    p.send("failover", value=b"t")
                    p.commit_transaction()
                    commits.append(time.monotonic())
                except errors.SluiceError:
                    try:
                        p.abort_transaction()
                    except errors.SluiceError:
                        break
            p.close()

        threads = [threading.Thread(target=write, daemon=True), threading.Thread(target=transact, daemon=True)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while (len(acks) < 50 or len(commits) < 10) and time.monotonic() < deadline:
            time.sleep(0.1)
        leader = admin.describe_topic("failover").partitions[0].leader
        t0 = time.monotonic()
        if stop_mode == "hard":
            cluster.kill(leader)
        else:  # stop() returns when the broker exited, after the handover: time it from the signal
            threading.Thread(target=cluster.stop, args=(leader,), daemon=True).start()
        deadline = t0 + 60
        while (first_after(acks, t0) is None or first_after(commits, t0) is None) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(max(0.0, t0 + 10 - time.monotonic()))  # the gaps are measured over 10 s
        stop.set()
        for t in threads:
            t.join(70)
        admin.close()
        return {
            "write_s": first_after(acks, t0),
            "commit_s": first_after(commits, t0),
            "write_gap_s": longest_gap(acks, t0),
            "commit_gap_s": longest_gap(commits, t0),
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeouts", type=int, nargs="+", default=[5000, 1000], help="failure detector ms")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--stop", choices=["hard", "clean"], default="hard", help="kill -9 (default) or SIGTERM the leader"
    )
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    rows = []
    for timeout_ms in args.timeouts:
        runs = []
        for run in range(args.runs):
            result = one_run(timeout_ms, run, args.stop)
            label = f"{args.stop} stop, detector {timeout_ms} ms, run {run + 1}/{args.runs}"
            print(f"{label}: {result}", file=sys.stderr, flush=True)
            runs.append(result)
        writes = [r["write_s"] for r in runs if r["write_s"] is not None]
        txns = [r["commit_s"] for r in runs if r["commit_s"] is not None]
        write_gaps = [r["write_gap_s"] for r in runs if r["write_gap_s"] is not None]
        commit_gaps = [r["commit_gap_s"] for r in runs if r["commit_gap_s"] is not None]
        rows.append(
            {
                "benchmark": "failover-rf3",
                "stop": args.stop,
                "failure_timeout_ms": timeout_ms,
                "runs": runs,
                "median_write_s": statistics.median(writes) if writes else None,
                "median_commit_s": statistics.median(txns) if txns else None,
                "median_write_gap_s": statistics.median(write_gaps) if write_gaps else None,
                "median_commit_gap_s": statistics.median(commit_gaps) if commit_gaps else None,
                "commit": commit,
                "date": time.strftime("%Y-%m-%d"),
            }
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    history = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    RESULTS.write_text(json.dumps(history + rows, indent=2) + "\n")
    print(
        "| stop | failure detector | next acked write | next committed transaction "
        "| longest gap in writes | longest gap in commits |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for row in rows:
        keys = ("median_write_s", "median_commit_s", "median_write_gap_s", "median_commit_gap_s")
        cells = [f"{row[k]:.2f} s" if isinstance(row[k], float) else "none" for k in keys]
        print(f"| {row['stop']} | {row['failure_timeout_ms']} ms | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
