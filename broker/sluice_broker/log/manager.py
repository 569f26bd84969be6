"""The log directory of this broker: its partitions' logs on disk, the directory's health, housekeeping.

Kafka's LogManager, the storage side of what a broker holds, apart from the replication side
(:class:`~sluice.broker.replica_manager.ReplicaManager`: leadership, ISR, high watermark, the
data-path requests). The replica manager asks this one to open a partition's log when the
metadata places it here and to delete it when it goes; everything else here runs from the
broker's housekeeping loops (:mod:`sluice.broker.main`):

* **free space**: :meth:`LogManager.check_log_dir_space` records a change of "low"
  (``log.dir.free.space.warn.percent``) in this broker's ``brokers/<id>`` document, and
  :meth:`LogManager.report_storage_failure` an offline directory (a full disk,
  :mod:`sluice.broker.log.storage`), which the controller fences the broker on;
* **stray partitions** (:mod:`sluice.broker.log.stray`): a topic deleted, or deleted and created
  again under its name, while this broker was down leaves keys nobody would ever delete. Once
  the first full metadata read is done (:meth:`LogManager.delete_stray_partitions`) and after
  every topic change, partitions on disk that the metadata does not assign to this broker, by
  topic id, are deleted, and their key ranges compacted on a thread of their own so the space
  is given back without holding up the event loop;
* **retention and compaction** (``cleanup.policy``), **producer expiry**
  (``producer.id.expiration.ms``) and **high watermark checkpoints**, on every replica. They run
  on the event loop, like every other access to a partition's log (which is not thread-safe),
  and yield to it between partitions so a broker with many partitions keeps answering.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from sluice import errors
from sluice.broker.cluster import INTERNAL_TOPICS, ClusterView
from sluice.broker.config import BrokerConfig
from sluice.broker.log.dir_space import LowSpaceTracker, read_space
from sluice.broker.log.partition import PartitionLog
from sluice.broker.log.storage import Storage, WriteSet
from sluice.broker.log.stray import (
    CLUSTER_ID_KEY,
    PARTITION_COLUMN_FAMILIES,
    assigned_partitions,
    delete_partition_keys,
    key_range,
    stored_partitions,
    stray_partitions,
)
from sluice.broker.topic_partition import TopicPartition
from sluice.errors import SluiceError
from sluice.metadata import documents, keys
from sluice.metadata.documents import BrokerDocument
from sluice.records import now_ms

log = logging.getLogger(__name__)


class LogManager:
    """The partitions' logs on this broker's one log directory (a RocksDB database)."""

    def __init__(self, storage: Storage, cluster: ClusterView, config: BrokerConfig) -> None:
        self.storage = storage
        self.cluster = cluster
        self.config = config
        self.partitions: dict[TopicPartition, PartitionLog] = {}
        # Stray partitions are looked for once the first full metadata read is done (main calls
        # delete_stray_partitions), then again after every topic change.
        self._stray_check_ready = False
        self._stray_check_due = False
        self._failure_reported = False
        self._cluster_mismatch_logged = False
        self._space = LowSpaceTracker(config.int("log.dir.free.space.warn.percent"))
        self._space_unreported: bool | None = None  # a low-space change not yet in the metadata
        # One thread compacts deleted key ranges; close() waits for it before storage closes.
        self._reclaimer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reclaim")

    @property
    def storage_failure(self) -> str | None:
        """Why the log directory is offline, or None while it works."""
        return self.storage.failure

    def check_storage(self) -> None:
        """Raise KAFKA_STORAGE_ERROR (retriable) while the log directory is offline."""
        failure = self.storage.failure
        if failure is not None:
            raise errors.KafkaStorageError(
                f"broker {self.config.broker_id}'s log directory is offline ({failure}); "
                "its partitions are served by other replicas"
            )

    def _config_lookup(self, topic: str) -> Callable[[str], object]:
        """A topic's effective settings, read when used (an alteration applies at once)."""

        def lookup(key: str) -> object:
            info = self.cluster.topics.get(topic)
            return self.config.topic_value(info.config if info else {}, key)

        return lookup

    def open(self, key: TopicPartition, topic_id: str) -> PartitionLog:
        """The log of ``key`` (created, or loaded from disk, on first use)."""
        part = self.partitions.get(key)
        if part is None:
            part = PartitionLog(self.storage, key[0], key[1], topic_id, self._config_lookup(key[0]))
            self.partitions[key] = part
        return part

    def topics_changed(self) -> None:
        """A topic changed in the metadata: look for stray partitions at the next round."""
        self._stray_check_due = True

    def delete(self, part: PartitionLog) -> None:
        """Delete a partition's data (its topic is gone or moved away) and give its space back.

        A failed delete (the disk is offline) is logged, not raised: the metadata already says the
        partition is not here, and the stray-partition check deletes the data once it can.
        """
        self.partitions.pop((part.topic, part.partition), None)
        try:
            part.delete_all()
        except SluiceError as exc:
            log.warning(
                "%s-%d: deleting its data failed (%s); it is deleted as a stray partition later",
                part.topic, part.partition, exc,
            )  # fmt: skip
            return
        self._reclaim([part.prefix])

    def check_log_dir_space(self) -> None:
        """Read the data volume's free space; record a change of "low" in this broker's document.

        Called every housekeeping round, offline or not (statvfs needs no RocksDB). See
        :mod:`sluice.broker.log.dir_space`; a failed metadata write is tried again next round.
        """
        try:
            reading = read_space(self.config.data_dir)
        except OSError as exc:
            log.warning("cannot read the free space of %s: %s", self.config.data_dir, exc)
            return
        change = self._space.observe(reading)
        if change is not None:
            self._space_unreported = change
            if change:
                log.warning(
                    "data volume low on space: %s (warning below %d%%: log.dir.free.space.warn.percent)",
                    reading.describe(),
                    self.config.int("log.dir.free.space.warn.percent"),
                )
            else:
                log.info("data volume has space again: %s", reading.describe())
        low = self._space_unreported
        if low is None:
            return

        def mark(current: BrokerDocument | None) -> BrokerDocument | None:
            if current is None:
                return None
            return dataclasses.replace(
                current,
                log_dir_low_space=low,
                log_dir_free_bytes=reading.free_bytes if low else -1,
                log_dir_size_bytes=reading.size_bytes if low else -1,
            )

        try:
            documents.update_document(self.cluster.store, keys.broker(self.config.broker_id), BrokerDocument, mark)
        except Exception:
            log.exception("recording the data volume's free space in the metadata failed; trying again")
            return
        self._space_unreported = None

    def report_storage_failure(self) -> bool:
        """Record the offline log directory in this broker's ``brokers/<id>`` document (the controller
        fences the broker on it). True once recorded; the housekeeping loop calls it again until then."""
        failure = self.storage.failure
        if failure is None or self._failure_reported:
            return self._failure_reported

        def mark(current: BrokerDocument | None) -> BrokerDocument | None:
            if current is None or current.log_dir_failure == failure:
                return None
            return dataclasses.replace(current, log_dir_failure=failure)

        try:
            documents.update_document(self.cluster.store, keys.broker(self.config.broker_id), BrokerDocument, mark)
        except Exception:
            log.exception("recording the offline log directory in the metadata failed; trying again")
            return False
        self._failure_reported = True
        return True

    def delete_stray_partitions(self) -> list[str]:
        """Delete every partition on disk the metadata does not assign to this broker (by topic id).

        Call once the cluster view holds the whole metadata (after the first full refresh):
        before that every partition would look stray. Returns the partitions deleted, described.
        """
        self._stray_check_ready = True
        self._stray_check_due = False
        if not self._same_cluster():
            return []
        assigned = assigned_partitions(self.cluster.topics.values(), self.config.broker_id)
        held = {part.prefix for part in self.partitions.values()}
        deleted: list[str] = []
        reclaim: list[bytes] = []
        for stray in stray_partitions(stored_partitions(self.storage), assigned):
            if stray.prefix in held:
                continue  # a partition still served: the topic listener drops it, not this scan
            try:
                delete_partition_keys(self.storage, stray.prefix)
            except SluiceError as exc:
                log.warning("stray partition %s: delete failed (%s); trying again later", stray.describe(), exc)
                self._stray_check_due = True
                continue
            log.info(
                "deleted stray partition %s: the metadata does not assign it to broker %d",
                stray.describe(),
                self.config.broker_id,
            )
            deleted.append(stray.describe())
            reclaim.append(stray.prefix)
        self._reclaim(reclaim)
        return deleted

    def _same_cluster(self) -> bool:
        """Whether this data directory belongs to the metadata's cluster (recorded on first use)."""
        current = self.cluster.cluster_id
        if not current:
            return False
        stored = self.storage.get("partition_meta", CLUSTER_ID_KEY)
        if stored is None:
            ws = WriteSet()
            ws.put("partition_meta", CLUSTER_ID_KEY, current.encode())
            self.storage.write(ws)
            return True
        if stored.decode() == current:
            return True
        if not self._cluster_mismatch_logged:
            log.error(
                "the data directory belongs to cluster %s but the metadata is cluster %s: stray partitions are "
                "NOT deleted (is --metadata the right store?)",
                stored.decode(),
                current,
            )
            self._cluster_mismatch_logged = True
        return False

    def delete_stray_partitions_if_due(self) -> list[str]:
        """:meth:`delete_stray_partitions` after a topic change (or a failed delete), once started."""
        if not (self._stray_check_ready and self._stray_check_due) or self.storage.failure is not None:
            return []
        return self.delete_stray_partitions()

    def _reclaim(self, prefixes: list[bytes]) -> None:
        """Compact deleted partitions' key ranges on the reclaim thread, so their bytes leave the disk."""
        if not prefixes:
            return

        def compact() -> None:
            for prefix in prefixes:
                start, end = key_range(prefix)
                for cf in PARTITION_COLUMN_FAMILIES:
                    try:
                        self.storage.compact(cf, start, end)
                    except Exception:
                        log.exception("compacting a deleted partition's keys failed")
                        return

        # shutting down (RuntimeError): RocksDB compacts the range tombstones in its own time
        with contextlib.suppress(RuntimeError):
            self._reclaimer.submit(compact)

    def close(self) -> None:
        """Wait for pending compactions of deleted partitions (before the storage closes)."""
        self._reclaimer.shutdown(wait=True)

    def checkpoint_high_watermarks(self) -> None:
        if self.storage.failure is not None:
            return  # offline: the restart starts from the last checkpoint, as after a crash
        for part in list(self.partitions.values()):
            try:
                part.checkpoint_high_watermark()
            except Exception:
                log.exception("high watermark checkpoint failed on %s-%d", part.topic, part.partition)

    async def expire_producers(self) -> int:
        """Forget idle producer states (producer.id.expiration.ms) on every replica; how many."""
        if self.storage.failure is not None:
            return 0
        now = now_ms()
        removed = 0
        for key, part in list(self.partitions.items()):
            await asyncio.sleep(0)  # one partition at a time: requests are served in between
            if self.partitions.get(key) is not part or self.storage.failure is not None:
                continue  # deleted meanwhile, or the directory went offline
            try:
                removed += part.remove_expired_producers(now)
            except Exception:
                log.exception("expiring producer states failed on %s-%d", *key)
        if removed:
            log.info("%d idle producer state(s) expired (producer.id.expiration.ms)", removed)
        return removed

    async def apply_retention(self) -> None:
        """Retention and compaction, on every replica (each cleans its own copy the same way)."""
        if self.storage.failure is not None:
            return
        now = now_ms()
        for key, part in list(self.partitions.items()):
            await asyncio.sleep(0)  # one partition at a time: requests are served in between
            if self.partitions.get(key) is not part or self.storage.failure is not None:
                continue  # deleted meanwhile, or the directory went offline
            policy = str(part.config("cleanup.policy")).split(",")
            try:
                if "compact" in policy:
                    dropped = part.compact(now)
                    if dropped:
                        log.info("compacted %s-%d: %d batch(es) dropped", key[0], key[1], dropped)
                if "delete" in policy and key[0] not in INTERNAL_TOPICS:
                    part.apply_retention(now)
            except Exception:
                log.exception("retention or compaction failed on %s-%d", *key)
