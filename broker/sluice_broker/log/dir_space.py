"""Free space of the data volume: read it, and say when it runs low (before it runs out).

A full disk takes the log directory offline (:mod:`sluice.broker.log.storage`); this module is the
warning before that. The housekeeping loop reads the volume (``statvfs``, no I/O to RocksDB) every
round; :class:`LowSpaceTracker` turns the readings into a low / not-low state with a point of
hysteresis, so a volume hovering at the threshold does not flap. Only a *change* of that state is
written to the broker's ``brokers/<id>`` document (with the figures at that moment), never every
reading: in Kubernetes each write is an API-server write, and the figures themselves are on the
metrics endpoint (``sluice_data_volume_free_bytes``). The controller logs the change and the
operator turns it into a ``LogDirLowSpace`` / ``LogDirSpaceOk`` Event on the broker's Pod.

``log.dir.free.space.warn.percent`` (default 5, 0 turns the warning off) is the threshold: low
when less than that percentage of the volume is free.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

HYSTERESIS_PERCENT = 1.0  # low below the threshold, not low again only above threshold + this


@dataclass(frozen=True)
class SpaceReading:
    free_bytes: int  # available to the broker (f_bavail)
    size_bytes: int

    @property
    def free_percent(self) -> float:
        return 100.0 * self.free_bytes / self.size_bytes if self.size_bytes > 0 else 100.0

    def describe(self) -> str:
        mib = 1024 * 1024
        return f"{self.free_bytes / mib:.1f} MiB free of {self.size_bytes / mib:.1f} MiB ({self.free_percent:.1f}%)"


def read_space(path: str) -> SpaceReading:
    st = os.statvfs(path)
    return SpaceReading(st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize)


class LowSpaceTracker:
    """Low / not low, from readings, with hysteresis; ``observe`` returns the new state on a change."""

    def __init__(self, warn_percent: float) -> None:
        if not 0 <= warn_percent <= 100:
            raise ValueError(f"log.dir.free.space.warn.percent must be in [0, 100], not {warn_percent}")
        self.warn_percent = warn_percent
        self.low = False

    def observe(self, reading: SpaceReading) -> bool | None:
        if self.warn_percent <= 0:
            return None
        if not self.low and reading.free_percent < self.warn_percent:
            self.low = True
            return True
        if self.low and reading.free_percent >= self.warn_percent + HYSTERESIS_PERCENT:
            self.low = False
            return False
        return None
