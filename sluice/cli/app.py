"""``main``: the ``sluice`` console script (and ``python -m sluice``, ``python -m sluice.cli``).

``sluice broker ...`` and ``sluice operator ...`` go straight to their own parsers, before
argparse sees the line (so ``sluice broker --help`` is the broker's help). Every other command
is parsed here and run by its group's module, through :func:`sluice.cli.exits.run`, which turns
its failures into exit codes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from sluice.cli import (
    acls,
    bench,
    configs,
    consume,
    consumer_groups,
    demo,
    dev,
    partitions,
    passthrough,
    produce,
    top,
    topics,
    transactions,
)
from sluice.cli.exits import run
from sluice.cli.parser import build_parser

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "dev": dev.run,
    "topics": topics.run,
    "partitions": partitions.run,
    "produce": produce.run,
    "consume": consume.run,
    "transactions": transactions.run,
    "consumer-groups": consumer_groups.run,
    "top": top.run,
    "acls": acls.run,
    "configs": configs.run,
    "bench": bench.run,
    "demo": demo.run,
}


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] == "broker":
        # Everything after `broker` belongs to the broker's own parser (and its --help).
        return passthrough.run_broker(args_list[1:])
    if args_list and args_list[0] == "operator":
        return passthrough.run_operator(args_list[1:])
    args = build_parser().parse_args(args_list)
    return run(COMMANDS[args.command], args)
