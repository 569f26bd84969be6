"""``sluice bench produce|transactions|consume|latency``: kafka-producer-perf-test.sh and friends.

One benchmark per run, on the cluster given by ``--bootstrap-server`` or on a fresh local
cluster of ``--brokers`` brokers in a temporary directory. The engine (what is timed, result
files) is :mod:`sluice.cli.engines.bench`, shared with ``bench/run_all.py``; this module maps
options to its parameters, prints the summary line and appends the result to ``--output``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from sluice.cli.argtypes import ISOLATION_LEVELS, acks, compression, non_negative_int, positive_float, positive_int
from sluice.cli.bootstrap import require_cluster
from sluice.cli.exits import USAGE, CliError
from sluice.cli.output import err
from sluice.cli.security import resolve_security

if TYPE_CHECKING:
    from sluice.cli.engines.bench import BenchResult
    from sluice.cli.engines.target import Target
    from sluice.cli.parser import Subcommands


def register(sub: Subcommands) -> None:
    bench = sub.add_parser("bench", help="measure throughput and latency")
    b_sub = bench.add_subparsers(dest="bench_command", metavar="KIND", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--bootstrap-server",
        metavar="HOST:PORT[,...]",
        help="cluster to measure (default: a fresh local cluster of --brokers brokers in a temporary directory)",
    )
    common.add_argument(
        "--brokers",
        type=positive_int,
        default=1,
        help="brokers of the fresh local cluster (default 1; 3 measures replication factor 3, min.insync.replicas 2)",
    )
    common.add_argument("--record-size", type=positive_int, default=1024, help="bytes per record (default 1024)")
    common.add_argument("--count", type=positive_int, default=100_000, help="records (default 100000)")
    common.add_argument("--partitions", type=positive_int, default=3, help="partitions of the bench topic")
    common.add_argument("--max-seconds", type=positive_float, default=120.0, help="stop after this long")
    common.add_argument(
        "--output",
        default=None,
        metavar="FILE",
        help="JSON file the result is appended to (default bench/results/results.json)",
    )
    common.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    common.add_argument(
        "--secure",
        action="store_true",
        help="run the fresh local cluster with mutual TLS clients and the authorizer (measures the cost of TLS)",
    )
    common.add_argument(
        "--command-config",
        metavar="FILE",
        help="client security settings for --bootstrap-server (security.protocol=SSL, ssl.ca.location ...)",
    )
    producing = argparse.ArgumentParser(add_help=False)
    producing.add_argument("--acks", type=acks, default="all", help="all (default), 1 or 0")
    producing.add_argument("--compression", type=compression, default=None, help="none, gzip, snappy, lz4 or zstd")
    producing.add_argument("--linger-ms", type=non_negative_int, default=5, help="producer linger (default 5)")
    producing.add_argument(
        "--batch-size", type=positive_int, default=262144, help="producer batch size in bytes (default 256 KiB)"
    )
    b_prod = b_sub.add_parser("produce", parents=[common, producing], help="producer throughput")
    b_prod.add_argument("--no-idempotence", action="store_true", help="a plain producer (no producer id)")
    b_txn = b_sub.add_parser("transactions", parents=[common, producing], help="transactional producer throughput")
    b_txn.add_argument("--commit-interval-ms", type=positive_int, default=100, help="default 100")
    b_cons = b_sub.add_parser("consume", parents=[common], help="consumer throughput (fills the topic first)")
    b_cons.add_argument(
        "--isolation-level", choices=ISOLATION_LEVELS, default="read_committed", help="default read_committed"
    )
    b_cons.add_argument("--plain-data", action="store_true", help="fill without transactions")
    b_lat = b_sub.add_parser("latency", parents=[common, producing], help="produce latency at a steady rate")
    b_lat.add_argument("--rate-mb-s", type=positive_float, default=10.0, help="MB/s to send (default 10)")
    b_lat.add_argument("--seconds", type=positive_float, default=30.0, help="measured duration (default 30)")


def run(args: argparse.Namespace) -> int:
    from sluice.cli.engines import bench

    output = Path(args.output) if args.output else bench.DEFAULT_RESULTS
    security = resolve_security(args.command_config, None)
    if args.bootstrap_server:
        if args.secure:
            raise CliError("--secure starts a fresh secure cluster; for --bootstrap-server use --command-config", USAGE)
        require_cluster(args.bootstrap_server, "--bootstrap-server", security)
    else:
        if args.command_config:
            raise CliError("--command-config is for --bootstrap-server; a fresh cluster takes --secure", USAGE)
        secure = " secure (mutual TLS, authorizer on)" if args.secure else ""
        err(f"starting a fresh{secure} local cluster of {args.brokers} broker(s) for the benchmark ...")
    with bench.bench_cluster(
        args.bootstrap_server, brokers=args.brokers, secure=args.secure, security=security.kwargs()
    ) as target:
        result = _measure(target, args)
    result.params["secure"] = args.secure or security.tls
    path = bench.append_result(output, result)
    print(result.summary())
    err(f"result appended to {path}")
    return 1 if result.error else 0


def _measure(bootstrap: Target, args: argparse.Namespace) -> BenchResult:
    from sluice.cli.engines import bench

    progress = not args.no_progress
    kind = args.bench_command
    if kind in ("produce", "transactions"):
        return bench.produce(
            bootstrap,
            name=f"{kind}-{args.record_size}B",
            record_size=args.record_size,
            count=args.count,
            max_seconds=args.max_seconds,
            acks=args.acks,
            idempotent=not getattr(args, "no_idempotence", False),
            compression=args.compression,
            linger_ms=args.linger_ms,
            batch_size=args.batch_size,
            partitions=args.partitions,
            commit_interval_ms=args.commit_interval_ms if kind == "transactions" else None,
            progress=progress,
        )
    if kind == "consume":
        return bench.consume(
            bootstrap,
            name=f"consume-{args.isolation_level}-{args.record_size}B",
            record_size=args.record_size,
            count=args.count,
            isolation_level=args.isolation_level,
            transactional_data=not args.plain_data,
            partitions=args.partitions,
            max_seconds=args.max_seconds,
            progress=progress,
        )
    return bench.latency(
        bootstrap,
        name=f"latency-{args.rate_mb_s:g}MBps-{args.record_size}B",
        record_size=args.record_size,
        rate_mb_s=args.rate_mb_s,
        seconds=args.seconds,
        acks=args.acks,
        linger_ms=args.linger_ms,
        partitions=args.partitions,
        progress=progress,
    )
