"""The ``sluice`` argument parser, built from the command groups' own parts.

argparse, one sub-command per Kafka tool a user knows (kafka-topics.sh,
kafka-console-producer.sh, kafka-console-consumer.sh, kafka-transactions.sh,
kafka-producer-perf-test.sh), with Kafka's option names where they exist
(``--bootstrap-server``, ``--from-beginning``, ``--isolation-level``, ``--max-messages``,
``--partitions``, ``--replication-factor``, ``--config``).

Each command group's module adds its own sub-parser (``register``), so a command's options sit
next to the code that reads them; this module owns what they share: the program's name and
description, ``--version``, the ``--bootstrap-server`` and ``--command-config`` options of every client command, and the
order the commands are listed in by ``sluice --help``.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, TypeAlias

import sluice
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
from sluice.cli.bootstrap import DEFAULT_BOOTSTRAP, ENV_BOOTSTRAP

if TYPE_CHECKING:
    # argparse's type for the object add_subparsers() returns; not subscriptable at run time.
    Subcommands: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]


def client_options() -> argparse.ArgumentParser:
    """The parent parser of every command that talks to a cluster: ``--bootstrap-server`` and
    ``--command-config`` (:mod:`sluice.cli.security`)."""
    client = argparse.ArgumentParser(add_help=False)
    client.add_argument(
        "--bootstrap-server",
        metavar="HOST:PORT[,...]",
        help=f"brokers to connect to (default: ${ENV_BOOTSTRAP}, else the running dev cluster, "
        f"else {DEFAULT_BOOTSTRAP})",
    )
    client.add_argument(
        "--command-config",
        metavar="FILE",
        help="client security settings, Kafka's properties: security.protocol=SSL, ssl.ca.location, "
        "ssl.certificate.location, ssl.key.location (default: the secure dev cluster's admin.properties "
        "when connecting to it)",
    )
    return client


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sluice",
        description="Sluice: a transactional, Kafka-style log broker. "
        "Start a local cluster with `sluice dev up`, or see it work with `sluice demo`.",
    )
    parser.add_argument("--version", action="version", version=f"sluice {sluice.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    client = client_options()
    passthrough.register(sub)
    dev.register(sub)
    topics.register(sub, client)
    partitions.register(sub, client)
    produce.register(sub, client)
    consume.register(sub, client)
    transactions.register(sub, client)
    consumer_groups.register(sub, client)
    top.register(sub, client)
    acls.register(sub, client)
    configs.register(sub, client)
    bench.register(sub)
    demo.register(sub)
    return parser
