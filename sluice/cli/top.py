"""``sluice top``: one screen of the cluster for people without Grafana, refreshed.

Each refresh asks the cluster what the admin tools ask (Metadata, ListTransactions and
DescribeTransactions, ListGroups/DescribeGroups, OffsetFetch and ListOffsets) and prints one
screen: the brokers with the partitions each leads, the partitions that are under-replicated or
offline, the open transactions (oldest first, with their age) and the consumer groups (most
lagging first, lag as ``consumer-groups describe`` computes it: high watermark minus committed).

Bounded in every direction, because it runs unattended on a loaded cluster: every section shows
at most ``--rows`` lines (with a count of the rest), at most ``--rows`` transactions and groups
are described per refresh (one request each), each refresh has the admin client's timeout, and
the loop stops after ``--iterations`` refreshes (default: until Ctrl-C, or ``q`` on a terminal).
Each broker's health check (one second at most) gives its STATUS: Metadata lists every
registered broker, a departed one too, so that column is what says a broker is gone. A refresh the cluster
does not answer (every broker down, a request timing out) is one line saying so, and the next
refresh tries again. On a terminal the screen is redrawn in place; otherwise (a pipe, a file)
each refresh is printed after the last.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
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
    # broker id -> its health check's answer (SERVING, NOT_SERVING, UNREACHABLE); missing: not checked.
    # Metadata lists every registered broker, a departed one too: this is what says it is gone.
    health: dict[int, str] = field(default_factory=dict)


def gather(admin: Admin, rows: int, health: Callable[[str], str] | None = None) -> Screen:
    """One refresh: at most ``rows`` transactions and groups described, each broker's ``health`` asked."""
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
    brokers = sorted((b.broker_id, f"{b.host}:{b.port}") for b in cluster.brokers)
    return Screen(
        cluster_id=cluster.cluster_id,
        brokers=brokers,
        health={b: health(addr) for b, addr in brokers} if health is not None else {},
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
    down = [b for b, _addr in s.brokers if s.health.get(b, "SERVING") != "SERVING"]
    broker_rows = [
        [b, addr, _STATUS.get(s.health.get(b, ""), s.health.get(b, "-")), s.leaders.get(b, 0)] for b, addr in s.brokers
    ]
    counted = f"brokers {len(s.brokers)}" + (f" ({len(down)} not serving)" if down else "")
    lines = [
        f"sluice top  cluster {s.cluster_id}  {when}  {counted}  partitions {s.partitions}  "
        f"under-replicated {len(s.under_replicated)}  offline {len(s.offline)}  "
        f"open transactions {s.open_total}  groups {s.groups_total}",
        "",
        "BROKERS",
        _bounded(broker_rows, ["ID", "ADDRESS", "STATUS", "LEADERS"], rows),
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


_STATUS = {"SERVING": "up", "UNREACHABLE": "DOWN", "NOT_SERVING": "not serving"}


def run(args: argparse.Namespace) -> int:
    from sluice import errors
    from sluice.cli.security import channel_credentials
    from sluice.testing import check_health

    conn = connection(args)
    admin = open_admin(conn)
    security = getattr(conn, "security", None)
    credentials = channel_credentials(security) if security is not None else None

    def health(address: str) -> str:
        return check_health(address, timeout=1.0, credentials=credentials)

    redraw = sys.stdout.isatty()
    keys = _Keys() if redraw and sys.stdin.isatty() else None
    try:
        n = 0
        while args.iterations is None or n < args.iterations:
            if n and _wait(args.interval, keys):
                break  # q pressed
            try:
                screen = render(gather(admin, args.rows, health), args.rows)
            except errors.SluiceError as exc:  # the cluster is moving (or down): say so, keep refreshing
                screen = f"sluice top  {time.strftime('%H:%M:%S')}  the cluster did not answer: {describe_error(exc)}"
            hint = "\n\n(q to quit)" if keys is not None else ""
            print((CLEAR if redraw else ("\n" if n else "")) + screen + hint, flush=True)
            n += 1
    finally:
        if keys is not None:
            keys.restore()
        close_quietly(admin)
    return 0


def _wait(seconds: float, keys: _Keys | None) -> bool:
    """Sleep between refreshes; True when q was pressed meanwhile (a terminal only)."""
    if keys is None:
        time.sleep(seconds)
        return False
    return keys.quit_within(seconds)


class _Keys:
    """The terminal in cbreak mode (keys arrive unbuffered, unechoed), so ``q`` quits as in top(1)."""

    def __init__(self) -> None:
        import termios
        import tty

        self._fd = sys.stdin.fileno()
        self._saved = termios.tcgetattr(self._fd)
        tty.setcbreak(self._fd)

    def quit_within(self, seconds: float) -> bool:
        import os
        import select

        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([self._fd], [], [], left)
            if ready and os.read(self._fd, 1) in (b"q", b"Q"):
                return True
        return False

    def restore(self) -> None:
        import termios

        termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved)
