#!/usr/bin/env python3
"""One replicated benchmark on a fresh 3-broker cluster (RF3), with the brokers' CPU and replication rounds.

    python bench/replication_rounds.py produce-1k    # 100,000 records of 1 KiB, acks=all
    python bench/replication_rounds.py produce-100   # 300,000 records of 100 B
    python bench/replication_rounds.py latency       # 1 KiB at a steady 5 MB/s for 12 s: p50/p99
    python bench/replication_rounds.py txn-10ms      # 30,000 records of 1 KiB, a commit every 10 ms

Prints one JSON line: the benchmark's figure (MB/s, records/s, latency), the CPU seconds the three
broker processes spent during the timed part (from /proc, ``bench.sysstat``) and the ReplicaFetch
rounds they answered meanwhile (unary calls and requests on ReplicaFetchStream, from their metrics
endpoints), so a change to the replication path can be judged by CPU per round as well as by
throughput. Each run starts its own cluster (``sluice.testing.LocalCluster``, RF3,
min.insync.replicas 2) and an unrecorded warm-up produce; compare two builds by alternating runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":
    sys.path[0] = str(ROOT)  # see compare_kafka.py: import the harness as bench.*

from bench import sysstat  # noqa: E402
from sluice.cli.engines import bench as engine  # noqa: E402
from sluice.testing import LocalCluster, scrape  # noqa: E402

BROKERS = 3


def rounds(cluster: LocalCluster) -> float:
    """ReplicaFetch requests the brokers answered so far (each request on a stream counts as one)."""
    return sum(
        scrape(cluster.metrics_url(i)).total("kafka_network_requestmetrics_requests_total", request="ReplicaFetch")
        for i in range(BROKERS)
    )


def run(kind: str) -> dict[str, object]:
    with (
        tempfile.TemporaryDirectory(prefix="replication-rounds-") as tmp,
        LocalCluster(brokers=BROKERS, data_dir=tmp) as c,
    ):
        boot = c.bootstrap_servers
        pids = [b.pid for b in c.brokers if b.pid]
        engine.produce(boot, name="warm-up", record_size=1024, count=5000, max_seconds=60.0, progress=False)
        before, rounds_before = sysstat.sample({"brokers": pids}), rounds(c)
        if kind == "produce-1k":
            r = engine.produce(boot, name=kind, record_size=1024, count=100_000, progress=False)
        elif kind == "produce-100":
            r = engine.produce(boot, name=kind, record_size=100, count=300_000, progress=False)
        elif kind == "txn-10ms":
            r = engine.produce(boot, name=kind, record_size=1024, count=30_000, commit_interval_ms=10, progress=False)
        else:
            r = engine.latency(boot, name=kind, record_size=1024, rate_mb_s=5.0, seconds=12.0, progress=False)
        after, rounds_after = sysstat.sample({"brokers": pids}), rounds(c)
    cpu = after.cpu_s["brokers"] - before.cpu_s["brokers"]
    n = rounds_after - rounds_before
    return {
        "kind": kind,
        "mb_s": r.mb_per_s,
        "records_s": r.records_per_s,
        "latency_ms": r.latency_ms,
        "errors": r.errors,
        "broker_cpu_s": cpu,
        "broker_cpu_s_per_gb": cpu / (r.bytes / 1e9) if r.bytes else None,
        "rounds": n,
        "broker_cpu_ms_per_round": cpu * 1000 / n if n else None,
        "load_1m": after.load_1m,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=["produce-1k", "produce-100", "latency", "txn-10ms"])
    args = parser.parse_args(argv)
    print(json.dumps(run(args.kind)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
