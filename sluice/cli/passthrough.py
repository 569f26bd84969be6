"""``sluice broker ...`` and ``sluice operator ...``: the rest of the line goes to their own parsers.

The image runs ``sluice broker`` and ``sluice operator`` (the Helm chart passes the sub-command
as the container's args), so both must start without loading the other: each main module is
imported only when its command runs. ``main`` hands them the line before argparse sees it, so
``sluice broker --help`` shows the broker's options; the sub-parsers registered here exist for
``sluice --help``'s list of commands.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sluice.cli.parser import Subcommands


def register(sub: Subcommands) -> None:
    # broker: the rest of the line goes to the broker's own parser (see sluice.cli.app.main).
    sub.add_parser(
        "broker",
        help="run a broker process (arguments: sluice broker --help)",
        add_help=False,
        prefix_chars="\0",  # never parse broker options here
    ).add_argument("broker_args", nargs=argparse.REMAINDER, help="the broker's own options (sluice broker --help)")

    # operator: the rest of the line goes to the operator's own parser.
    sub.add_parser(
        "operator",
        help="run the Kubernetes operator (arguments: sluice operator --help)",
        add_help=False,
        prefix_chars="\0",
    ).add_argument("operator_args", nargs=argparse.REMAINDER, help="the operator's options (sluice operator --help)")


def run_broker(argv: Sequence[str]) -> int:
    from sluice.broker.main import main as broker_main

    return broker_main(list(argv))


def run_operator(argv: Sequence[str]) -> int:
    from sluice.operator.main import main as operator_main

    return operator_main(list(argv))
