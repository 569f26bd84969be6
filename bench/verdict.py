"""Was the machine quiet enough for a run's figures to mean something?

A benchmark on a shared machine measures the machine's other work as much as the system under
test. Two signals, both recorded with every run:

* **other work during the run**: the machine's busy CPU seconds (``/proc/stat``) minus the CPU
  seconds of the benchmark's own process tree (the client, and the brokers it started), as a
  share of what the machine could do in the run's wall time (cores x seconds). This is exact about
  *who* used the CPU, unlike the load average, which the benchmark itself raises;
* **the load average before the first run**: taken before the harness starts anything, so it is
  only other work. (Load averages taken between runs are recorded for the reader but not judged:
  they decay over minutes and mostly show the harness's own previous run.)

A run is *valid* only when both are under their limits (``Limits``; the command-line tools expose
them). The verdict never hides a figure: an invalid run is printed and saved with the reasons, and
the summary says the comparison is not valid.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Limits:
    # Other processes may use at most this share of the machine's CPU during a run. 10% of two
    # cores is 0.2 of a core: enough for the system's own daemons, not for another test suite.
    max_foreign_share: float = 0.10
    # The 1-minute load average before the first run, per core. 0.5 per core: half the machine
    # was already runnable by others, which swings results by more than the 10% we want to see.
    max_start_load_per_cpu: float = 0.5

    def __post_init__(self) -> None:
        if not 0 < self.max_foreign_share <= 1:
            raise ValueError(f"max_foreign_share must be in (0, 1], not {self.max_foreign_share}")
        if self.max_start_load_per_cpu <= 0:
            raise ValueError(f"max_start_load_per_cpu must be positive, not {self.max_start_load_per_cpu}")


@dataclass(frozen=True)
class RunLoad:
    """What the harness saw of the machine during one run."""

    wall_s: float
    machine_busy_s: float  # whole machine, all cores
    own_cpu_s: float  # the harness's process tree (client and brokers)
    cpus: int
    load_1m_after: float = 0.0

    @property
    def foreign_cpu_s(self) -> float:
        # Sampling skew can make the difference slightly negative on an idle machine.
        return max(0.0, self.machine_busy_s - self.own_cpu_s)

    @property
    def foreign_share(self) -> float:
        capacity = self.wall_s * max(1, self.cpus)
        return self.foreign_cpu_s / capacity if capacity > 0 else 0.0


@dataclass
class Verdict:
    valid: bool = True
    reasons: list[str] = field(default_factory=list)

    def add(self, reason: str) -> None:
        self.valid = False
        self.reasons.append(reason)

    def merge(self, other: Verdict) -> Verdict:
        out = Verdict(self.valid and other.valid, list(self.reasons))
        out.reasons.extend(r for r in other.reasons if r not in out.reasons)
        return out

    def text(self) -> str:
        return "valid" if self.valid else "NOT VALID: " + "; ".join(self.reasons)


def judge_start(load_1m: float, cpus: int, limits: Limits = Limits()) -> Verdict:
    """The machine before the harness started anything."""
    v = Verdict()
    limit = limits.max_start_load_per_cpu * max(1, cpus)
    if load_1m > limit:
        v.add(
            f"load average {load_1m:.2f} before the first run (limit {limit:.2f} on {cpus} CPUs): the machine was busy"
        )
    return v


def judge_run(load: RunLoad, limits: Limits = Limits()) -> Verdict:
    """One run: did other work take more than its share of the CPU meanwhile?"""
    v = Verdict()
    if load.foreign_share > limits.max_foreign_share:
        v.add(
            f"other processes used {load.foreign_cpu_s:.1f} CPU s in {load.wall_s:.1f} s "
            f"({load.foreign_share:.0%} of {load.cpus} CPUs; limit {limits.max_foreign_share:.0%}): "
            "the machine was busy"
        )
    return v


def wait_quiet(
    limits: Limits,
    cpus: int,
    timeout_s: float,
    *,
    loadavg: Callable[[], tuple[float, float, float]] = os.getloadavg,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    say: Callable[[str], None] = print,
) -> float:
    """Wait (at most ``timeout_s``) for the 1-minute load average to fall under the start limit.

    A harness started right after a test suite would otherwise be judged on the suite's tail:
    the load average decays over minutes (a factor e every minute) even when nothing runs any
    more. Returns the load average when it stopped waiting; the start verdict is still taken
    from it, so a machine that stays busy yields a run marked not valid, never a hidden one.
    """
    limit = limits.max_start_load_per_cpu * max(1, cpus)
    deadline = clock() + timeout_s
    last_said = -1e9
    load = loadavg()[0]
    while load > limit and clock() < deadline:
        if clock() - last_said >= 15:
            say(f"waiting for the machine to be quiet: load average {load:.2f}, limit {limit:.2f} "
                f"({max(0.0, deadline - clock()):.0f} s left of --wait-quiet)")  # fmt: skip
            last_said = clock()
        sleep(min(5.0, max(0.0, deadline - clock())))
        load = loadavg()[0]
    return load
