"""``sluice demo``: an exactly-once copy of a topic through transactions, verified.

The engine, :mod:`sluice.cli.engines.demo`, starts a fresh local cluster, copies a topic with
Kafka's consume-transform-produce loop while it breaks things (aborted transactions, a broker
killed with SIGKILL, the copier crashing mid-transaction) and checks the output; this module
maps options to its parameters. The exit status is 0 only if the copy is exactly once.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from sluice.cli.argtypes import non_negative_int, positive_float, positive_int
from sluice.cli.exits import USAGE, CliError

if TYPE_CHECKING:
    from sluice.cli.parser import Subcommands


def register(sub: Subcommands) -> None:
    demo = sub.add_parser("demo", help="exactly-once copy of a topic through transactions, verified")
    demo.add_argument("--records", type=positive_int, default=2000, help="input records (default 2000)")
    demo.add_argument("--partitions", type=positive_int, default=3, help="partitions per topic (default 3)")
    demo.add_argument("--txn-size", type=positive_int, default=100, help="records per transaction at most")
    demo.add_argument(
        "--abort-every",
        type=non_negative_int,
        default=4,
        help="abort every Nth transaction on purpose and redo it (default 4; 0: never; not 1)",
    )
    demo.add_argument("--brokers", type=positive_int, default=3, help="brokers of the local cluster (default 3)")
    demo.add_argument(
        "--no-chaos",
        action="store_true",
        help="do not kill and restart a broker and the copier while copying",
    )
    demo.add_argument("--data", metavar="DIR", help="keep the cluster's data and logs here (default: temporary)")
    demo.add_argument(
        "--timeout", type=positive_float, default=600.0, help="give up after this many seconds (default 600)"
    )
    demo.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    demo.add_argument(
        "--secure",
        action="store_true",
        help="mutual TLS clients and the authorizer; the copier runs as User:demo-copier with its ACLs only",
    )


def run(args: argparse.Namespace) -> int:
    if args.abort_every == 1:
        raise CliError("--abort-every 1 would abort every transaction, including the redo: use 0 or >= 2", USAGE)
    from sluice.cli.engines.demo import run_demo

    report = run_demo(
        records=args.records,
        partitions=args.partitions,
        txn_size=args.txn_size,
        abort_every=args.abort_every,
        brokers=args.brokers,
        chaos=not args.no_chaos,
        data_dir=args.data,
        timeout=args.timeout,
        progress=not args.no_progress,
        out=sys.stdout,
        secure=args.secure,
    )
    return 0 if report.exactly_once else 1
