"""``sluice top``: one screen of the cluster for people without Grafana, refreshed.

Each refresh asks the cluster what the admin tools ask (Metadata, ListTransactions and
DescribeTransactions, ListGroups/DescribeGroups, OffsetFetch and ListOffsets) and prints one
screen: the brokers with the partitions each leads, the partitions that are under-replicated or
offline, the open transactions (oldest first, with their age) and the consumer groups (most
lagging first, lag as ``consumer-groups describe`` computes it: high watermark minus committed).

Bounded in every direction, because it runs unattended on a loaded cluster: every section shows
at most ``--rows`` lines (with a count of the rest), at most ``--rows`` transactions and groups
are described per refresh (one request each), each refresh has the admin client's timeout, and
the loop stops after ``--iterations`` refreshes (default: until Ctrl-C). A refresh the cluster
does not answer (every broker down, a request timing out) is one line saying so, and the next
refresh tries again. On a terminal the screen is redrawn in place; otherwise (a pipe, a file)
each refresh is printed after the last.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sluice.cli.argtypes import positive_float, positive_int
from sluice.cli.bootstrap import connection
from sluice.cli.clients import open_admin
from sluice.cli.consumer_groups import group_lag
from sluice.cli.exits import describe_error
from sluice.cli.output import close_quietly, table

if TYPE_CHECKING:
    from sluice.cli.parser import Subcommands
    from sluice.client import Admin

OPEN_STATES = ("Ongoing", "Prepared", "PrepareCommit", "PrepareAbort")
CLEAR = "\x1b[H\x1b[2J"


def register(sub: Subcommands, client: argparse.ArgumentParser) -> None:
    top = sub.add_parser(
        "top", parents=[client], help="one refreshed screen: brokers, leaders, replication, transactions, lag"
    )
    top.add_argument("--interval", type=positive_float, default=2.0, metavar="SECONDS", help="between refreshes")
    top.add_argument("--iterations", type=positive_int, default=None, metavar="N", help="stop after N refreshes")
    top.add_argument("--rows", type=positive_int, default=10, metavar="N", help="lines per section (default 10)")


@dataclass
class Screen:
    """What one refresh found (plain data, so rendering is a pure function)."""

    cluster_id: str
    brokers: list[tuple[int, str]]  # (id, host:port)
    leaders: dict[int, int]  # broker id -> partitions led
    partitions: int
    under_replicated: list[tuple[str, int, list[int], list[int]]]  # topic, partition, replicas, isr
    offline: list[tuple[str, int]]
    open_transactions: list[tuple[str, str, float | None, int]]  # id, state, age s, coordinator
    open_total: int
    groups: list[tuple[str, str, int, int | None]]  # group, state, members, lag (None: unknown)
    groups_total: int
    errors: list[str] = field(default_factory=list)
    taken_at: float = field(default_factory=time.time)


def gather(admin: Admin, rows: int) -> Screen:
    """One refresh: at most ``rows`` transactions and groups described."""
    from sluice import errors

    cluster = admin.describe_cluster()
    topics = admin.describe_topics(admin.list_topics(include_internal=True))
    leaders: dict[int, int] = {b.broker_id: 0 for b in cluster.brokers}
    under: list[tuple[str, int, list[int], list[int]]] = []
    offline: list[tuple[str, int]] = []
    count = 0
    for t in sorted(topics, key=lambda t: (t.internal, t.name)):  # the users' topics before the internal ones
        for p in t.partitions:
            count += 1
            if p.leader < 0:
                offline.append((t.name, p.partition))
            else:
                leaders[p.leader] = leaders.get(p.leader, 0) + 1
            if len(p.isr) < len(p.replicas):
                under.append((t.name, p.partition, p.replicas, p.isr))
    problems: list[str] = []
    open_txns: list[tuple[str, str, float | None, int]] = []
    listed = admin.list_transactions(states=OPEN_STATES)
    now_ms = time.time() * 1000
    for txn in listed[: rows * 4]:  # described one by one: the oldest of a bounded set
        try:
            (d,) = admin.describe_transactions([txn.transactional_id])
        except errors.SluiceError as exc:
            problems.append(f"transaction {txn.transactional_id}: {exc.code_name}")
            continue
        age = (now_ms - d.transaction_start_time_ms) / 1000 if d.transaction_start_time_ms >= 0 else None
        open_txns.append((d.transactional_id, d.state, age, d.coordinator_id))
    open_txns.sort(key=lambda x: -(x[2] or 0))
    groups: list[tuple[str, str, int, int | None]] = []
    listed_groups = admin.list_consumer_groups()
    for g in listed_groups[: rows * 2]:
        try:
            desc = admin.describe_consumer_groups([g.group_id])[g.group_id]
            lags = [r.lag for r in group_lag(admin, g.group_id, desc)]
        except errors.SluiceError as exc:
            problems.append(f"group {g.group_id}: {exc.code_name}")
            continue
        known = [x for x in lags if x is not None]
        groups.append((g.group_id, desc.state, len(desc.members), sum(known) if known else None))
    groups.sort(key=lambda x: -(x[3] or 0))
    return Screen(
        cluster_id=cluster.cluster_id,
        brokers=sorted((b.broker_id, f"{b.host}:{b.port}") for b in cluster.brokers),
        leaders=leaders,
        partitions=count,
        under_replicated=under,
        offline=offline,
        open_transactions=open_txns,
        open_total=len(listed),
        groups=groups,
        groups_total=len(listed_groups),
        errors=problems,
    )


def _bounded(rows: Sequence[Sequence[object]], header: list[str], limit: int, total: int | None = None) -> str:
    if not rows:
        return "  (none)"
    shown = table(rows[:limit], header)
    rest = (total if total is not None else len(rows)) - min(limit, len(rows))
    body = "\n".join("  " + line for line in shown.splitlines())
    return body + (f"\n  ... and {rest} more" if rest > 0 else "")


def render(s: Screen, rows: int) -> str:
    """The screen as text: a title line, then brokers, replication, transactions, groups."""
    when = time.strftime("%H:%M:%S", time.localtime(s.taken_at))
    problems = [[f"{t}-{p}", "offline", "-", "-"] for t, p in s.offline]
    problems += [
        [f"{t}-{p}", "under-replicated", ",".join(map(str, r)), ",".join(map(str, i))]
        for t, p, r, i in s.under_replicated
    ]
    lines = [
        f"sluice top  cluster {s.cluster_id}  {when}  brokers {len(s.brokers)}  partitions {s.partitions}  "
        f"under-replicated {len(s.under_replicated)}  offline {len(s.offline)}  "
        f"open transactions {s.open_total}  groups {s.groups_total}",
        "",
        "BROKERS",
        _bounded([[b, addr, s.leaders.get(b, 0)] for b, addr in s.brokers], ["ID", "ADDRESS", "LEADERS"], rows),
        "",
        "UNDER-REPLICATED / OFFLINE PARTITIONS",
        _bounded(problems, ["PARTITION", "STATE", "REPLICAS", "ISR"], rows),
        "",
        "OPEN TRANSACTIONS (oldest first)",
        _bounded(
            [[t, st, "-" if age is None else f"{age:.1f}s", c] for t, st, age, c in s.open_transactions],
            ["TRANSACTIONAL_ID", "STATE", "AGE", "COORDINATOR"],
            rows,
            s.open_total,
        ),
        "",
        "CONSUMER GROUPS (most lag first)",
        _bounded(
            [[g, st, m, "-" if lag is None else lag] for g, st, m, lag in s.groups],
            ["GROUP", "STATE", "MEMBERS", "LAG"],
            rows,
            s.groups_total,
        ),
    ]
    if s.errors:
        lines += ["", "NOT SHOWN", *("  " + e for e in s.errors[:rows])]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from sluice import errors

    admin = open_admin(connection(args))
    redraw = sys.stdout.isatty()
    try:
        n = 0
        while args.iterations is None or n < args.iterations:
            if n:
                time.sleep(args.interval)
            try:
                screen = render(gather(admin, args.rows), args.rows)
            except errors.SluiceError as exc:  # the cluster is moving (or down): say so, keep refreshing
                screen = f"sluice top  {time.strftime('%H:%M:%S')}  the cluster did not answer: {describe_error(exc)}"
            print((CLEAR if redraw else ("\n" if n else "")) + screen, flush=True)
            n += 1
    finally:
        close_quietly(admin)
    return 0
