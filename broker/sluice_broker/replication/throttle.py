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

**A rate per rebalance.** ``kafka-reassign-partitions --throttle`` sets the brokers' rates as
dynamic configs for the time of a reassignment, and ``--verify`` removes them. Here a running
SluiceRebalance with ``spec.throttleBytesPerSecond`` writes the cluster-wide
``replication_throttle`` document (:class:`sluice.metadata.documents.ReplicationThrottleDocument`),
and removes it when it ends; every broker's cluster view hands its rate to :meth:`override`
on both buckets. The rate in force is the document's while it exists, else the static
configuration's (:attr:`configured`). A changed rate takes effect at once: the bucket keeps what
it holds, capped at one second's worth of the new rate.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["ReplicationThrottle"]


class ReplicationThrottle:
    """A bytes-per-second budget shared by every throttled replica fetch served by one broker."""

    def __init__(self, rate: int, clock: Callable[[], float] | None = None) -> None:
        self.configured = rate  # the static leader/follower.replication.throttled.rate
        self.overridden: int | None = None  # a rebalance's rate (the replication_throttle document)
        self._clock = clock or time.monotonic
        self._tokens = float(max(rate, 0))  # one second's worth to start with
        self._at = self._clock()
        self.throttled_bytes = 0  # moved under the throttle (a metric)

    @property
    def rate(self) -> int:
        """The rate in force: the rebalance's while there is one, else the configured one."""
        return self.configured if self.overridden is None else self.overridden

    def override(self, rate: int | None) -> None:
        """Use ``rate`` (None: back to the configured rate) from now on."""
        if rate == self.overridden:
            return
        was_enabled = self.enabled
        if was_enabled:
            self._refill()  # settle what the old rate earned
        self.overridden = rate
        self._at = self._clock()
        if not was_enabled:
            self._tokens = float(max(self.rate, 0))  # one second's worth, as at the start
        elif self.enabled:
            self._tokens = min(self._tokens, float(self.rate))

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
