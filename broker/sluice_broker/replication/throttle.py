"""The reassignment throttles: bytes per second that replicas being added may move.

Kafka's ``leader.replication.throttled.rate`` and ``follower.replication.throttled.rate``
(KIP-73): broker-wide rates for the replication traffic of reassignments, which must not starve
the producers and the in-sync followers. Their scope here is Kafka's
``leader/follower.replication.throttled.replicas`` as ``kafka-reassign-partitions --throttle``
sets them, made automatic: only traffic of a broker in a partition's ``adding_replicas``
(:mod:`sluice.metadata.reassignment`) is charged and held back; the followers that were in sync
before the move, and every other partition, are not. The leader's bucket is charged by the
ReplicaFetch answers it sends to adding replicas (the replica manager); the follower's by the
answers it receives for partitions it is being added to (the fetcher, which asks for no more
than its bucket holds for each such partition, ReplicaFetchPartition.max_bytes, and leaves them
out of its fetches while the bucket is empty).

A token bucket with debt: a fetch is served while the bucket holds at least one byte, and a
fetch may take it below zero (the leader always returns whole batches, and a batch larger than
the rate must still move). The debt is repaid at ``rate`` bytes/s before the next throttled
fetch is served, so over any interval longer than a second the bytes moved stay within
``rate * seconds + burst`` (burst: one second's worth plus one fetch). A throttled partition
then answers with no records, and the follower fetches again after its wait, as a Kafka
follower throttled by its leader does. Rate <= 0: no throttle.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["ReplicationThrottle"]


class ReplicationThrottle:
    """A bytes-per-second budget shared by every throttled replica fetch served by one broker."""

    def __init__(self, rate: int, clock: Callable[[], float] | None = None) -> None:
        self.rate = rate
        self._clock = clock or time.monotonic
        self._tokens = float(max(rate, 0))  # one second's worth to start with
        self._at = self._clock()
        self.throttled_bytes = 0  # moved under the throttle (a metric)

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(float(self.rate), self._tokens + (now - self._at) * self.rate)
        self._at = now

    def available(self) -> int:
        """Bytes a throttled fetch may take now (0: hold it back; unlimited when off)."""
        if not self.enabled:
            return 1 << 62
        self._refill()
        return int(self._tokens) if self._tokens >= 1 else 0

    def charge(self, size: int) -> None:
        """Count ``size`` bytes sent to a throttled replica (may leave a debt)."""
        self.throttled_bytes += size
        if self.enabled:
            self._refill()
            self._tokens -= size
