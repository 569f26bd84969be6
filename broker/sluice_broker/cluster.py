"""The broker's view of the cluster: brokers and topics, kept fresh from the MetadataStore.

Each broker polls the store for changes (a watch by revision) and tells its
listeners what changed; it also applies its own writes at once, so a client
that created a topic can use it on the next request. Documents are read and
written in their typed form (:mod:`sluice.metadata.documents`): the topics this
view holds are :class:`~sluice.metadata.documents.TopicDocument` values.

This module also holds the writes a broker makes to cluster metadata: its own
registration, topic creation and deletion (with replica placement while there
is no controller yet: see docs/architecture.md), topic config alterations
(Kafka's incremental operations, :mod:`sluice.broker.topic_config_ops`), the start and
cancellation of partition reassignments (:mod:`sluice.metadata.reassignment`: the controller
completes them), and producer-id blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import random
import re
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Sequence
from typing import ParamSpec, TypeVar

from sluice import errors
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.config import BrokerConfig, ConfigError, validate_topic_config
from sluice.broker.topic_config_ops import ConfigChange, apply_changes
from sluice.errors import SluiceError
from sluice.metadata import documents, keys, reassignment
from sluice.metadata.documents import CONSUMER_OFFSETS_TOPIC as CONSUMER_OFFSETS_TOPIC
from sluice.metadata.documents import (
    INTERNAL_TOPIC_CONFIG,
    NO_LEADER,
    BrokerDocument,
    ClusterDocument,
    ControllerDocument,
    IsrRequest,
    IsrRequestsDocument,
    PartitionState,
    ProducerIdBlock,
    ReplicationThrottleDocument,
    TopicDocument,
)
from sluice.metadata.documents import INTERNAL_TOPICS as INTERNAL_TOPICS
from sluice.metadata.documents import TRANSACTION_STATE_TOPIC as TRANSACTION_STATE_TOPIC
from sluice.metadata.isr import IsrChange, IsrOutcome, IsrWrite, apply_isr_changes
from sluice.metadata.placement import place_replicas
from sluice.metadata.reassignment import ReassignmentRefused
from sluice.metadata.store import Document, MetadataStore, StoreUnavailable, VersionConflict
from sluice.metadata.topic_view import (
    TopicView,
    delete_topic_state,
    fresh_documents,
    is_topic_key,
    update_partitions,
)
from sluice.records import now_ms

log = logging.getLogger(__name__)

# CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC and INTERNAL_TOPICS are defined once, in
# sluice.metadata.documents (the operator names them too); imported above "as" themselves so the
# broker's modules keep importing them from here.
PID_BLOCK_SIZE = 1000
_INTERNAL_TOPIC_KEYS = {TRANSACTION_STATE_TOPIC: "transaction.state.log", CONSUMER_OFFSETS_TOPIC: "offsets.topic"}
MAX_PARTITIONS = 10_000
ISR_WARNING_INTERVAL_S = 10.0  # ISR changes the store could not take: logged at most this often
ISR_WRITE_ATTEMPTS = 20  # compare-and-sets of one topic's ISR changes before leaving them to the next round
ISR_CONFLICT_PAUSE_S = 0.01  # after the n-th conflict, a random pause of up to n times this
# test-only (hook metadata.whole_documents): while this file is in the data directory at start, the
# broker registers without metadata_features, as a broker of code from before partition change records
WHOLE_DOCUMENTS_FILE = "whole-documents"
_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


_P = ParamSpec("_P")
_R = TypeVar("_R")
# Set in the worker thread of ClusterView.admin(): refresh() is the event loop's alone (it calls the
# listeners, which change the replica manager's state), so there it does nothing.
_ADMIN_THREAD = threading.local()


def _retriable_when_unreachable(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """An admin write the store cannot take now answers REQUEST_TIMED_OUT (retriable), as Kafka answers
    when its controller cannot be reached, rather than failing as an internal error. A timed-out write
    may have happened: the client's retry then finds it done (TOPIC_ALREADY_EXISTS ...), as in Kafka."""

    @functools.wraps(method)
    def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(*args, **kwargs)
        except StoreUnavailable as exc:
            raise errors.RequestTimedOutError(f"the cluster metadata cannot be reached now: {exc}") from None

    return call


def check_topic_name(name: str, *, allow_internal: bool = False) -> None:
    if not _TOPIC_NAME.match(name) or name in (".", ".."):
        raise errors.InvalidTopicError(
            f"invalid topic name {name!r}: use 1 to 249 of [a-zA-Z0-9._-], not '.' or '..'",
        )
    if name.startswith("__") and not allow_internal:
        raise errors.InvalidTopicError(f"topic names starting with '__' are reserved: {name!r}")


# The broker's names for the typed topic documents (the same classes, not copies).
PartitionInfo = PartitionState
TopicInfo = TopicDocument


TopicListener = Callable[[TopicInfo | None, TopicInfo | None], None]  # (old, new)


class ClusterView:
    def __init__(self, store: MetadataStore, config: BrokerConfig) -> None:
        self.store = store
        self.config = config
        self.cluster_id = ""
        self.topics: dict[str, TopicInfo] = {}
        self.brokers: dict[int, BrokerDocument] = {}
        self.listeners: list[TopicListener] = []
        self.dead_brokers: set[int] = set()  # as the controller's failure detector sees them
        # The controller takes leaders' ISR changes as requests (ControllerDocument.isr_requests)
        self.controller_takes_isr_requests = False
        # Partition states are written as change records (ControllerDocument.partition_changes)
        self.partition_changes = False
        self.declared_transactional_ids: set[str] = set()  # transactional_ids/<id> documents
        # A running rebalance's reassignment throttle (the replication_throttle document; None: the
        # brokers' configured rates), told to throttle_listeners as it changes.
        self.replication_throttle: int | None = None
        self.throttle_listeners: list[Callable[[int | None], None]] = []
        self._revision = 0
        self._isr_warned_at = -ISR_WARNING_INTERVAL_S
        # self.topics composed: declarations, folded states, partition change records (topic_view)
        self._topic_view = TopicView()
        self._pid_next = 0
        self._pid_end = -1  # inclusive end of the block this broker holds
        self._pid_prefetch: asyncio.Future[ProducerIdBlock] | None = None  # the next block, being claimed

    # -- start-up ---------------------------------------------------------------------------------

    def register(self) -> None:
        """Make sure the cluster document exists and register this broker's endpoint."""
        cluster = documents.update_document(
            self.store, keys.CLUSTER, ClusterDocument, lambda v: None if v else ClusterDocument(uuid.uuid4().hex)
        )
        assert cluster is not None
        self.cluster_id = cluster.cluster_id
        cfg = self.config
        features: tuple[str, ...] = documents.METADATA_FEATURE_NAMES
        if not cfg.get("metadata.partition.changes.enable"):
            features = ()  # registered as a broker of older code: the setting's comment in sluice.broker.config
        elif cfg.hook("metadata.whole_documents") and os.path.exists(os.path.join(cfg.data_dir, WHOLE_DOCUMENTS_FILE)):
            features = ()  # test-only: registered as a broker from before partition change records
        endpoint = BrokerDocument(
            cfg.broker_id,
            cfg.host,
            cfg.port,
            str(cfg.get("broker.rack")),
            now_ms(),
            inter_broker_port=cfg.inter_broker_port,
            records_formats=documents.RECORDS_FORMAT_NAMES,
            metadata_features=features,
        )
        documents.update_document(self.store, keys.broker(cfg.broker_id), BrokerDocument, lambda _v: endpoint)

    def ensure_internal_topics(self) -> list[str]:
        """Create the internal topics that are missing, each once enough brokers are alive.

        As in Kafka, an internal topic is never created with fewer replicas than its configured
        replication factor (``transaction.state.log.replication.factor``,
        ``offsets.topic.replication.factor``): a cluster whose third broker registers late must
        not keep coordinator partitions with two replicas for ever. Until then FindCoordinator
        answers COORDINATOR_NOT_AVAILABLE (retriable) and the broker calls this again on every
        metadata refresh. Returns the internal topics still missing (a message each).
        """
        waiting = []
        for name, key in _INTERNAL_TOPIC_KEYS.items():
            if name in self.topics or self.store.get(keys.topic(name)) is not None:
                continue
            wanted = self.config.int(f"{key}.replication.factor")
            if self._alive_brokers() < wanted:
                waiting.append(self.internal_topic_missing(name))
                continue
            try:
                self.create_topic(
                    name, self.config.int(f"{key}.num.partitions"), wanted, dict(INTERNAL_TOPIC_CONFIG), internal=True
                )
            except SluiceError as exc:
                if exc.code != pb.TOPIC_ALREADY_EXISTS:
                    raise
        return waiting

    def internal_topic_missing(self, name: str) -> str:
        """Why internal topic ``name`` does not exist yet: for logs and FindCoordinator's answer."""
        key = _INTERNAL_TOPIC_KEYS[name]
        wanted = self.config.int(f"{key}.replication.factor")
        return (
            f"{name} does not exist yet: it is created once {wanted} broker(s) are alive "
            f"({key}.replication.factor), and {self._alive_brokers()} are"
        )

    def kafka_v2_writable(self, topic: str, partition: int) -> bool:
        """Whether a Kafka client's batch may be stored as sent (RECORDS_FORMAT_KAFKA_V2) in this partition.

        Only while every replica of the partition (a reassignment's new ones included, live or not)
        registered with code that reads that encoding (BrokerDocument.records_formats): a broker from
        before records_format refuses such a batch as a follower (its CRC is Kafka's, not Sluice's),
        so the partition would stop replicating, and as a leader it would serve the records as Sluice's
        encoding. A replica with no document, or one written by older code, counts as old; a stopped
        broker counts as what it last registered as (the one being restarted in a rolling upgrade
        keeps the gate closed until it comes back with the new code). Otherwise the leader converts
        the batch into Sluice's encoding, as brokers did before records_format (docs/architecture.md,
        "Record formats across versions").
        """
        info = self.topics.get(topic)
        if info is None or not 0 <= partition < len(info.partitions):
            return False
        p = info.partitions[partition]
        me = self.config.broker_id
        for replica in {*p.replicas, *p.adding_replicas}:
            if replica == me:
                continue
            doc = self.brokers.get(replica)
            if doc is None or documents.RECORDS_FORMAT_KAFKA_V2_NAME not in doc.records_formats:
                return False
        return True

    def _alive_brokers(self) -> int:
        return len((set(self.brokers) | {self.config.broker_id}) - self.dead_brokers)  # this one is, registered or not

    # -- watching ---------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Apply every change since the last refresh; listeners hear about topic changes.

        On the event loop only: inside :meth:`admin`'s worker thread it does nothing (the loop
        refreshes once the action is done)."""
        if getattr(_ADMIN_THREAD, "active", False):
            return
        for doc in self.store.changes_since(self._revision):
            self._revision = max(self._revision, doc.revision)
            self._apply(doc)
        if self._topic_view.gap:  # the fold passed records this watch never delivered (a re-list)
            self._topics_changed(self._topic_view.load_states(self.store))

    def _topics_changed(self, names: set[str]) -> None:
        for name in sorted(names):
            old = self.topics.get(name)
            new = self._topic_view.topic(name)
            if new is None:
                self.topics.pop(name, None)
            else:
                self.topics[name] = new
            if old != new:
                for listener in self.listeners:
                    listener(old, new)

    def _apply(self, doc: Document, *, own: bool = False) -> None:
        """Apply one document from the metadata poll, or one this broker wrote or read itself (``own``)."""
        if doc.key.startswith(keys.BROKERS):
            broker_id = int(doc.key[len(keys.BROKERS) :])
            if doc.value is None:
                self.brokers.pop(broker_id, None)
            else:
                self.brokers[broker_id] = BrokerDocument.from_json(doc.value)
        elif is_topic_key(doc.key):
            # a document older than one applied already (this broker's own write) changes nothing
            self._topics_changed(self._topic_view.apply(doc, own=own))
        elif doc.key == keys.CLUSTER and doc.value:
            self.cluster_id = ClusterDocument.from_json(doc.value).cluster_id
        elif doc.key.startswith(keys.TRANSACTIONAL_IDS):
            txn_id = doc.key[len(keys.TRANSACTIONAL_IDS) :]
            if doc.value is None:
                self.declared_transactional_ids.discard(txn_id)
            else:
                self.declared_transactional_ids.add(txn_id)
        elif doc.key == keys.CONTROLLER:
            controller = ControllerDocument.from_json(doc.value or {})
            self.dead_brokers = set(controller.dead_brokers)
            self.controller_takes_isr_requests = controller.isr_requests
            self.partition_changes = controller.partition_changes
        elif doc.key == keys.REPLICATION_THROTTLE:
            rate = None if doc.value is None else ReplicationThrottleDocument.from_json(doc.value).rate
            if rate != self.replication_throttle:
                log.info("reassignment throttle: %s", "configured rates" if rate is None else f"{rate} bytes/s")
                self.replication_throttle = rate
                for on_throttle in self.throttle_listeners:
                    on_throttle(rate)

    def transactional_id_declared(self, txn_id: str) -> bool:
        """Whether a TransactionalId declares ``txn_id``: the watched set, else a fresh read.

        The fresh read closes the window between the operator declaring an id and
        this broker's watch delivering it, so a producer started right after its
        TransactionalId is Ready is never refused.
        """
        if txn_id in self.declared_transactional_ids:
            return True
        try:
            declared = self.store.get(keys.transactional_id(txn_id)) is not None
        except StoreUnavailable as exc:  # not known to be undeclared: retriable, never a refusal
            raise errors.CoordinatorNotAvailableError(f"cannot read TransactionalId declarations now: {exc}") from None
        if not declared:
            return False
        self.declared_transactional_ids.add(txn_id)
        return True

    def leaderships_to_hand_over(self, broker_id: int) -> list[str]:
        """Partitions ``broker_id`` leads that another in-sync replica could take over ("topic-p").

        What a broker in controlled shutdown waits on: a partition it leads
        alone has nobody to move to, so there is nothing to wait for.
        """
        return [
            f"{name}-{i}"
            for name, topic in sorted(self.topics.items())
            for i, p in enumerate(topic.partitions)
            if p.leader == broker_id and any(b != broker_id for b in p.isr)
        ]

    def isrs_to_leave(self, broker_id: int) -> list[str]:
        """Partitions that another live broker leads with ``broker_id`` in the ISR ("topic-p").

        What a broker in controlled shutdown waits on after its leaderships: until the controller
        fenced it out of those ISRs, each leader's acks=all writes would wait for it (as long as
        ``replica.lag.time.max.ms``, or the failure timeout), as Kafka's controlled shutdown returns
        only once the controller removed the broker from its ISRs.
        """
        dead = self.dead_brokers
        return [
            f"{name}-{i}"
            for name, topic in sorted(self.topics.items())
            for i, p in enumerate(topic.partitions)
            if p.leader not in (broker_id, NO_LEADER) and p.leader not in dead and broker_id in p.isr
        ]

    # -- topic administration ---------------------------------------------------------------------

    async def admin(self, action: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
        """Run a topic-admin ``action`` (create_topic, delete_topic, create_partitions,
        alter_topic_config) in a worker thread, then apply what it wrote to the view.

        Its store calls may block: an API server that does not answer holds each for its request
        timeout, and the broker's event loop must serve produce, fetch and replication meanwhile
        (docs/faults.md, "The control plane cut off"). The action reads the view (brokers for
        placement, topics for validation) but never refreshes it there: the listeners that a
        refresh calls change the replica manager's state, which is the loop's alone.
        """

        def run() -> _R:
            _ADMIN_THREAD.active = True
            try:
                return action(*args, **kwargs)
            finally:
                _ADMIN_THREAD.active = False

        try:
            return await asyncio.to_thread(run)
        finally:
            with contextlib.suppress(StoreUnavailable):  # cut off now: the metadata watch applies it later
                self.refresh()

    def _place(self, partitions: int, replication_factor: int, offset: int = 0) -> list[PartitionState]:
        """Replicas for new partitions (sluice.metadata.placement); the first replica leads at epoch 0.

        Placement is over every registered broker, alive or not: the controller
        moves leadership off a dead one, and its replicas catch up when it returns.
        """
        # list(): a copy taken at once, as admin() may run this in a worker thread while the loop refreshes
        registered = list(self.brokers.values())
        brokers = sorted((b.broker_id, b.rack) for b in registered) or [(self.config.broker_id, "")]
        try:
            layout = place_replicas(brokers, partitions, replication_factor, start_partition=offset)
        except ValueError as exc:
            raise errors.InvalidReplicationFactorError(str(exc)) from None
        return [PartitionState.initial(r) for r in layout]

    @_retriable_when_unreachable
    def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        config: dict[str, str],
        *,
        internal: bool = False,
        validate_only: bool = False,
    ) -> str:
        check_topic_name(name, allow_internal=internal)
        partitions = partitions or self.config.int("num.partitions")
        replication_factor = replication_factor or self.config.int("default.replication.factor")
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise errors.InvalidPartitionsError(f"partitions must be in [1, {MAX_PARTITIONS}], not {partitions}")
        if replication_factor < 1:
            raise errors.InvalidReplicationFactorError(f"replication factor must be >= 1, not {replication_factor}")
        try:
            clean = validate_topic_config(config)
        except ConfigError as exc:
            raise errors.InvalidConfigError(str(exc)) from None
        self.refresh()
        placement = self._place(partitions, replication_factor)
        topic_id = uuid.uuid4().hex
        if validate_only:
            if name in self.topics:
                raise errors.TopicAlreadyExistsError(f"topic {name!r} already exists")
            return topic_id
        # switched to records at once when the gate is open (else the controller switches it)
        value = TopicDocument(
            name, topic_id, internal, clean, replication_factor, placement, states_in_records=self.partition_changes
        )
        try:
            documents.create(self.store, keys.topic(name), value)
        except VersionConflict:
            raise errors.TopicAlreadyExistsError(f"topic {name!r} already exists") from None
        self.refresh()
        return topic_id

    @_retriable_when_unreachable
    def delete_topic(self, name: str) -> str:
        self.refresh()
        doc = documents.read(self.store, keys.topic(name), TopicDocument)
        if doc is None:
            raise errors.UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        if doc.value.internal:
            raise errors.InvalidTopicError(f"internal topic {name!r} cannot be deleted")
        try:
            self.store.delete(keys.topic(name), doc.version)
        except VersionConflict:
            raise errors.UnknownTopicOrPartitionError(f"topic {name!r} changed while deleting") from None
        delete_topic_state(self.store, name)
        self.refresh()
        return doc.value.topic_id

    @_retriable_when_unreachable
    def create_partitions(self, name: str, count: int, validate_only: bool = False) -> str:
        self.refresh()
        for _ in range(20):
            doc = documents.read(self.store, keys.topic(name), TopicDocument)
            if doc is None:
                raise errors.UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
            value = doc.value
            current = len(value.partitions)
            if value.internal:
                raise errors.InvalidTopicError(f"internal topic {name!r} cannot be changed")
            if count <= current:
                raise errors.InvalidPartitionsError(
                    f"topic {name!r} has {current} partitions; the new count {count} must be larger",
                )
            if count > MAX_PARTITIONS:
                raise errors.InvalidPartitionsError(f"at most {MAX_PARTITIONS} partitions")
            added = self._place(count - current, value.replication_factor, offset=current)
            if validate_only:
                return value.topic_id
            try:
                documents.replace(
                    self.store, keys.topic(name), value.with_partitions(value.partitions + added), doc.version
                )
            except VersionConflict:
                continue
            self.refresh()
            return value.topic_id
        raise errors.UnknownServerError(f"topic {name!r} kept changing; try again")

    @_retriable_when_unreachable
    def alter_partition_reassignments(
        self,
        targets: Sequence[tuple[str, int, Sequence[int] | None]],
        *,
        allow_replication_factor_change: bool = True,
    ) -> list[SluiceError | None]:
        """Start (target replicas) or cancel (None) reassignments; one refusal or None per target, in order.

        The partitions of one topic change in one compare-and-set of its document, retried on a
        concurrent change (an ISR update, the controller). Targets are checked against the
        registered brokers (:func:`sluice.metadata.reassignment.check_target`); what is refused
        does not keep the topic's other partitions from changing.
        """
        results: list[SluiceError | None] = [None] * len(targets)
        by_topic: dict[str, list[int]] = {}
        for i, (topic, _, _) in enumerate(targets):
            by_topic.setdefault(topic, []).append(i)
        registered = {b.broker_id for b in list(self.brokers.values())}
        dead = set(self.dead_brokers)
        for name, indexes in by_topic.items():

            def change(topic: TopicDocument, indexes: list[int] = indexes) -> TopicDocument:
                parts = list(topic.partitions)
                for i in indexes:
                    results[i] = self._reassign(
                        topic.name, parts, targets[i], registered, dead, allow_replication_factor_change
                    )
                return topic if parts == topic.partitions else topic.with_partitions(parts)

            try:
                updated = update_partitions(self.store, name, change, writer=f"broker-{self.config.broker_id}")
            except VersionConflict:
                for i in indexes:
                    results[i] = errors.UnknownServerError(f"topic {name!r} kept changing; try again")
                continue
            if updated is None:
                for i in indexes:
                    results[i] = errors.UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
                continue
            if updated.document is None:
                continue
            for i in indexes:
                if results[i] is None:
                    _, index, target = targets[i]
                    what = "cancelled" if target is None else f"started to {list(target)}"
                    log.info(
                        "%s-%d: reassignment %s, replicas now %s",
                        name,
                        index,
                        what,
                        updated.after.partitions[index].replicas,
                    )
        return results

    @staticmethod
    def _reassign(
        name: str,
        parts: list[PartitionState],
        target_of: tuple[str, int, Sequence[int] | None],
        registered: set[int],
        dead: set[int],
        allow_replication_factor_change: bool,
    ) -> SluiceError | None:
        """Start or cancel one partition's reassignment in ``parts``; the refusal, or None."""
        _, index, target = target_of
        if not 0 <= index < len(parts):
            return errors.UnknownTopicOrPartitionError(
                f"topic {name!r} has no partition {index} ({len(parts)} partitions)"
            )
        try:
            if target is None:
                parts[index] = reassignment.cancel(parts[index], dead)
                return None
            current = parts[index]
            reassignment.check_target(
                list(target),
                registered,
                len(reassignment.original_replicas(current)),
                allow_replication_factor_change=allow_replication_factor_change,
            )
            if list(target) == reassignment.original_replicas(current):
                # back to where it started (or there already): nothing to move
                if current.reassigning:
                    parts[index] = reassignment.cancel(current, dead)
            else:
                parts[index] = reassignment.start(current, list(target))
        except ReassignmentRefused as exc:
            return _reassignment_error(exc)
        return None

    @_retriable_when_unreachable
    def list_partition_reassignments(
        self, partitions: Sequence[tuple[str, int]] | None = None
    ) -> list[tuple[str, int, PartitionState]]:
        """The partitions being reassigned (among ``partitions``, or all), sorted.

        Read from the store, not the view: a client that started a move on one broker and asks
        another must not be told it is done because that broker's watch has not seen it yet.
        """
        wanted = None if partitions is None else set(partitions)
        out: list[tuple[str, int, PartitionState]] = []
        for name, topic in sorted(TopicView.load(self.store).topics().items()):
            for i, p in enumerate(topic.partitions):
                if p.reassigning and (wanted is None or (name, i) in wanted):
                    out.append((name, i, p))
        return out

    @_retriable_when_unreachable
    def alter_topic_config(
        self, name: str, changes: Sequence[ConfigChange], *, validate_only: bool = False
    ) -> dict[str, str]:
        """Apply Kafka's incremental config operations to a topic's overrides; returns the overrides after.

        The rules are :func:`sluice.broker.topic_config_ops.apply_changes`'s (all or
        nothing); the write is a compare-and-set on the topic document's version,
        retried on a concurrent change (an ISR update, another alteration), so a
        change is never lost or applied to a stale document. ``validate_only``
        checks everything and writes nothing. Internal topics are refused as
        CreatePartitions and DeleteTopics refuse them: the coordinators depend
        on their compaction and unlimited retention. Every broker reads topic
        settings from its metadata view at each use (the replica manager's
        per-topic lookup, the partition log, the controller), so the change
        applies on each broker at its next metadata refresh, without a restart.
        """
        self.refresh()
        for _ in range(20):
            doc = documents.read(self.store, keys.topic(name), TopicDocument)
            if doc is None:
                raise errors.UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
            value = doc.value
            if value.internal:
                raise errors.InvalidTopicError(f"internal topic {name!r} cannot be changed")
            overrides = apply_changes(value.config, changes, self._broker_value_text)
            if validate_only or overrides == value.config:
                return overrides
            try:
                documents.replace(
                    self.store, keys.topic(name), dataclasses.replace(value, config=overrides), doc.version
                )
            except VersionConflict:
                continue
            self.refresh()
            log.info("topic %s config overrides set to %s", name, overrides)
            return overrides
        raise errors.UnknownServerError(f"topic {name!r} kept changing; try again")

    def _broker_value_text(self, key: str) -> str:
        value = self.config.values[key]
        return str(value).lower() if isinstance(value, bool) else str(value)

    def write_isrs(self, topic: str, leader: int, changes: Sequence[IsrChange]) -> IsrWrite:
        """The ISR changes one leader makes to one topic, in one compare-and-set of its document.

        Each change applies only while ``leader`` still leads the partition at the change's leader
        epoch, and only if the partition's ISR in the store is still the one the leader decided from
        (``base``): a leader whose view is behind (the controller took a dead broker out of the ISR
        meanwhile) must not write its stale ISR back, so it learns the new one and decides again next
        round, as Kafka's AlterPartition is refused for a stale partition epoch. All of a leader's
        changes to a topic go in one write, not one write per partition: every write is the whole
        document, into etcd and to every watcher, and when a broker returns every leader re-admits it
        to dozens of partitions at once, all racing on the same documents (issue 28's measured
        conflict storm). A conflict reads the document again after a short random pause, so racing
        leaders spread out rather than collide again at once.

        Returns the document to apply (the one written, or the one read when nothing was written, so the
        view catches up with what refused a change) and each change's outcome. Raises StoreUnavailable
        when the store cannot be reached (a write may or may not have happened). Touches only the store,
        so it may run in a worker thread: a store call can block (an API server that does not answer),
        and the broker's event loop must not wait for it.
        """
        outcomes: dict[int, IsrOutcome] = {}

        def change(current: TopicDocument) -> TopicDocument:
            new, found = apply_isr_changes(current, leader, changes)
            outcomes.clear()
            outcomes.update(found)
            return new

        def pause(attempt: int) -> None:
            time.sleep(random.uniform(0, ISR_CONFLICT_PAUSE_S * (attempt + 1)))

        try:
            updated = update_partitions(
                self.store,
                topic,
                change,
                writer=f"broker-{self.config.broker_id}",
                attempts=ISR_WRITE_ATTEMPTS,
                pause=pause,
            )
        except StoreUnavailable as exc:
            # Unchanged in the store, so unchanged here: a leader keeps its ISR (and the HW rule it
            # implies) until the store takes the change; the caller tries again next round.
            now = time.monotonic()
            if now - self._isr_warned_at >= ISR_WARNING_INTERVAL_S:  # one line per interval, not per partition
                self._isr_warned_at = now
                log.warning("%s: ISR changes %s not written (nor others, for now): %s", topic, changes, exc)
            raise
        except VersionConflict:
            # Kept changing: the caller tries again next round, from the view this refreshes.
            return IsrWrite(None, {c.partition: IsrOutcome.CONFLICTS for c in changes})
        if updated is None:
            return IsrWrite(None, {c.partition: IsrOutcome.NO_PARTITION for c in changes})
        if updated.document is not None:
            return IsrWrite(updated.document, outcomes)
        # Nothing written (each change refused, or already so: an earlier attempt landed); a write
        # would send it to every watcher for nothing. Without records the document read is what
        # refused it, and the view takes it at once; with records, the view's next refresh has what did.
        return IsrWrite(updated.read, outcomes)

    def read_topic(self, name: str) -> list[Document]:
        """The documents that make topic ``name`` now, from fresh reads, for :meth:`isr_written` (a
        write whose outcome was unknown). Touches only the store (a worker thread)."""
        if self.partition_changes:
            return fresh_documents(self.store, name)
        found = self.store.get(keys.topic(name))
        return [] if found is None else [found]

    def request_isrs(self, requests: Sequence[IsrRequest]) -> None:
        """Ask the controller for ISR changes: replace this broker's ``isr_requests/<id>`` document with
        ``requests``, all it asks now (Kafka's AlterPartition). The controller writes what it takes
        into the topic documents, many leaders' changes in one write per topic, and this broker learns
        the outcome from its view (:meth:`ReplicaManager.maintain_isr`). Only this broker writes the
        document, so a conflict is only an earlier write of its own whose answer was lost. Raises
        StoreUnavailable when the store cannot be reached. Touches only the store (a worker thread)."""
        me = self.config.broker_id
        wanted = IsrRequestsDocument(me, list(requests), now_ms())

        def replace_all(current: IsrRequestsDocument | None) -> IsrRequestsDocument | None:
            if current is not None and current.requests == wanted.requests:
                return None  # asked already: no write
            return wanted

        documents.update_document(self.store, keys.isr_requests(me), IsrRequestsDocument, replace_all)

    def write_isr(self, topic: str, partition: int, leader: int, leader_epoch: int, isr: list[int]) -> Document | None:
        """One partition's ISR change from the ISR in the store now (no ``base`` check): the document
        written, or None when this leader may not change it. For tools and tests; brokers use
        :meth:`write_isrs`."""
        doc = documents.read(self.store, keys.topic(topic), TopicDocument)
        if doc is None or partition >= len(doc.value.partitions):
            return None
        base = tuple(doc.value.partitions[partition].isr)
        written = self.write_isrs(topic, leader, [IsrChange(partition, leader_epoch, base, tuple(isr))])
        return written.document if IsrOutcome.applied(written.outcomes.get(partition)) else None

    def isr_written(self, written: Document | Sequence[Document] | None) -> bool:
        """The view half of :meth:`write_isrs` (on the event loop): take the ISR written into the view at
        once, not at the next refresh, which the store may not answer now (an ISR grown in the store but
        not in memory would let the HW pass a replica the controller may already elect); then refresh.
        Also takes what :meth:`read_topic` read."""
        for doc in [written] if isinstance(written, Document) else written or ():
            self._apply(doc, own=True)
        with contextlib.suppress(StoreUnavailable):
            self.refresh()
        return written is not None

    # -- producer ids -----------------------------------------------------------------------------

    def next_producer_id(self) -> int:
        """A new producer id from this broker's block, claiming a new block when it runs out.

        Blocks of 1000 are claimed with a compare-and-set on one document, the
        way Kafka used ZooKeeper's /latest_producer_id_block, so two brokers
        never hand out the same id. Ids start at 1.

        As Kafka's ProducerIdManager does, the next block is claimed in the background (a worker
        thread: a store write may block) once 90% of the current one is handed out, so the event
        loop waits for the store only for the very first block, or when the store could not be
        written for all the time the last tenth lasted.
        """
        if self._pid_next > self._pid_end:
            prefetch = self._pid_prefetch
            if prefetch is not None and prefetch.done():
                self._pid_prefetch = None
            block = prefetch.result() if prefetch is not None and _claimed(prefetch) else self._claim_pid_block()
            self._pid_next, self._pid_end = block.block_start, block.block_end
        pid = self._pid_next
        self._pid_next += 1
        prefetch = self._pid_prefetch
        in_hand = prefetch is not None and (not prefetch.done() or _claimed(prefetch))
        if self._pid_end - self._pid_next < PID_BLOCK_SIZE // 10 and not in_hand:
            self._prefetch_pid_block()
        return pid

    def _claim_pid_block(self) -> ProducerIdBlock:
        def claim(last: ProducerIdBlock | None) -> ProducerIdBlock:
            end = 0 if last is None else last.block_end
            return ProducerIdBlock(self.config.broker_id, end + 1, end + PID_BLOCK_SIZE)

        block = documents.update_document(self.store, keys.PID_BLOCK, ProducerIdBlock, claim)
        assert block is not None
        log.info("claimed producer id block [%d, %d]", block.block_start, block.block_end)
        return block

    def _prefetch_pid_block(self) -> None:
        """Claim the next block in a worker thread (only on a running loop; a failure is claimed again later)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        future = loop.run_in_executor(None, self._claim_pid_block)
        future.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved: no "never retrieved" log
        self._pid_prefetch = future


def _claimed(prefetch: asyncio.Future[ProducerIdBlock]) -> bool:
    """Whether a background claim of a producer-id block finished with a block."""
    return prefetch.done() and not prefetch.cancelled() and prefetch.exception() is None


def coordinator_partition(key: str, partitions: int) -> int:
    """The internal-topic partition that coordinates a transactional id or group: crc32(key) % n."""
    return zlib.crc32(key.encode()) % partitions


def _reassignment_error(exc: ReassignmentRefused) -> SluiceError:
    """The :mod:`sluice.errors` class of a refused reassignment, by its Kafka error name."""
    if exc.error == reassignment.NO_REASSIGNMENT_IN_PROGRESS:
        return errors.NoReassignmentInProgressError(exc.message)
    if exc.error == reassignment.INVALID_REPLICATION_FACTOR:
        return errors.InvalidReplicationFactorError(exc.message)
    return errors.InvalidReplicaAssignmentError(exc.message)
