"""Limits per principal: how fast one principal may obtain new producer ids.

Every InitProducerId that asks for a new producer id (producer_id -1) takes a token from its
principal's bucket; a bucket holds ``producer.id.rate.per.principal.per.minute`` tokens and
refills continuously at that rate. An empty bucket refuses with THROTTLING_QUOTA_EXCEEDED
naming the key: clients retry after a back-off, so a well-behaved producer is slowed, not
failed, while a client creating producers in a loop (issue 12 measured 20,000 from one client,
each a producer state kept by every partition it writes) cannot exhaust the broker. The table of
buckets is bounded: idle full buckets are dropped first.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

KEY = "producer.id.rate.per.principal.per.minute"
MAX_PRINCIPALS = 100_000


class RateLimit:
    """A token bucket per principal: ``per_minute`` tokens, refilled continuously."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        if per_minute < 0:
            raise ValueError(f"{KEY} must be >= 0 (0: unlimited), not {per_minute}")
        self.per_minute = per_minute
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # principal -> (tokens, at)

    def take(self, principal: str) -> bool:
        """Take one token; False when the principal's bucket is empty (the request is refused)."""
        if self.per_minute == 0:
            return True
        now = self.clock()
        tokens, at = self._buckets.get(principal, (float(self.per_minute), now))
        tokens = min(float(self.per_minute), tokens + (now - at) * self.per_minute / 60.0)
        if tokens < 1.0:
            self._buckets[principal] = (tokens, now)
            return False
        self._buckets[principal] = (tokens - 1.0, now)
        if len(self._buckets) > MAX_PRINCIPALS:
            self._forget_full(now)
        return True

    def _forget_full(self, now: float) -> None:
        for principal, (tokens, at) in list(self._buckets.items()):
            if tokens + (now - at) * self.per_minute / 60.0 >= self.per_minute:
                del self._buckets[principal]

    def refusal(self, principal: str) -> str:
        return f"{principal} obtained {self.per_minute} new producer ids in the last minute ({KEY}); retry later"


class RateOverrides(Protocol):
    """Quotas of one key from client quota entities (sluice.broker.security.quota_watch.QuotaRates)."""

    def any(self) -> bool: ...

    def resolve(self, principal: str, client_id: str) -> tuple[tuple[str, str], int] | None: ...


MAX_THROTTLE_MS = 10_000  # one response is never held back longer (Kafka bounds it by its quota window)


class ByteRateQuota:
    """Bytes per second per quota entity (Kafka's producer_byte_rate / consumer_byte_rate).

    A bucket holds up to one second of its rate and refills at the rate; each request takes its
    bytes, and may take it below zero. The throttle time is how long the bucket needs to be back
    at zero. As Kafka since KIP-219, the response goes out at once and reports it
    (``throttle_time_ms``); the client waits that long before its next request to this broker,
    and a client that does not is held back by the broker at the start of its next request
    (:meth:`delay`), the way Kafka mutes the channel. So an entity's long-run rate converges to
    its quota whatever its clients do.

    Whose bucket a request fills and at what rate come from ``rates``: the client quota entity
    matching the caller's user and client id (users, client ids and both, in Kafka's order,
    :mod:`sluice.broker.security.quota_resolution`), one bucket shared by every connection of
    that entity; else the broker's ``key`` (0: unlimited), one bucket per principal.
    """

    def __init__(
        self,
        key: str,
        bytes_per_s: int,
        clock: Callable[[], float] = time.monotonic,
        rates: RateOverrides | None = None,
    ) -> None:
        if bytes_per_s < 0:
            raise ValueError(f"{key} must be >= 0 bytes/s (0: unlimited), not {bytes_per_s}")
        self.key = key
        self.rate = bytes_per_s
        self.clock = clock
        self.rates = rates
        self._buckets: dict[tuple[str, str], tuple[float, float, int]] = {}  # bucket -> (bytes left, at, rate)

    def bucket_of(self, principal: str, client_id: str = "") -> tuple[tuple[str, str], int]:
        """The bucket a caller's bytes go to, and its rate in bytes/s (0: unlimited)."""
        if self.rates is not None and self.rates.any():
            found = self.rates.resolve(principal, client_id)
            if found is not None:
                return found
        return (principal, ""), self.rate

    def rate_of(self, principal: str, client_id: str = "") -> int:
        return self.bucket_of(principal, client_id)[1]

    @property
    def active(self) -> bool:
        """Whether any caller may have a quota (else the data path skips the accounting)."""
        return self.rate > 0 or (self.rates is not None and self.rates.any())

    def delay(self, principal: str, client_id: str = "") -> float:
        """Seconds until the caller's bucket is back at zero (0.0 when it is not below)."""
        bucket, rate = self.bucket_of(principal, client_id)
        found = self._buckets.get(bucket)
        if rate == 0 or found is None:
            return 0.0
        left, at, _ = found
        left += (self.clock() - at) * rate
        return 0.0 if left >= 0 else min(MAX_THROTTLE_MS / 1000, -left / rate)

    def record(self, principal: str, nbytes: int, client_id: str = "") -> int:
        """Count ``nbytes`` for the caller; the throttle time in ms (0 when within the quota)."""
        bucket, rate = self.bucket_of(principal, client_id)
        if rate == 0:
            return 0
        now = self.clock()
        left, at, _ = self._buckets.get(bucket, (float(rate), now, rate))
        left = min(float(rate), left + (now - at) * rate) - nbytes
        self._buckets[bucket] = (left, now, rate)
        if len(self._buckets) > MAX_PRINCIPALS:  # drop the buckets that are full again
            self._buckets = {b: v for b, v in self._buckets.items() if v[0] + (now - v[1]) * v[2] < v[2]}
        if left >= 0:
            return 0
        return min(MAX_THROTTLE_MS, int(-left * 1000 / rate) + 1)
