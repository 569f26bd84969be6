"""Collectors: what the metrics endpoint shows, read from the broker's state when Prometheus scrapes.

Each collector is a prometheus_client custom collector (``collect()`` yields
metric families) over one part of the broker: the replica manager, the two
coordinators, the storage, and the event counters of :mod:`.events`. Values
that are state (partition counts, offsets, lag, open transactions, disk space)
are computed here at scrape time from the structures the broker keeps anyway,
so the request paths pay nothing for them; only events are counted as they
happen. The scrape runs on the broker's asyncio loop (see :mod:`.http`), so the
structures read here never change under a collector.

Names follow what Strimzi's JMX exporter rules make of Kafka's MBeans
(``kafka.server<type=ReplicaManager, name=UnderReplicatedPartitions><>Value``
becomes ``kafka_server_replicamanager_underreplicatedpartitions``; a
``...PerSec`` meter's count becomes ``..._total``), and kafka-exporter's for
consumer groups (``kafka_consumergroup_lag``). What Kafka has no metric for is
named ``sluice_...``. docs/metrics.md lists every metric and its meaning.

Label cardinality is bounded by what the cluster has (topics, partitions,
request types, groups and their partitions): never a producer id or a
transactional id.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from sluice.broker.cluster import ClusterView
from sluice.broker.config import BrokerConfig
from sluice.broker.coordination import CoordinatorRuntime, LoadStatus
from sluice.broker.events import BrokerEvents, Histogram, TopicCounters
from sluice.broker.group import GroupCoordinator
from sluice.broker.log.storage import RocksStorage, Storage
from sluice.broker.metrics.lag import EndOffsets
from sluice.broker.replica_manager import ReplicaManager
from sluice.broker.topic_partition import TopicPartition
from sluice.broker.txn import TransactionCoordinator
from sluice.broker.txn.state import TxnState

log = logging.getLogger(__name__)

TP_LABELS = ["topic", "partition"]
# An open transaction: its records are written (or being ended) and hold back the LSO.
OPEN_STATES = frozenset(
    {TxnState.ONGOING, TxnState.PREPARED, TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT, TxnState.PREPARE_EPOCH_FENCE}
)


def _tp(tp: TopicPartition) -> list[str]:
    return [tp[0], str(tp[1])]


class _SafeCollector(Collector):
    """A collector whose failure costs its own metrics only, never the whole scrape."""

    def collect(self) -> Iterable[Metric]:
        try:
            families = list(self.families())
        except Exception:
            log.exception("metrics: %s failed; its metrics are left out of this scrape", type(self).__name__)
            return []
        return families

    def families(self) -> Iterator[Metric]:
        raise NotImplementedError


# -- the replica manager ------------------------------------------------------------------------


class ReplicaCollector(_SafeCollector):
    """Kafka's ReplicaManager gauges, per-partition offsets, and the offline-partition count."""

    def __init__(self, replicas: ReplicaManager, cluster: ClusterView, config: BrokerConfig) -> None:
        self.replicas = replicas
        self.cluster = cluster
        self.config = config

    def _reports_cluster_wide(self) -> bool:
        """Whether this broker reports cluster-wide counts: the live broker with the lowest id.

        Every broker sees the same metadata, so if all reported them a ``sum()`` across brokers
        would count each partition once per broker. In Kafka only the active controller reports
        OfflinePartitionsCount (the others say 0); Sluice's controller is the operator, so the
        lowest-numbered live broker stands in for it.
        """
        live = set(self.cluster.brokers) - self.cluster.dead_brokers
        return bool(live) and min(live) == self.config.broker_id

    def families(self) -> Iterator[Metric]:
        rm = self.replicas
        under_replicated = under_min_isr = at_min_isr = reassigning = 0
        leo = GaugeMetricFamily(
            "kafka_log_log_logendoffset",
            "The offset after the last batch of the partition's log on this replica",
            labels=TP_LABELS,
        )
        log_start = GaugeMetricFamily(
            "kafka_log_log_logstartoffset", "The first offset of the partition's log on this replica", labels=TP_LABELS
        )
        size = GaugeMetricFamily(
            "kafka_log_log_size", "Bytes of the partition's stored batches on this replica", labels=TP_LABELS
        )
        hw = GaugeMetricFamily(
            "sluice_log_high_watermark",
            "The partition's high watermark on this replica (on a follower, as the leader last told it)",
            labels=TP_LABELS,
        )
        lso = GaugeMetricFamily(
            "sluice_log_last_stable_offset",
            "The partition's last stable offset (leader only): read_committed consumers read up to here",
            labels=TP_LABELS,
        )
        lso_lag = GaugeMetricFamily(
            "kafka_cluster_partition_laststableoffsetlag",
            "High watermark minus last stable offset (leader only): records held back by open transactions",
            labels=TP_LABELS,
        )
        open_txns = GaugeMetricFamily(
            "sluice_log_open_transactions",
            "Transactions open on the partition (leader only): producers with records and no marker yet",
            labels=TP_LABELS,
        )
        part_under = GaugeMetricFamily(
            "kafka_cluster_partition_underreplicated",
            "1 if the partition (led here) has fewer in-sync replicas than replicas",
            labels=TP_LABELS,
        )
        for key, part in sorted(rm.partitions.items()):
            labels = _tp(key)
            leo.add_metric(labels, part.log_end_offset)
            log_start.add_metric(labels, part.log_start_offset)
            size.add_metric(labels, part.size_bytes)
            hw.add_metric(labels, part.high_watermark)
            if key not in rm.leader_of:
                continue
            stable = part.last_stable_offset
            lso.add_metric(labels, stable)
            lso_lag.add_metric(labels, max(part.high_watermark - stable, 0))
            open_txns.add_metric(labels, len(part.open_txns))
            info = self.cluster.topics.get(key[0])
            if info is None or key[1] >= len(info.partitions):
                continue
            pinfo = info.partitions[key[1]]
            isr = len(pinfo.isr)
            under = isr < len(pinfo.replicas)
            part_under.add_metric(labels, 1 if under else 0)
            under_replicated += under
            reassigning += pinfo.reassigning
            min_isr = int(str(part.config("min.insync.replicas")))
            under_min_isr += isr < min_isr
            at_min_isr += isr == min_isr
        yield leo
        yield log_start
        yield size
        yield hw
        yield lso
        yield lso_lag
        yield open_txns
        yield part_under
        yield GaugeMetricFamily(
            "kafka_server_replicamanager_partitioncount", "Partitions with a replica on this broker", len(rm.partitions)
        )
        yield GaugeMetricFamily(
            "kafka_server_replicamanager_leadercount", "Partitions this broker leads", len(rm.leader_of)
        )
        yield GaugeMetricFamily(
            "kafka_server_replicamanager_underreplicatedpartitions",
            "Partitions led by this broker whose ISR is smaller than their replica set",
            under_replicated,
        )
        yield GaugeMetricFamily(
            "kafka_server_replicamanager_underminisrpartitioncount",
            "Partitions led by this broker with fewer in-sync replicas than min.insync.replicas (acks=all fails)",
            under_min_isr,
        )
        yield GaugeMetricFamily(
            "kafka_server_replicamanager_atminisrpartitioncount",
            "Partitions led by this broker with exactly min.insync.replicas in-sync replicas",
            at_min_isr,
        )
        yield GaugeMetricFamily(
            "kafka_server_replicamanager_reassigningpartitions",
            "Partitions led by this broker with a reassignment in progress",
            reassigning,
        )
        # Reassignment traffic (Kafka's BrokerTopicMetrics ReassignmentBytesIn/OutPerSec): the bytes
        # the replication throttles charge, counted whether a throttle rate is set or not.
        yield CounterMetricFamily(
            "kafka_server_brokertopicmetrics_reassignmentbytesout",
            "Bytes this broker sent, as leader, to replicas a reassignment is adding",
            rm.reassignment_throttle.throttled_bytes,
        )
        yield CounterMetricFamily(
            "kafka_server_brokertopicmetrics_reassignmentbytesin",
            "Bytes this broker fetched for partitions a reassignment is adding it to",
            rm.fetchers.throttle.throttled_bytes,
        )
        rates = GaugeMetricFamily(
            "sluice_replication_throttle_rate_bytes",
            "Reassignment throttle rate in force (bytes/s; <= 0: off): a running rebalance's, else the configured one",
            labels=["side"],
        )
        rates.add_metric(["leader"], rm.reassignment_throttle.rate)
        rates.add_metric(["follower"], rm.fetchers.throttle.rate)
        yield rates
        offline = 0
        if self._reports_cluster_wide():
            for info in self.cluster.topics.values():
                offline += sum(1 for p in info.partitions if p.leader < 0)
        yield GaugeMetricFamily(
            "kafka_controller_kafkacontroller_offlinepartitionscount",
            "Partitions without a leader, cluster-wide; reported by the live broker with the lowest id, 0 elsewhere",
            offline,
        )


# -- the coordinators ---------------------------------------------------------------------------


def _runtime_families(name: str, runtimes: list[tuple[str, CoordinatorRuntime[Any]]]) -> Iterator[Metric]:
    status = GaugeMetricFamily(
        f"{name}_partitions",
        "Internal-topic partitions this broker coordinates, by load status (loading, active, failed)",
        labels=["coordinator", "status"],
    )
    load = GaugeMetricFamily(
        f"{name}_partition_load_seconds",
        "How long the last successful load (replay) of each coordinator partition led here took",
        labels=["coordinator", "partition"],
    )
    for coordinator, runtime in runtimes:
        counts = {s: 0 for s in (LoadStatus.LOADING, LoadStatus.ACTIVE, LoadStatus.FAILED)}
        for cpart in runtime.all_partitions():
            if cpart.status in counts:
                counts[cpart.status] += 1
            if cpart.load_ms is not None:
                load.add_metric([coordinator, str(cpart.partition)], cpart.load_ms / 1000)
        for s, n in counts.items():
            status.add_metric([coordinator, s.value], n)
    yield status
    yield load


class CoordinatorCollector(_SafeCollector):
    """The coordinator runtime of both coordinators: partitions by load status, load times."""

    def __init__(self, txn: TransactionCoordinator, groups: GroupCoordinator) -> None:
        self.txn = txn
        self.groups = groups

    def families(self) -> Iterator[Metric]:
        yield from _runtime_families(
            "sluice_coordinator", [("transaction", self.txn.runtime), ("group", self.groups.runtime)]
        )


class TransactionCollector(_SafeCollector):
    """The transactional ids this broker coordinates: by state, open ones, the oldest one's age."""

    def __init__(self, txn: TransactionCoordinator) -> None:
        self.txn = txn

    def families(self) -> Iterator[Metric]:
        by_state = {s: 0 for s in TxnState if s is not TxnState.DEAD}
        now = self.txn.clock()
        open_count = past_timeout = 0
        oldest_ms = 0
        for cpart in self.txn.runtime.active_partitions():
            for entry in cpart.state.txns.values():
                meta = entry.meta
                if meta is None or meta.state not in by_state:
                    continue
                by_state[meta.state] += 1
                if meta.state in OPEN_STATES and meta.txn_start_ms >= 0:
                    open_count += 1
                    age = max(now - meta.txn_start_ms, 0)
                    oldest_ms = max(oldest_ms, age)
                    # Prepared waits for its external coordinator: its timeout no longer applies.
                    if meta.state is not TxnState.PREPARED and age > meta.timeout_ms:
                        past_timeout += 1
        states = GaugeMetricFamily(
            "sluice_transaction_coordinator_transactional_ids",
            "Transactional ids this broker coordinates, by state (Kafka's state names)",
            labels=["state"],
        )
        for state, n in by_state.items():
            states.add_metric([state.value], n)
        yield states
        yield GaugeMetricFamily(
            "sluice_transaction_coordinator_open_transactions",
            "Transactions open on this coordinator (Ongoing, Prepared, or being ended)",
            open_count,
        )
        yield GaugeMetricFamily(
            "sluice_transaction_coordinator_oldest_open_transaction_age_seconds",
            "Age of the oldest open transaction on this coordinator (since its first AddPartitionsToTxn); 0 if none",
            oldest_ms / 1000,
        )
        yield GaugeMetricFamily(
            "sluice_transaction_coordinator_open_transactions_past_timeout",
            "Open transactions older than their transaction.timeout.ms (the timeout scan aborts them; "
            "Prepared ones are exempt and not counted)",
            past_timeout,
        )


class GroupCollector(_SafeCollector):
    """Groups, members, and consumer lag of the groups this broker coordinates (kafka-exporter's shape).

    Lag is the partition's end offset minus the group's committed offset. The end offset is the
    high watermark (what a read_uncommitted ``ListOffsets(latest)`` answers, as kafka-exporter
    uses): this broker's own when it leads the partition, otherwise the leader's answer fetched
    just before the scrape (:class:`~.lag.EndOffsets`). A partition whose end offset could not be
    learned (no leader, leader unreachable) has a current offset but no lag sample.
    """

    def __init__(self, groups: GroupCoordinator) -> None:
        self.groups = groups
        # refreshed before each scrape (BrokerMetrics.render), for the partitions the groups committed
        self.end_offsets = EndOffsets(groups.replicas, lambda: [tp for _g, tp, _o in self.committed()])

    def committed(self) -> Iterator[tuple[str, TopicPartition, int]]:
        """(group, partition, committed offset) of every group this broker coordinates."""
        for cpart in self.groups.runtime.active_partitions():
            for group_id, offsets in sorted(cpart.state.offsets.groups.items()):
                for tp, value in sorted(offsets.committed.items()):
                    yield group_id, tp, value.offset

    def families(self) -> Iterator[Metric]:
        members = GaugeMetricFamily(
            "kafka_consumergroup_members", "Members of the consumer group", labels=["consumergroup"]
        )
        group_count = member_count = 0
        for cpart in self.groups.runtime.active_partitions():
            for group_id, group in sorted(cpart.state.groups.items()):  # both kinds: KIP-848 and classic
                if group.is_empty:
                    continue
                group_count += 1
                member_count += len(group.members)
                members.add_metric([group_id], len(group.members))
        yield members
        yield GaugeMetricFamily(
            "sluice_group_coordinator_groups", "Consumer groups with members on this coordinator", group_count
        )
        yield GaugeMetricFamily(
            "sluice_group_coordinator_members", "Members of the consumer groups on this coordinator", member_count
        )
        labels = ["consumergroup", "topic", "partition"]
        current = GaugeMetricFamily(
            "kafka_consumergroup_current_offset", "The group's committed offset of the partition", labels=labels
        )
        lag = GaugeMetricFamily(
            "kafka_consumergroup_lag",
            "The partition's end offset (high watermark) minus the group's committed offset",
            labels=labels,
        )
        lag_sum = GaugeMetricFamily(
            "kafka_consumergroup_lag_sum", "The group's lag summed over the topic's partitions", labels=labels[:2]
        )
        sums: dict[tuple[str, str], int] = {}
        for group_id, tp, offset in self.committed():
            current.add_metric([group_id, *_tp(tp)], offset)
            end = self.end_offsets.get(tp)
            if end is None:
                continue
            value = end - offset
            lag.add_metric([group_id, *_tp(tp)], value)
            sums[(group_id, tp[0])] = sums.get((group_id, tp[0]), 0) + value
        for (group_id, topic), value in sorted(sums.items()):
            lag_sum.add_metric([group_id, topic], value)
        yield current
        yield lag
        yield lag_sum


# -- storage ------------------------------------------------------------------------------------

# (metric name, RocksDB property, per column family, help)
_ROCKSDB: tuple[tuple[str, str, bool, str], ...] = (
    ("sluice_rocksdb_sst_files_bytes", "rocksdb.total-sst-files-size", True, "Size of all SST files"),
    ("sluice_rocksdb_live_data_bytes", "rocksdb.estimate-live-data-size", True, "Estimated size of the live data"),
    ("sluice_rocksdb_memtable_bytes", "rocksdb.cur-size-all-mem-tables", True, "Size of the memtables"),
    (
        "sluice_rocksdb_pending_compaction_bytes",
        "rocksdb.estimate-pending-compaction-bytes",
        True,
        "Bytes compaction still has to rewrite (writes slow down, then stop, as it grows)",
    ),
    ("sluice_rocksdb_running_compactions", "rocksdb.num-running-compactions", False, "Compactions running now"),
    (
        "sluice_rocksdb_level0_files",
        "rocksdb.num-files-at-level0",
        True,
        "SST files in level 0 (all column families); writes slow down, then stop, as they pile up",
    ),
    (
        "sluice_rocksdb_write_stopped",
        "rocksdb.is-write-stopped",
        False,
        "1 while RocksDB stops writes (a write stall: appends block until compaction catches up)",
    ),
    (
        "sluice_rocksdb_delayed_write_rate_bytes",
        "rocksdb.actual-delayed-write-rate",
        False,
        "The rate writes are slowed to while RocksDB delays them (bytes/s); 0 when not delayed",
    ),
)


# "Cumulative stall: 00:00:1.234 H:M:S, 0.1 percent" in rocksdb.dbstats: time writes spent stalled
_CUMULATIVE_STALL = re.compile(r"Cumulative stall: (\d+):(\d+):([\d.]+) H:M:S")


# In rocksdb.cfstats (per column family): "Cumulative compaction: 1.23 GB write, ..." and
# "Write Stall (count): cf-l0-file-count-limit-delays-with-ongoing-compaction: 0, ..., memtable-limit-stops: 2, ..."
_CUMULATIVE_COMPACTION = re.compile(r"Cumulative compaction: ([\d.]+) GB write")
_WRITE_STALL_LINE = re.compile(r"Write Stall \(count\): (.*)")
_STALL_CAUSE = re.compile(r"([a-z0-9-]+): (\d+)")


def compaction_stats(cfstats: str) -> tuple[float, dict[str, int]] | None:
    """(bytes written by compactions, write stalls by cause) from one column family's ``rocksdb.cfstats``
    text; None when the text has neither line. RocksDB prints the bytes in GB with two decimals, so the
    figure moves in 10 MB steps. Causes are RocksDB's names (``memtable-limit-stops``,
    ``l0-file-count-limit-delays`` ...); the ``total-*`` sums are left out."""
    written = _CUMULATIVE_COMPACTION.search(cfstats)
    stalls = _WRITE_STALL_LINE.search(cfstats)
    if written is None or stalls is None:
        return None
    causes = {name: int(n) for name, n in _STALL_CAUSE.findall(stalls.group(1)) if not name.startswith("total-")}
    return float(written.group(1)) * 1e9, causes


def stall_seconds(dbstats: str) -> float | None:
    """The cumulative write-stall time in RocksDB's ``rocksdb.dbstats`` text, in seconds."""
    found = _CUMULATIVE_STALL.search(dbstats)
    if found is None:
        return None
    hours, minutes, seconds = found.groups()
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds)


class StorageCollector(_SafeCollector):
    """RocksDB's size and stall state, and the free space of the data volume."""

    def __init__(self, storage: Storage, data_dir: str) -> None:
        self.storage = storage
        self.data_dir = data_dir

    def _compaction_families(self) -> Iterator[Metric]:
        """Compaction bytes and write-stall counts per column family (write amplification, stalls)."""
        assert isinstance(self.storage, RocksStorage)
        written = CounterMetricFamily(
            "sluice_rocksdb_compaction_written_bytes",
            "Bytes written by RocksDB compactions since the broker started (10 MB steps)",
            labels=["column_family"],
        )
        stalls = CounterMetricFamily(
            "sluice_rocksdb_write_stalls",
            "Writes RocksDB delayed or stopped since the broker started, by cause (RocksDB's names: "
            "memtable-limit-stops, l0-file-count-limit-delays, pending-compaction-bytes-stops ...)",
            labels=["column_family", "cause"],
        )
        for cf, text in sorted(self.storage.cf_str_properties("rocksdb.cfstats").items()):
            parsed = compaction_stats(text)
            if parsed is None:
                continue
            written.add_metric([cf], parsed[0])
            for cause, n in sorted(parsed[1].items()):
                stalls.add_metric([cf, cause], n)
        yield written
        yield stalls

    def families(self) -> Iterator[Metric]:
        if isinstance(self.storage, RocksStorage):
            for name, prop, per_cf, doc in _ROCKSDB:
                value = self.storage.int_property(prop, per_column_family=per_cf)
                if value >= 0:
                    yield GaugeMetricFamily(name, doc, value)
            stalled = stall_seconds(self.storage.str_property("rocksdb.dbstats") or "")
            if stalled is not None:
                yield CounterMetricFamily(
                    "sluice_rocksdb_write_stall_seconds",
                    "Time writes spent stalled (delayed or stopped by RocksDB) since the broker started",
                    stalled,
                )
            yield from self._compaction_families()
        st = os.statvfs(self.data_dir)
        yield GaugeMetricFamily(
            "sluice_data_volume_free_bytes",
            "Free space on the data volume available to the broker",
            st.f_bavail * st.f_frsize,
        )
        yield GaugeMetricFamily("sluice_data_volume_size_bytes", "Size of the data volume", st.f_blocks * st.f_frsize)
        yield GaugeMetricFamily(
            "sluice_log_dir_offline",
            "1 while the log directory is offline after a storage error (a full disk); 0 while it works",
            0 if self.storage.failure is None else 1,
        )


# -- events -------------------------------------------------------------------------------------

# (Kafka's BrokerTopicMetrics meter, lowercased as Strimzi's rules name it, the counter, help)
_TOPIC_COUNTERS: tuple[tuple[str, Callable[[TopicCounters], int], str], ...] = (
    ("bytesin", lambda c: c.bytes_in, "Bytes of record batches appended by producers (leader only)"),
    ("messagesin", lambda c: c.messages_in, "Records appended by producers (leader only)"),
    ("bytesout", lambda c: c.bytes_out, "Bytes of record batches sent to consumers (replication excluded)"),
    ("totalproducerequests", lambda c: c.produce_requests, "Partition batches produced here (failed included)"),
    ("failedproducerequests", lambda c: c.failed_produce_requests, "Partition batches refused with an error"),
    ("totalfetchrequests", lambda c: c.fetch_requests, "Partitions in consumer fetches answered (failed included)"),
    ("failedfetchrequests", lambda c: c.failed_fetch_requests, "Partitions of consumer fetches answered with an error"),
)


def _histogram(name: str, doc: str, labels: list[str], series: Iterable[tuple[list[str], Histogram]]) -> Metric:
    family = HistogramMetricFamily(name, doc, labels=labels)
    for values, hist in series:
        family.add_metric(values, hist.cumulative(), hist.sum)
    return family


class EventsCollector(_SafeCollector):
    """The counters of :class:`~.events.BrokerEvents`, as prometheus_client metric families."""

    def __init__(self, events: BrokerEvents) -> None:
        self.events = events

    def families(self) -> Iterator[Metric]:
        ev = self.events
        for meter, read, doc in _TOPIC_COUNTERS:
            # As Kafka's JMX: one series per topic, and one without a topic label for all topics.
            family = CounterMetricFamily(f"kafka_server_brokertopicmetrics_{meter}", doc)
            family.add_sample(family.name + "_total", {}, float(read(ev.all_topics)))
            for topic, counters in sorted(ev.topics.items()):
                family.add_sample(family.name + "_total", {"topic": topic}, float(read(counters)))
            yield family
        requests = CounterMetricFamily(
            "kafka_network_requestmetrics_requests", "Requests answered, by request type (RPC)", labels=["request"]
        )
        for name, n in sorted(ev.requests.items()):
            requests.add_metric([name], n)
        yield requests
        errors = CounterMetricFamily(
            "kafka_network_requestmetrics_errors",
            "Requests that failed as a whole (a gRPC error; per-partition error codes are answers, not failures)",
            labels=["request"],
        )
        for name, n in sorted(ev.request_errors.items()):
            errors.add_metric([name], n)
        yield errors
        yield _histogram(
            "kafka_network_requestmetrics_totaltimems",
            "Time from receiving a request to answering it, in milliseconds, by request type "
            "(a Fetch's includes its long-poll wait)",
            ["request"],
            (([name], hist) for name, hist in sorted(ev.request_latency.items())),
        )
        streams = GaugeMetricFamily(
            "sluice_open_streams", "Streaming RPCs open on this broker, by method", labels=["stream"]
        )
        for name, n in sorted(ev.open_streams.items()):
            streams.add_metric([name], n)
        yield streams
        yield CounterMetricFamily(
            "kafka_server_replicamanager_isrshrinks", "ISR shrinks made by this broker as leader", ev.isr_shrinks
        )
        yield CounterMetricFamily(
            "kafka_server_replicamanager_isrexpands", "ISR expansions made by this broker as leader", ev.isr_expands
        )
        yield CounterMetricFamily(
            "sluice_transaction_coordinator_commits", "Transactions completed with a commit", ev.txn_commits
        )
        yield CounterMetricFamily(
            "sluice_transaction_coordinator_aborts",
            "Transactions completed with an abort (timeouts and fenced producers included)",
            ev.txn_aborts,
        )
        yield CounterMetricFamily(
            "sluice_transaction_coordinator_timeouts",
            "Transactions aborted because they were open longer than their timeout",
            ev.txn_timeouts,
        )
        yield _histogram(
            "sluice_transaction_coordinator_marker_send_seconds",
            "Time to write a transaction's COMMIT/ABORT markers to all of its partitions (replicated)",
            [],
            [([], ev.marker_latency)],
        )
        wakeups = CounterMetricFamily(
            "sluice_long_poll_wakeups",
            "Parked long polls woken by a change to one of their partitions (wait: replica_fetch, fetch): "
            "answered, or idle (nothing to answer, parked again)",
            labels=["wait", "result"],
        )
        for wait, (answered, idle) in sorted(ev.wakeups.items()):
            wakeups.add_metric([wait, "answered"], answered)
            wakeups.add_metric([wait, "idle"], idle)
        yield wakeups
        yield CounterMetricFamily(
            "sluice_group_coordinator_rebalances",
            "Group epoch bumps on this coordinator (each recomputes the group's target assignment)",
            ev.rebalances,
        )
