"""Records for an offline partition expire saying so.

A partition with no leader (every in-sync replica down) is LEADER_NOT_AVAILABLE in the metadata:
retriable, as in Kafka, so its batches wait in the accumulator for a leader until
delivery_timeout_ms. They never reach a broker, so nothing records an error on them, and the
final error said only "expired after N ms" (or named the last broker that failed to answer). This
accumulator gives a batch it expires the partition's reason as its last error when the metadata
says the partition is offline, and the sender's timeout error carries it: "off-0 is offline: it
has no leader (replicas [1], in sync [1] ...)". A subclass, so the sender and the accumulator
themselves stay as they are.
"""

from __future__ import annotations

from collections.abc import Callable

from sluice import errors
from sluice.client._network import Cluster
from sluice.client.producer.accumulator import AccumulatorConfig, ProducerBatch, RecordAccumulator


class OfflineAwareAccumulator(RecordAccumulator):
    def __init__(self, cluster: Cluster, config: AccumulatorConfig, wakeup: Callable[[], None] | None = None) -> None:
        super().__init__(config, wakeup)
        self._cluster = cluster

    def expire(self, now: float) -> list[ProducerBatch]:
        expired = super().expire(now)
        for batch in expired:
            reason = self._cluster.offline_reason(batch.tp.topic, batch.tp.partition)
            if reason is not None:
                before = f" (before that: {batch.last_error})" if batch.last_error is not None else ""
                batch.last_error = errors.LeaderNotAvailableError(reason + before)
        return expired
