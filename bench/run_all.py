#!/usr/bin/env python3
"""Run the standard benchmark set and record it.

    python bench/run_all.py                       # fresh single-broker local cluster, the set 3 times
    python bench/run_all.py --quick --repeat 1    # 10x fewer records, once: a smoke run (~1 min)
    python bench/run_all.py --bootstrap-server H:P
    python bench/run_all.py --brokers 3           # replication factor 3, min.insync.replicas 2

The set (bench/README.md explains each):

1. produce, 1 KiB records, idempotent, acks=all          -> MB/s
2. produce, 100 B records, idempotent, acks=all          -> records/s
3. 1 KiB records, transactional, commit every 100 ms     -> MB/s, next to (1) without transactions
4. consume read_committed, 1 KiB records (transactional data) -> MB/s
5. produce latency at a steady 10 MB/s, 1 KiB, acks=all  -> p50/p99 ms

The figures vary from run to run on a shared machine, so the set runs
--repeat times (3) on one cluster, after an unrecorded warm-up, and each
benchmark's median run is reported. Every run is appended to
bench/results/results.json (a JSON list, one entry per run of one
benchmark); the reported set is also written to
bench/results/latest.json, a markdown table to bench/results/latest.md, and,
if matplotlib is installed (pip install -e '.[bench]'), a chart to
bench/results/latest.png (latest-3brokers.* with --brokers 3). The engine is sluice.cli.engines.bench, the same code
`sluice bench` runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from sluice.cli.engines import bench
from sluice.cli.engines.target import Target

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def warm_up(bootstrap: Target, scale: float) -> None:
    """Not recorded: the first run on a fresh cluster also pays for the broker's start-up work
    (coordinators loading, first RocksDB flushes) and the client's first connections."""
    bench.produce(bootstrap, name="warm-up", record_size=1024, count=max(1000, int(50_000 * scale)),
                  max_seconds=30.0, progress=False)  # fmt: skip


def headline(r: bench.BenchResult) -> float:
    """The figure a run is judged by: p99 latency (lower is better, so negated), else MB/s."""
    return -r.latency_ms["p99"] if r.latency_ms else r.mb_per_s


def median_runs(runs: list[list[bench.BenchResult]]) -> list[bench.BenchResult]:
    """Per benchmark, the run with the median headline figure (of an odd number of runs, the middle one)."""
    out = []
    for same in zip(*runs, strict=True):
        ranked = sorted(same, key=headline)
        out.append(ranked[(len(ranked) - 1) // 2])
    return out


def run_set(bootstrap: Target, scale: float, progress: bool) -> list[bench.BenchResult]:
    def n(count: int) -> int:
        return max(1000, int(count * scale))

    produce_s = 120.0
    return [
        bench.produce(bootstrap, name="produce-1KiB-acks-all", record_size=1024, count=n(200_000),
                      max_seconds=produce_s, progress=progress),
        bench.produce(bootstrap, name="produce-100B-acks-all", record_size=100, count=n(500_000),
                      max_seconds=produce_s, progress=progress),
        bench.produce(bootstrap, name="transactions-1KiB-100ms", record_size=1024, count=n(200_000),
                      max_seconds=produce_s, commit_interval_ms=100, progress=progress),
        bench.consume(bootstrap, name="consume-read_committed-1KiB", record_size=1024, count=n(200_000),
                      isolation_level="read_committed", progress=progress),
        bench.latency(bootstrap, name="latency-10MBps-1KiB", record_size=1024, rate_mb_s=10.0,
                      seconds=max(5.0, 30.0 * scale), progress=progress),
    ]  # fmt: skip


def table(results: list[bench.BenchResult]) -> str:
    rows = [
        "| benchmark | records | MB/s | records/s | p50 ms | p99 ms | notes |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        lat = r.latency_ms or {}
        p50 = f"{lat['p50']:.1f}" if lat else ""
        p99 = f"{lat['p99']:.1f}" if lat else ""
        notes = "; ".join(x for x in (r.notes, r.error and f"FAILED: {r.error}") if x)
        rows.append(
            f"| {r.name} | {r.records:,} | {r.mb_per_s:.1f} | {r.records_per_s:,.0f} | {p50} | {p99} | {notes} |"
        )
    return "\n".join(rows)


def plot(results: list[bench.BenchResult], path: Path) -> bool:
    try:
        import matplotlib  # type: ignore[import-not-found]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found]
    except ImportError:
        return False
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    thr = [r for r in results if r.kind != "latency"]
    ax1.barh([r.name for r in thr], [r.mb_per_s for r in thr], color="#3b7dd8")
    ax1.set_xlabel("MB/s")
    ax1.set_title("Throughput (single broker, client on the same machine)")
    for r in results:
        if r.latency_ms:
            keys = ["p50", "p95", "p99", "max"]
            ax2.bar(keys, [r.latency_ms[k] for k in keys], color="#d8823b")
            ax2.set_ylabel("ms")
            ax2.set_title(f"Produce latency at {r.params.get('rate_mb_s')} MB/s, acks=all")
    env = results[0].environment if results else {}
    fig.suptitle(f"Sluice {env.get('sluice', '')} ({env.get('git_commit', '')}), {env.get('cpus')} CPUs")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap-server", help="measure this cluster (default: a fresh local one)")
    ap.add_argument(
        "--brokers",
        type=int,
        default=1,
        help="brokers of the fresh local cluster (3: replication factor 3, min.insync.replicas 2)",
    )
    ap.add_argument("--quick", action="store_true", help="10x fewer records (smoke run)")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--secure", action="store_true", help="mutual TLS clients and the authorizer (the cost of TLS)")
    ap.add_argument("--results", type=Path, default=RESULTS, help="output directory (default bench/results)")
    ap.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="run the set this many times and report each benchmark's median run (default 3; all runs are recorded)",
    )
    args = ap.parse_args(argv)
    scale = 0.1 if args.quick else 1.0
    args.results.mkdir(parents=True, exist_ok=True)
    runs: list[list[bench.BenchResult]] = []
    with bench.bench_cluster(args.bootstrap_server, brokers=args.brokers, secure=args.secure) as bootstrap:
        warm_up(bootstrap, scale)
        for i in range(max(1, args.repeat)):
            runs.append(run_set(bootstrap, scale, not args.no_progress))
            for r in runs[-1]:
                r.params["set"] = "quick" if args.quick else "standard"
                r.params["brokers"] = args.brokers
                r.params["secure"] = args.secure
                r.params["run"] = f"{i + 1}/{max(1, args.repeat)}"
                bench.append_result(args.results / "results.json", r)
                print(r.summary())
    results = median_runs(runs)
    stem = ("latest" if args.brokers == 1 else f"latest-{args.brokers}brokers") + ("-secure" if args.secure else "")
    (args.results / f"{stem}.json").write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    md = table(results)
    (args.results / f"{stem}.md").write_text(md + "\n")
    print()
    print(md)
    if plot(results, args.results / f"{stem}.png"):
        print(f"\nchart: {args.results / f'{stem}.png'}")
    else:
        print("\n(no chart: matplotlib is not installed; pip install -e '.[bench]')")
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
