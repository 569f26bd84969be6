"""The events a broker counts as they happen: plain integers, no locks, no dependencies.

Most of what the metrics endpoint shows is *state* (partition counts, offsets,
lag, open transactions) and is read from the broker's own structures when
Prometheus scrapes (:mod:`sluice.broker.metrics.collectors`). Only what cannot be read back later
must be counted when it happens: bytes and messages in, bytes out, requests and
their latency, ISR shrinks and expands, finished and timed-out transactions,
marker round trips, rebalances. Those land here.

Why hand-rolled counters and not ``prometheus_client.Counter``: the produce path
calls :meth:`BrokerEvents.produced` once per partition batch, and a labelled
``Counter.labels(topic).inc()`` costs about 1.2 us (a lock and a label lookup)
against about 0.1 us for a dict increment. The broker runs on one asyncio loop
and the scrape is served on that same loop, so nothing here needs a lock. The
exposition is still prometheus_client's: :class:`~sluice.broker.metrics.collectors.EventsCollector`
turns these numbers into its metric families at scrape time.

This module imports nothing from the broker, so the modules that report events
(the replica manager, the coordinators, the servicers) depend only on it.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

# Request latency buckets in milliseconds (Kafka's request metrics are in ms). They span an
# in-memory answer (well under 1 ms) to a long-polling Fetch (its max_wait_ms, 500 ms by default).
REQUEST_BUCKETS_MS: tuple[float, ...] = (0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)
# Marker delivery (every partition of a transaction has its COMMIT/ABORT marker), in seconds.
MARKER_BUCKETS_S: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Histogram:
    """Cumulative-at-export bucket counts, a sum and a count: Prometheus' histogram, without the lock."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, float]]:
        """``(le, cumulative count)`` pairs, ``+Inf`` last: the shape HistogramMetricFamily takes."""
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append(("+Inf" if bound == float("inf") else _le(bound), float(running)))
        return out


def _le(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else repr(bound)


@dataclass
class TopicCounters:
    """Kafka's BrokerTopicMetrics for one topic (and, in :attr:`BrokerEvents.all_topics`, for all)."""

    bytes_in: int = 0
    messages_in: int = 0
    bytes_out: int = 0
    # As Kafka's Total*RequestsPerSec, the totals include the failed ones.
    produce_requests: int = 0  # partition batches produced to this broker (as leader or not)
    failed_produce_requests: int = 0
    fetch_requests: int = 0  # partitions in consumer fetches answered
    failed_fetch_requests: int = 0


@dataclass
class FetchTally:
    """What one pass over a Fetch request read, per topic; counted only for the pass that is answered."""

    sizes: dict[str, int] = field(default_factory=dict)  # bytes of stored batches sent
    partitions: dict[str, int] = field(default_factory=dict)  # partitions read ("": of unknown topics)
    failed: dict[str, int] = field(default_factory=dict)  # partitions answered with an error ("": ditto)

    def read(self, topic: str, size: int) -> None:
        self.partitions[topic] = self.partitions.get(topic, 0) + 1
        if size:
            self.sizes[topic] = self.sizes.get(topic, 0) + size

    def error(self, topic: str, known: bool) -> None:
        """A partition answered with an error; ``known``: the topic exists (else only the all-topics count)."""
        key = topic if known else ""
        self.partitions[key] = self.partitions.get(key, 0) + 1
        self.failed[key] = self.failed.get(key, 0) + 1


@dataclass
class BrokerEvents:
    """Everything one broker counts as it happens (see the module docstring)."""

    topics: dict[str, TopicCounters] = field(default_factory=dict)
    all_topics: TopicCounters = field(default_factory=TopicCounters)
    requests: dict[str, int] = field(default_factory=dict)  # RPC name -> calls answered
    request_errors: dict[str, int] = field(default_factory=dict)  # RPC name -> calls that failed as a whole
    request_latency: dict[str, Histogram] = field(default_factory=dict)  # RPC name -> total time, ms
    open_streams: dict[str, int] = field(default_factory=dict)  # streaming RPC name -> streams open now
    isr_shrinks: int = 0
    isr_expands: int = 0
    txn_commits: int = 0  # transactions completed with COMMIT markers everywhere
    txn_aborts: int = 0  # ... with ABORT markers (timeouts and fencing included)
    txn_timeouts: int = 0  # transactions aborted by the timeout scan
    marker_latency: Histogram = field(default_factory=lambda: Histogram(MARKER_BUCKETS_S))
    rebalances: int = 0  # group epoch bumps (each recomputes the target assignment)
    # long-poll wake-ups by wait ("replica_fetch", "fetch"): [answered, idle (woken for nothing)]
    wakeups: dict[str, list[int]] = field(default_factory=dict)

    def _topic(self, topic: str) -> TopicCounters:
        counters = self.topics.get(topic)
        if counters is None:
            counters = self.topics[topic] = TopicCounters()
        return counters

    # -- the data path (called per partition batch: keep these cheap) ------------------------------

    def produced(self, topic: str, size: int, records: int, duplicate: bool = False) -> None:
        """A partition batch appended (``duplicate``: a retry answered with its first offset, not appended)."""
        if duplicate:
            self.produce_duplicate(topic)
            return
        t = self._topic(topic)
        t.produce_requests += 1
        t.bytes_in += size
        t.messages_in += records
        a = self.all_topics
        a.produce_requests += 1
        a.bytes_in += size
        a.messages_in += records

    def produce_duplicate(self, topic: str) -> None:
        for c in (self._topic(topic), self.all_topics):
            c.produce_requests += 1

    def produce_failed(self, topic: str, known: bool) -> None:
        """A partition batch refused; ``known``: the topic exists (a client's made-up topic names must not
        become label values: only the all-topics count takes those)."""
        for c in (self._topic(topic), self.all_topics) if known else (self.all_topics,):
            c.produce_requests += 1
            c.failed_produce_requests += 1

    def fetched(self, tally: FetchTally) -> None:
        """One consumer Fetch answered: what its last pass read (a long poll's earlier passes are not sent)."""
        a = self.all_topics
        for topic, n in tally.partitions.items():
            a.fetch_requests += n
            if topic:
                self._topic(topic).fetch_requests += n
        for topic, size in tally.sizes.items():
            self._topic(topic).bytes_out += size
            a.bytes_out += size
        for topic, n in tally.failed.items():
            a.failed_fetch_requests += n
            if topic:
                self._topic(topic).failed_fetch_requests += n

    def request(self, name: str, millis: float, failed: bool) -> None:
        """One RPC answered (``failed``: it ended in a gRPC error, not a per-partition error code)."""
        self.requests[name] = self.requests.get(name, 0) + 1
        if failed:
            self.request_errors[name] = self.request_errors.get(name, 0) + 1
        hist = self.request_latency.get(name)
        if hist is None:
            hist = self.request_latency[name] = Histogram(REQUEST_BUCKETS_MS)
        hist.observe(millis)

    def stream_opened(self, name: str) -> None:
        self.open_streams[name] = self.open_streams.get(name, 0) + 1

    def stream_closed(self, name: str) -> None:
        self.open_streams[name] -= 1

    def forget_topic(self, topic: str) -> None:
        """A deleted topic's counters go (label values stay bounded by the topics that exist)."""
        self.topics.pop(topic, None)

    # -- replication and coordinators ---------------------------------------------------------------

    def isr_changed(self, old: Sequence[int], new: Sequence[int]) -> None:
        if set(new) - set(old):
            self.isr_expands += 1
        if set(old) - set(new):
            self.isr_shrinks += 1

    def txn_completed(self, committed: bool) -> None:
        if committed:
            self.txn_commits += 1
        else:
            self.txn_aborts += 1

    def txn_timed_out(self) -> None:
        self.txn_timeouts += 1

    def markers_sent(self, seconds: float) -> None:
        self.marker_latency.observe(seconds)

    def woke(self, wait: str, answered: bool) -> None:
        """A parked long poll was woken: it answered, or found nothing and parked again (idle)."""
        counts = self.wakeups.get(wait)
        if counts is None:
            counts = self.wakeups[wait] = [0, 0]
        counts[0 if answered else 1] += 1

    def group_epochs_bumped(self, n: int) -> None:
        if n > 0:
            self.rebalances += n
