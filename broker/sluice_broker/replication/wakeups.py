"""Long-poll wake-ups keyed by partition: a change to one partition wakes only the waits on it.

Three kinds of requests park on a leader until something changes: followers' ReplicaFetch (new
batches on a partition of the request), consumers' Fetch (the HW moved on a partition of the
request) and acks=all produces, marker writes and coordinator writes (the HW of their one
partition reached an offset). They used to share one broker-wide event, set on every append and
every HW move anywhere, and re-armed by each waiter: every append woke every parked request,
which then walked all of its partitions to find out that nothing of its own had changed. With
replication factor 3 and the ~100 internal partitions a follower fetches from each leader, that
was most of a replicated transaction's event-loop time (docs/performance.md, "Replicated
transactions"): each append on a follower (a follower is the leader of other partitions) and
each HW move woke both fetches parked on the broker for nothing.

:class:`PartitionWaits` holds one registry per kind of change: a wait registers one
:class:`asyncio.Event` under every partition it cares about *before* it looks (so a change
between its look and its wait is not lost), :meth:`PartitionWaits.wake` sets the events of one
partition, and :meth:`PartitionWaits.wake_all` every event, for changes that concern every wait
(a storage failure, leadership moving). The broker runs on one asyncio loop: no locks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Iterator

from sluice.broker.topic_partition import TopicPartition


class PartitionWaits:
    """Waits parked on partitions, woken by a change to one of them."""

    def __init__(self) -> None:
        self._by_partition: dict[TopicPartition, set[asyncio.Event]] = {}
        self._every: set[asyncio.Event] = set()

    @contextlib.contextmanager
    def watching(self, keys: Iterable[TopicPartition]) -> Iterator[asyncio.Event]:
        """An event set when one of ``keys`` changes (or everything does), registered until the block ends.

        Clear it before each look at the partitions, then wait on it.
        """
        event = asyncio.Event()
        watched = set(keys)
        for key in watched:
            self._by_partition.setdefault(key, set()).add(event)
        self._every.add(event)
        try:
            yield event
        finally:
            self._every.discard(event)
            for key in watched:
                waiting = self._by_partition.get(key)
                if waiting is not None:
                    waiting.discard(event)
                    if not waiting:
                        del self._by_partition[key]

    def wake(self, key: TopicPartition) -> None:
        """Something changed on ``key``: wake the waits on it."""
        waiting = self._by_partition.get(key)
        if waiting:
            for event in waiting:
                event.set()

    def wake_all(self) -> None:
        """Something changed for every partition (storage failure, leadership): wake every wait."""
        for event in self._every:
            event.set()

    def waiting(self, key: TopicPartition) -> int:
        """How many waits are parked on ``key`` (for tests and metrics)."""
        return len(self._by_partition.get(key, ()))
