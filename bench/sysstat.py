"""CPU seconds and memory of process trees, and of the whole machine, from Linux's /proc.

The benchmarks judge a broker by the CPU it spends per GB moved, a figure that does not depend on
how many cores the machine has; and they judge a *run* by how much CPU something other than the
benchmark used meanwhile (``bench.verdict``). Both need CPU time per process tree:

* a process's own time is ``utime + stime`` (fields 14-15 of ``/proc/PID/stat``), which counts
  every thread (RocksDB's background threads, the JVM's GC and JIT threads);
* children that exited and were reaped are in the parent's ``cutime + cstime`` (16-17), so a tree's
  total is the sum of ``utime + stime + cutime + cstime`` over its live members (a child reaped by
  a live member is counted once, in that member's ``c*`` fields);
* the machine's busy time is the non-idle columns of the ``cpu`` line of ``/proc/stat``.

Parsing is kept in pure functions over text (``parse_stat``, ``parse_machine``, ``descendants``) so
it is tested without the files; the readers around them tolerate processes vanishing mid-scan.
"""

from __future__ import annotations

import os
import threading
import time
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
PROC = Path("/proc")


@dataclass(frozen=True)
class ProcStat:
    pid: int
    ppid: int
    cpu_ticks: int  # utime + stime
    child_ticks: int  # cutime + cstime (reaped children)
    rss_pages: int


def parse_stat(text: str) -> ProcStat:
    """One ``/proc/PID/stat`` line. The command name (field 2) may hold spaces and parentheses, so
    the fields are counted from the last ``)``."""
    head, _, rest = text.rpartition(")")
    pid = int(head.split("(", 1)[0])
    f = rest.split()
    # rest starts at field 3 (state): field N is f[N - 3]
    return ProcStat(
        pid=pid,
        ppid=int(f[1]),
        cpu_ticks=int(f[11]) + int(f[12]),
        child_ticks=int(f[13]) + int(f[14]),
        rss_pages=int(f[21]),
    )


def parse_machine(text: str) -> tuple[int, int]:
    """``/proc/stat``'s aggregate line -> (busy ticks, total ticks). Idle and iowait are not busy;
    guest time is already inside user time and is not added twice."""
    for line in text.splitlines():
        if line.startswith("cpu "):
            v = [int(x) for x in line.split()[1:]]
            v += [0] * (8 - len(v))
            user, nice, system, idle, iowait, irq, softirq, steal = v[:8]
            busy = user + nice + system + irq + softirq + steal
            return busy, busy + idle + iowait
    raise ValueError("no aggregate 'cpu ' line in /proc/stat")


def descendants(parents: Mapping[int, int], roots: Iterable[int]) -> set[int]:
    """The roots and every process below them, given pid -> ppid of every live process."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    out: set[int] = set()
    todo = [r for r in roots if r in parents]
    while todo:
        pid = todo.pop()
        if pid in out:
            continue
        out.add(pid)
        todo.extend(children.get(pid, ()))
    return out


def tree_ticks(stats: Mapping[int, ProcStat], members: Iterable[int]) -> int:
    """CPU ticks of a tree: own and reaped-children time of every live member."""
    return sum(stats[p].cpu_ticks + stats[p].child_ticks for p in members if p in stats)


def read_all() -> dict[int, ProcStat]:
    """Every live process's stat (processes that exit during the scan are skipped)."""
    out: dict[int, ProcStat] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            out[int(entry.name)] = parse_stat((entry / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue
    return out


def machine_cpu_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, over all cores."""
    busy, total = parse_machine((PROC / "stat").read_text())
    return busy / CLK_TCK, total / CLK_TCK


@dataclass(frozen=True)
class TreeSample:
    """One look at some process trees and the machine."""

    at: float  # time.perf_counter()
    cpu_s: dict[str, float]  # per named tree: CPU seconds so far
    rss_bytes: dict[str, int]  # per named tree: resident memory now
    machine_busy_s: float
    load_1m: float


def children_of(pid: int) -> list[int]:
    """Live children of ``pid`` from ``/proc/PID/task/*/children`` (cheap: no scan of /proc)."""
    out: list[int] = []
    try:
        tasks = list((PROC / str(pid) / "task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            out.extend(int(x) for x in (task / "children").read_text().split())
        except (OSError, ValueError):
            continue
    return out


def tree_members(roots: Iterable[int]) -> set[int]:
    """The roots and their live descendants. Walks the kernel's children lists, which is cheap
    enough to do every 100 ms inside a benchmark's client process; falls back to a scan of /proc
    when the kernel has no children files."""
    roots = list(roots)
    if roots and not (PROC / str(roots[0]) / "task" / str(roots[0]) / "children").exists():
        return descendants({p: s.ppid for p, s in read_all().items()}, roots)
    out: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid in out or not (PROC / str(pid)).exists():
            continue
        out.add(pid)
        todo.extend(children_of(pid))
    return out


def read_stats(pids: Iterable[int]) -> dict[int, ProcStat]:
    out: dict[int, ProcStat] = {}
    for pid in pids:
        try:
            out[pid] = parse_stat((PROC / str(pid) / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue
    return out


def sample(trees: Mapping[str, Iterable[int]]) -> TreeSample:
    """CPU seconds and RSS of each named tree (its roots and their descendants), and the machine's."""
    cpu: dict[str, float] = {}
    rss: dict[str, int] = {}
    for name, roots in trees.items():
        stats = read_stats(tree_members(roots))
        cpu[name] = tree_ticks(stats, stats) / CLK_TCK
        rss[name] = sum(s.rss_pages for s in stats.values()) * PAGE
    busy, _ = machine_cpu_seconds()
    return TreeSample(time.perf_counter(), cpu, rss, busy, os.getloadavg()[0])


def interpolate(points: list[tuple[float, float]], t: float) -> float:
    """The value of a cumulative counter at time ``t``, linear between the samples around it
    (clamped to the first and last sample). ``points`` are (time, value), sorted by time."""
    if not points:
        raise ValueError("no samples")
    times = [p[0] for p in points]
    i = bisect_left(times, t)
    if i == 0:
        return points[0][1]
    if i >= len(points):
        return points[-1][1]
    (t0, v0), (t1, v1) = points[i - 1], points[i]
    return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)


class Sampler:
    """Samples named process trees every ``interval`` seconds on a daemon thread, so CPU used in a
    window that is only known afterwards (the timed part of a benchmark that also fills its topic)
    can be read back with :meth:`cpu_between`. Memory peaks are kept too."""

    def __init__(self, trees: Mapping[str, Iterable[int]], interval: float = 0.1) -> None:
        self.trees = {k: list(v) for k, v in trees.items()}
        self.interval = interval
        self.samples: list[TreeSample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self.take()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.take()

    def take(self) -> TreeSample:
        s = sample(self.trees)
        with self._lock:
            self.samples.append(s)
        return s

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.take()
            except OSError:
                continue

    def cpu_between(self, tree: str, t0: float, t1: float) -> float:
        with self._lock:
            pts = [(s.at, s.cpu_s.get(tree, 0.0)) for s in self.samples]
        return interpolate(pts, t1) - interpolate(pts, t0)

    def machine_between(self, t0: float, t1: float) -> float:
        with self._lock:
            pts = [(s.at, s.machine_busy_s) for s in self.samples]
        return interpolate(pts, t1) - interpolate(pts, t0)

    def peak_rss(self, tree: str, t0: float = float("-inf"), t1: float = float("inf")) -> int:
        with self._lock:
            vals = [s.rss_bytes.get(tree, 0) for s in self.samples if t0 <= s.at <= t1]
        return max(vals, default=0)
