"""Typed metadata documents: one frozen dataclass per kind, with one encode and one decode each.

The MetadataStore (:mod:`sluice.metadata.store`) is a store of JSON objects:
that is what SQLite rows and ``MetadataDocument`` custom resources hold, and
it stays so, because existing data and the resources in a running cluster
must keep reading the same. The typing sits here, on top of it: every
component that reads or writes a document (the broker's cluster view, the
controller, the operator's handlers, LocalCluster) decodes it with
``Kind.from_json`` and writes it with ``doc.to_json()``, so the shape of each
document is written down once, below, instead of as ``dict[str, Any]``
lookups with their own defaults in every reader.

The JSON shapes, keyed as in :mod:`sluice.metadata.keys`:

``cluster``                 :class:`ClusterDocument`
``brokers/<id>``            :class:`BrokerDocument`
``topics/<name>``           :class:`TopicDocument` (partitions: :class:`PartitionState`)
``producer_id_block``       :class:`ProducerIdBlock`
``controller``              :class:`ControllerDocument`
``isr_requests/<id>``       :class:`IsrRequestsDocument` (requests: :class:`IsrRequest`)
``partition_changes/<seq>`` :class:`PartitionChangesDocument` (topics: :class:`TopicChanges`)
``topic_states/<name>``     :class:`TopicStateDocument`
``partition_changes_fold``  :class:`FoldDocument`
``replication_throttle``    :class:`ReplicationThrottleDocument`
``transactional_ids/<id>``  :class:`TransactionalIdDocument`

Decoding is lenient where readers always were (a missing optional field takes
its default) and strict where they were not (a topic without a name or
partitions is an error). Fields this version does not know are kept in
``extra`` and written back as they were, so a read-modify-write (a leader's
ISR change, the controller's election) never drops what a newer writer added.
Encoding writes every field, with the same names and JSON types as before, so
a document written by this version equals one written by the previous one.

Dataclasses rather than TypedDicts: the controller's decisions build new
documents from old ones (``dataclasses.replace``), equality is by value, and
defaults live in one place. Fields holding lists stay lists (not tuples): the
broker's hot paths use them as the lists they were.

The internal topics' names are defined here too, once, because the broker
(which creates them) and the operator (whose Coordinator resources declare
them) may not import each other.
"""

from __future__ import annotations

import builtins
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Protocol, Self, TypeVar

from sluice.metadata.store import MetadataStore, update

__all__ = [
    "CONSUMER_OFFSETS_TOPIC",
    "INTERNAL_TOPICS",
    "INTERNAL_TOPIC_CONFIG",
    "NO_LEADER",
    "TRANSACTION_STATE_TOPIC",
    "BrokerDocument",
    "ClusterDocument",
    "ControllerDocument",
    "FoldDocument",
    "IsrRequest",
    "IsrRequestsDocument",
    "PartitionChangesDocument",
    "PartitionState",
    "ProducerIdBlock",
    "ReplicationThrottleDocument",
    "TopicChanges",
    "TopicDocument",
    "TopicStateDocument",
    "TransactionalIdDocument",
    "Versioned",
    "create",
    "list_documents",
    "read",
    "replace",
    "update_document",
]

TRANSACTION_STATE_TOPIC = "__transaction_state"
CONSUMER_OFFSETS_TOPIC = "__consumer_offsets"
INTERNAL_TOPICS = (TRANSACTION_STATE_TOPIC, CONSUMER_OFFSETS_TOPIC)
# Both internal topics are compacted and kept forever: they hold the coordinators' state.
INTERNAL_TOPIC_CONFIG: Mapping[str, str] = {"cleanup.policy": "compact", "retention.ms": "-1"}
NO_LEADER = -1


def _ints(values: Any) -> list[int]:
    return list(map(int, values)) if values else []


_known_names: dict[int, frozenset[str]] = {}  # id of a FIELDS tuple (a class constant) -> its names as a set


def _extra(value: Mapping[str, Any], known: tuple[str, ...]) -> dict[str, Any]:
    """The fields of ``value`` a document class does not know (kept, and written back unchanged).

    Decoded for every partition of every topic (100,000 at a time at scale): the usual answer,
    none, is one set comparison."""
    names = _known_names.get(id(known))
    if names is None:
        names = _known_names[id(known)] = frozenset(known)
    if value.keys() <= names:
        return {}
    return {k: v for k, v in value.items() if k not in names}


# RecordBatch.records_format values by the name a broker document advertises them under
# (BrokerDocument.records_formats): "sluice" (RECORDS_FORMAT_SLUICE, every version), "kafka_v2"
# (RECORDS_FORMAT_KAFKA_V2, a Kafka client's v2 records section as sent; after d37a648).
RECORDS_FORMAT_SLUICE_NAME = "sluice"
RECORDS_FORMAT_KAFKA_V2_NAME = "kafka_v2"
RECORDS_FORMAT_NAMES = (RECORDS_FORMAT_SLUICE_NAME, RECORDS_FORMAT_KAFKA_V2_NAME)
# What a broker's code reads of the topics' metadata (BrokerDocument.metadata_features):
# "partition_changes", partition states as change records over the topic declarations.
METADATA_PARTITION_CHANGES = "partition_changes"
METADATA_FEATURE_NAMES = (METADATA_PARTITION_CHANGES,)


@dataclass(frozen=True)
class ClusterDocument:
    """``cluster``: the id every broker of the cluster reports, made by the first broker to start."""

    cluster_id: str
    extra: dict[str, Any] = field(default_factory=dict, repr=False)  # fields this version does not know

    FIELDS: ClassVar[tuple[str, ...]] = ("cluster_id",)

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Self:
        return cls(cluster_id=str(value["cluster_id"]), extra=_extra(value, cls.FIELDS))

    def to_json(self) -> dict[str, Any]:
        return {**self.extra, "cluster_id": self.cluster_id}


@dataclass(frozen=True)
class BrokerDocument:
    """``brokers/<id>``: a broker's endpoint, written by the broker itself at start (never removed).

    ``log_dir_failure`` is set by the broker when its log directory goes offline (a full disk):
    the controller fences such a broker as if it were dead. ``log_dir_low_space`` (with the free
    and total bytes when it last changed) is set while its data volume is nearly full: a warning
    only. A restart writes the document anew, without either.
    """

    broker_id: int
    host: str
    port: int
    rack: str = ""
    started_ms: int = 0
    log_dir_failure: str = ""
    log_dir_low_space: bool = False
    log_dir_free_bytes: int = -1
    log_dir_size_bytes: int = -1
    # The port of the broker's inter-broker listener (mutual TLS with the cluster CA, same host);
    # 0: the broker has none, so no other broker can replicate from it or send it markers.
    inter_broker_port: int = 0
    # What the broker's TLS files held when it last loaded them (sluice.broker.security.reload):
    # SHA-256 fingerprints of the CAs it trusts and of the certificate it presents. A CA rotation
    # (sluice.cert_rotation) moves on when every live broker reports the previous phase.
    tls_trusted: tuple[str, ...] = ()
    tls_certificate: str = ""
    # The CAs of its --clients-ca file (mtls listener only): a clients CA rotation waits for them.
    tls_clients_trusted: tuple[str, ...] = ()
    # The encodings of RecordBatch.records this broker's code reads, copies and serves
    # (RECORDS_FORMAT_NAMES). Empty (a document written by a broker from before records_format,
    # d37a648 and older): Sluice's only. A leader stores a Kafka client's batch as sent only while every
    # replica of the partition lists "kafka_v2" (sluice.broker.cluster.ClusterView.kafka_v2_writable).
    records_formats: tuple[str, ...] = ()
    # How this broker's code reads topics' partition states (METADATA_FEATURE_NAMES): "partition_changes"
    # (change records on top of the declarations, sluice.metadata.topic_view). Empty: whole topic
    # documents only. Partition states are written as records once every registered broker lists it.
    metadata_features: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict, repr=False)  # fields this version does not know

    FIELDS: ClassVar[tuple[str, ...]] = (
        "broker_id",
        "host",
        "port",
        "rack",
        "started_ms",
        "log_dir_failure",
        "log_dir_low_space",
        "log_dir_free_bytes",
        "log_dir_size_bytes",
        "inter_broker_port",
        "tls_trusted",
        "tls_certificate",
        "tls_clients_trusted",
        "records_formats",
        "metadata_features",
    )

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Self:
        return cls(
            broker_id=int(value["broker_id"]),
            host=str(value["host"]),
            port=int(value["port"]),
            rack=str(value.get("rack") or ""),
            started_ms=int(value.get("started_ms", 0)),
            log_dir_failure=str(value.get("log_dir_failure") or ""),
            log_dir_low_space=bool(value.get("log_dir_low_space", False)),
            log_dir_free_bytes=int(value.get("log_dir_free_bytes", -1)),
            log_dir_size_bytes=int(value.get("log_dir_size_bytes", -1)),
            inter_broker_port=int(value.get("inter_broker_port", 0)),
            tls_trusted=tuple(str(fp) for fp in value.get("tls_trusted") or ()),
            tls_certificate=str(value.get("tls_certificate") or ""),
            tls_clients_trusted=tuple(str(fp) for fp in value.get("tls_clients_trusted") or ()),
            records_formats=tuple(str(f) for f in value.get("records_formats") or ()),
            metadata_features=tuple(str(f) for f in value.get("metadata_features") or ()),
            extra=_extra(value, cls.FIELDS),
        )

    def to_json(self) -> dict[str, Any]:
        out = {
            **self.extra,
            "broker_id": self.broker_id,
            "host": self.host,
            "port": self.port,
            "rack": self.rack,
            "started_ms": self.started_ms,
            **({"log_dir_failure": self.log_dir_failure} if self.log_dir_failure else {}),
            **(self._low_space_json() if self.log_dir_low_space else {}),
        }
        if self.inter_broker_port:  # written only when there is one: older readers see what they knew
            out["inter_broker_port"] = self.inter_broker_port
        if self.tls_certificate:
            out["tls_trusted"] = list(self.tls_trusted)
            out["tls_certificate"] = self.tls_certificate
        if self.tls_clients_trusted:
            out["tls_clients_trusted"] = list(self.tls_clients_trusted)
        if self.records_formats:
            out["records_formats"] = list(self.records_formats)
        if self.metadata_features:
            out["metadata_features"] = list(self.metadata_features)
        return out

    def _low_space_json(self) -> dict[str, Any]:
        return {
            "log_dir_low_space": True,
            "log_dir_free_bytes": self.log_dir_free_bytes,
            "log_dir_size_bytes": self.log_dir_size_bytes,
        }

    @property
    def inter_broker_address(self) -> str | None:
        """``host:port`` of the inter-broker listener, or None when the broker has none."""
        if not self.inter_broker_port:
            return None
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.inter_broker_port}"

    @property
    def address(self) -> str:
        """``host:port`` as gRPC takes it (an IPv6 host in brackets)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class PartitionState:
    """One partition in a topic document: its replicas (preferred leader first), leader, epoch and ISR."""

    replicas: list[int]
    leader: int = NO_LEADER
    leader_epoch: int = 0
    isr: list[int] = field(default_factory=list)
    # A reassignment in progress (KIP-455, :mod:`sluice.metadata.reassignment`): ``replicas`` is then
    # the target followed by the replicas being removed; ``adding_replicas`` are the target's new
    # brokers (still catching up), ``removing_replicas`` the original ones not in the target. Both
    # empty: no reassignment. Written only when not empty, so other documents stay as they were.
    adding_replicas: list[int] = field(default_factory=list)
    removing_replicas: list[int] = field(default_factory=list)
    # ... and the replicas before it, in their order (a cancel restores the preferred leader)
    original_replicas: list[int] = field(default_factory=list)
    # Kafka's partition epoch: one more with every change of the partition's state, by whoever makes
    # it (:meth:`TopicDocument.with_partitions` counts it). An ISR request names the epoch its leader
    # decided from, and the controller refuses it once the partition moved on
    # (:mod:`sluice.metadata.isr`), so a request can never apply twice. Written only when above 0.
    # Not compared: two states equal but for it are the same state (a decision that changes nothing).
    partition_epoch: int = field(default=0, compare=False)
    extra: dict[str, Any] = field(default_factory=dict, repr=False)  # fields this version does not know

    FIELDS: ClassVar[tuple[str, ...]] = (
        "replicas",
        "leader",
        "leader_epoch",
        "isr",
        "adding_replicas",
        "removing_replicas",
        "original_replicas",
        "partition_epoch",
    )

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Self:
        get = value.get
        return cls(
            _ints(get("replicas")),
            int(get("leader", NO_LEADER)),
            int(get("leader_epoch", 0)),
            _ints(get("isr")),
            _ints(get("adding_replicas")),
            _ints(get("removing_replicas")),
            _ints(get("original_replicas")),
            int(get("partition_epoch", 0)),
            _extra(value, cls.FIELDS),
        )

    @property
    def reassigning(self) -> bool:
        """Whether a reassignment is in progress (some replica is being added or removed)."""
        return bool(self.adding_replicas or self.removing_replicas)

    @classmethod
    def initial(cls, replicas: list[int]) -> Self:
        """A new partition: the preferred replica leads at epoch 0, every replica in sync (its log is empty)."""
        return cls(replicas=list(replicas), leader=replicas[0], leader_epoch=0, isr=list(replicas))

    def to_json(self) -> dict[str, Any]:
        return {
            **self.extra,
            "replicas": list(self.replicas),
            "leader": self.leader,
            "leader_epoch": self.leader_epoch,
            "isr": list(self.isr),
            **({"adding_replicas": list(self.adding_replicas)} if self.adding_replicas else {}),
            **({"removing_replicas": list(self.removing_replicas)} if self.removing_replicas else {}),
            **({"original_replicas": list(self.original_replicas)} if self.original_replicas else {}),
            **({"partition_epoch": self.partition_epoch} if self.partition_epoch else {}),
        }


@dataclass(frozen=True)
class TopicDocument:
    """``topics/<name>``: a topic's id, config and partitions; the truth about leadership."""

    name: str
    topic_id: str
    internal: bool = False
    config: dict[str, str] = field(default_factory=dict)
    replication_factor: int = 1
    partitions: list[PartitionState] = field(default_factory=list)
    # The partitions' states change by partition change records (sluice.metadata.topic_view), not in
    # this document: its states are where the records start from. Set once, by the controller (or
    # the creator) once the gate is open, with compare-and-set, so a writer that read the document
    # before cannot write a state into it afterwards. Written only when set.
    states_in_records: bool = False
    extra: dict[str, Any] = field(default_factory=dict, repr=False)  # fields this version does not know

    FIELDS: ClassVar[tuple[str, ...]] = (
        "name",
        "topic_id",
        "internal",
        "config",
        "replication_factor",
        "partitions",
        "states_in_records",
    )

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Self:
        return cls(
            name=str(value["name"]),
            topic_id=str(value["topic_id"]),
            internal=bool(value.get("internal", False)),
            config={str(k): str(v) for k, v in (value.get("config") or {}).items()},
            replication_factor=int(value.get("replication_factor", 1)),
            partitions=[PartitionState.from_json(p) for p in value["partitions"]],
            states_in_records=bool(value.get("states_in_records", False)),
            extra=_extra(value, cls.FIELDS),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            **self.extra,
            "name": self.name,
            "topic_id": self.topic_id,
            "internal": self.internal,
            "config": dict(self.config),
            "replication_factor": self.replication_factor,
            "partitions": [p.to_json() for p in self.partitions],
            **({"states_in_records": True} if self.states_in_records else {}),
        }

    def with_partitions(self, partitions: list[PartitionState]) -> TopicDocument:
        """This topic with ``partitions``; each that differs from the one at its index here gets the
        next partition epoch (new ones keep theirs), so every writer counts its changes the same way."""
        counted = list(partitions)
        for i, (old, new) in enumerate(zip(self.partitions, partitions, strict=False)):
            if new is not old and new != old and new.partition_epoch <= old.partition_epoch:
                counted[i] = dataclasses.replace(new, partition_epoch=old.partition_epoch + 1)
        return dataclasses.replace(self, partitions=counted)

    def with_partition(self, index: int, partition: PartitionState) -> TopicDocument:
        parts = list(self.partitions)
        parts[index] = partition
        return self.with_partitions(parts)


@dataclass(frozen=True)
class TopicChanges:
    """The new states of some partitions of one topic (by index), in a :class:`PartitionChangesDocument`."""

    topic: str
    topic_id: str
    partitions: dict[int, PartitionState]

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Self:
        return cls(
            topic=str(value["topic"]),
            topic_id=str(value["topic_id"]),
            partitions={int(i): PartitionState.from_json(p) for i, p in (value.get("partitions") or {}).items()},
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "topic_id": self.topic_id,
            "partitions": {str(i): p.to_json() for i, p in sorted(self.partitions.items())},
        }


@dataclass(frozen=True)
class PartitionChangesDocument:
    """``partition_changes/<seq>``: one writer's changes of partition states, number ``seq`` of one sequence.

    Kafka's PartitionChangeRecord, a whole decision at a time (a failover's elections and ISR
    fencing over every topic are one document). Each partition's new state is whole, so the last
    record naming a partition holds its state; ``seq`` orders every writer (the document is created
    at the next number with compare-and-set, so a writer that loses the race learns what it missed
    and decides again). :mod:`sluice.metadata.topic_view` composes them with the declarations.
    """

    seq: int
    topics: list[TopicChanges]
    writer: str = ""
    updated_ms: int = 0
    extra: dict[str, Any] = field(default_factory=dict, repr=False)  # fields this version does not know

    FIELDS: ClassVar[tuple[str, ...]] = ("seq", "topics", "writer", "updated_ms")

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Self:
        return cls(
            seq=int(value["seq"]),
            topics=[TopicChanges.from_json(t) for t in value["topics"]],
            writer=str(value.get("writer", "")),
            updated_ms=int(value.get("updated_ms", 0)),
            extra=_extra(value, cls.FIELDS),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            **self.extra,
            "seq": self.seq,
            "topics": [t.to_json() for t in self.topics],
            "writer": self.writer,
            "updated_ms": self.updated_ms,
        }


@dataclass(frozen=True)
class TopicStateDocument:
    """``topic_states/<name>``: a topic's partition states with every change record up to ``seq`` folded in.

    Written by the controller's fold, read at start and after a gap, never watched (the Kubernetes
    store's watch leaves the family out): a fold writes many of them and changes no state.
    """

    name: str
    topic_id: str
    seq: int
    partitions: list[PartitionState]
    extra: dict[str, Any] = field(default_factory=dict, repr=False)  # fields this version does not know

    FIELDS: ClassVar[tuple[str, ...]] = ("name", "topic_id", "seq", "partitions")

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Self:
        return cls(
            name=str(value["name"]),
            topic_id=str(value["topic_id"]),
            seq=int(value["seq"]),
            partitions=[PartitionState.from_json(p) for p in value["partitions"]],
            extra=_extra(value, cls.FIELDS),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            **self.extra,
            "name": self.name,
            "topic_id": self.topic_id,
            "seq": self.seq,
            "partitions": [p.to_json() for p in self.partitions],
        }


@dataclass(frozen=True)
class FoldDocument:
    """``partition_changes_fold``: every change record up to ``seq`` is folded into ``topic_states/``.

    Records up to ``seq`` may be deleted once this is written; a record numbered ``seq`` or less
    that appears later (a writer far behind re-creating a deleted number) is never applied.
    """

    seq: int
    updated_ms: int = 0
    extra: dict[str, Any] = field(default_factory=dict, repr=False)  # fields this version does not know

    FIELDS: ClassVar[tuple[str, ...]] = ("seq", "updated_ms")

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Self:
        return cls(seq=int(value["seq"]), updated_ms=int(value.get("updated_ms", 0)), extra=_extra(value, cls.FIELDS))

    def to_json(self) -> dict[str, Any]:
        return {**self.extra, "seq": self.seq, "updated_ms": self.updated_ms}


@dataclass(frozen=True)
class ProducerIdBlock:
    """``producer_id_block``: the last block of producer ids handed out (Kafka's /latest_producer_id_block)."""

    broker_id: int
    block_start: int
    block_end: int  # inclusive
    extra: dict[str, Any] = field(default_factory=dict, repr=False)  # fields this version does not know

    FIELDS: ClassVar[tuple[str, ...]] = ("broker_id", "block_start", "block_end")

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Self:
        return cls(
            broker_id=int(value["broker_id"]),
            block_start=int(value["block_start"]),
            block_end=int(value["block_end"]),
            extra=_extra(value, cls.FIELDS),
        )

    def to_json(self) -> dict[str, Any]:
        return {**self.extra, "broker_id": self.broker_id, "block_start": self.block_start, "block_end": self.block_end}


@dataclass(frozen=True)
class ControllerDocument:
    """``controller``: the controller's epoch and its view of broker liveness.

    Leaders read ``dead_brokers`` and never re-admit a dead broker to an ISR (as
    in KIP-841). ``controller_id`` is -1 for the embedded cluster's controller,
    which is not a broker.
    """

    controller_id: int = -1
    epoch: int = 0
    live_brokers: list[int] = field(default_factory=list)
    dead_brokers: list[int] = field(default_factory=list)
    updated_ms: int = 0
    # This controller takes leaders' ISR changes as requests (``isr_requests/<broker>``, Kafka's
    # AlterPartition) and writes them itself; False (a controller from before): leaders write them.
    isr_requests: bool = False
    # Partition states are written as change records (``partition_changes/<seq>``,
    # sluice.metadata.topic_view), not into the topic documents: set by the controller once every
    # registered broker reads them (BrokerDocument.metadata_features), and never cleared.
    partition_changes: bool = False
    extra: dict[str, Any] = field(default_factory=dict, repr=False)  # fields this version does not know

    FIELDS: ClassVar[tuple[str, ...]] = (
        "controller_id",
        "epoch",
        "live_brokers",
        "dead_brokers",
        "updated_ms",
        "isr_requests",
        "partition_changes",
    )

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Self:
        return cls(
            controller_id=int(value.get("controller_id", -1)),
            epoch=int(value.get("epoch", 0)),
            live_brokers=_ints(value.get("live_brokers")),
            dead_brokers=_ints(value.get("dead_brokers")),
            updated_ms=int(value.get("updated_ms", 0)),
            isr_requests=bool(value.get("isr_requests", False)),
            partition_changes=bool(value.get("partition_changes", False)),
            extra=_extra(value, cls.FIELDS),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            **self.extra,
            "controller_id": self.controller_id,
            "epoch": self.epoch,
            "live_brokers": list(self.live_brokers),
            "dead_brokers": list(self.dead_brokers),
            "updated_ms": self.updated_ms,
            **({"isr_requests": True} if self.isr_requests else {}),
            **({"partition_changes": True} if self.partition_changes else {}),
        }


@dataclass(frozen=True)
class IsrRequest:
    """One ISR change a leader asks of the controller: ``isr`` for ``topic``-``partition``, decided
    from ``base`` while it led at ``leader_epoch`` and the partition was at ``partition_epoch``."""

    topic: str
    topic_id: str
    partition: int
    leader_epoch: int
    partition_epoch: int
    base: list[int]
    isr: list[int]

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Self:
        return cls(
            topic=str(value["topic"]),
            topic_id=str(value.get("topic_id", "")),
            partition=int(value["partition"]),
            leader_epoch=int(value["leader_epoch"]),
            partition_epoch=int(value.get("partition_epoch", 0)),
            base=_ints(value.get("base")),
            isr=_ints(value.get("isr")),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "topic_id": self.topic_id,
            "partition": self.partition,
            "leader_epoch": self.leader_epoch,
            "partition_epoch": self.partition_epoch,
            "base": list(self.base),
            "isr": list(self.isr),
        }


@dataclass(frozen=True)
class IsrRequestsDocument:
    """``isr_requests/<broker>``: the ISR changes a leader waits for the controller to make (Kafka's
    AlterPartition requests), written by that broker alone, each time with all it still asks; the
    controller writes the changes it accepts into the topic documents, many leaders' in one write."""

    broker_id: int
    requests: list[IsrRequest] = field(default_factory=list)
    updated_ms: int = 0
    extra: dict[str, Any] = field(default_factory=dict, repr=False)  # fields this version does not know

    FIELDS: ClassVar[tuple[str, ...]] = ("broker_id", "requests", "updated_ms")

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Self:
        return cls(
            broker_id=int(value["broker_id"]),
            requests=[IsrRequest.from_json(r) for r in value.get("requests") or ()],
            updated_ms=int(value.get("updated_ms", 0)),
            extra=_extra(value, cls.FIELDS),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            **self.extra,
            "broker_id": self.broker_id,
            "requests": [r.to_json() for r in self.requests],
            "updated_ms": self.updated_ms,
        }


@dataclass(frozen=True)
class ReplicationThrottleDocument:
    """``replication_throttle``: a cluster-wide reassignment throttle in force while a rebalance runs.

    What ``kafka-reassign-partitions --throttle`` does with dynamic broker configs: the operator
    writes it when a SluiceRebalance with ``spec.throttleBytesPerSecond`` starts moving and removes
    it when that rebalance is Ready, Stopped or deleted (``resource`` names it, so one rebalance
    never removes another's). While it exists every broker's leader and follower reassignment
    throttles use ``rate`` (bytes/s) instead of their ``leader/follower.replication.throttled.rate``.
    """

    rate: int
    resource: str = ""
    updated_ms: int = 0
    extra: dict[str, Any] = field(default_factory=dict, repr=False)  # fields this version does not know

    FIELDS: ClassVar[tuple[str, ...]] = ("rate", "resource", "updated_ms")

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Self:
        return cls(
            rate=int(value["rate"]),
            resource=str(value.get("resource", "")),
            updated_ms=int(value.get("updated_ms", 0)),
            extra=_extra(value, cls.FIELDS),
        )

    def to_json(self) -> dict[str, Any]:
        return {**self.extra, "rate": self.rate, "resource": self.resource, "updated_ms": self.updated_ms}


@dataclass(frozen=True)
class TransactionalIdDocument:
    """``transactional_ids/<id>``: a declared transactional id and the resource (``namespace/name``) declaring it.

    ``allowed_principals``: the resource's ``allowedUsers``/``allowedServiceAccounts`` as principals
    (``User:alice``, ``ServiceAccount:ns:name``; :func:`sluice.acls.transactional_id_principals`).
    When not empty, a broker with the authorizer on lets only these principals (and super users)
    use the id, and lets them without an ACL on it. Written only when not empty, so documents of
    resources without the fields stay as they were.
    """

    transactional_id: str
    resource: str = ""
    allowed_principals: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict, repr=False)  # fields this version does not know

    FIELDS: ClassVar[tuple[str, ...]] = ("transactional_id", "resource", "allowed_principals")

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Self:
        return cls(
            transactional_id=str(value["transactional_id"]),
            resource=str(value.get("resource", "")),
            allowed_principals=[str(p) for p in value.get("allowed_principals") or []],
            extra=_extra(value, cls.FIELDS),
        )

    def to_json(self) -> dict[str, Any]:
        out = {**self.extra, "transactional_id": self.transactional_id, "resource": self.resource}
        if self.allowed_principals:
            out["allowed_principals"] = list(self.allowed_principals)
        return out


# -- typed access to the store ------------------------------------------------------------------------


class _Codec(Protocol):
    """What every document class above has: one decode and one encode."""

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Self: ...

    def to_json(self) -> dict[str, Any]: ...


D = TypeVar("D", bound=_Codec)


@dataclass(frozen=True)
class Versioned(Generic[D]):
    """A decoded document with the version its next compare-and-set must name."""

    key: str
    value: D
    version: int
    revision: int


def read(store: MetadataStore, key: str, kind: type[D]) -> Versioned[D] | None:
    """The document at ``key`` decoded as ``kind``, None when there is none."""
    doc = store.get(key)
    if doc is None or doc.value is None:
        return None
    return Versioned(doc.key, kind.from_json(doc.value), doc.version, doc.revision)


def list_documents(store: MetadataStore, prefix: str, kind: type[D]) -> builtins.list[Versioned[D]]:
    """Every document under ``prefix`` decoded as ``kind``, in key order."""
    return [
        Versioned(doc.key, kind.from_json(doc.value), doc.version, doc.revision)
        for doc in store.list(prefix)
        if doc.value is not None
    ]


def create(store: MetadataStore, key: str, value: _Codec) -> int:
    """Write a new document; raises VersionConflict when one exists. Returns its version."""
    return store.compare_and_set(key, value.to_json(), None).version


def replace(store: MetadataStore, key: str, value: _Codec, version: int) -> int:
    """Replace the document at ``version``; raises VersionConflict when it moved on. Returns the new version."""
    return store.compare_and_set(key, value.to_json(), version).version


def update_document(
    store: MetadataStore,
    key: str,
    kind: type[D],
    change: Callable[[D | None], D | None],
    attempts: int = 50,
) -> D | None:
    """Typed read-modify-write with retries on conflict (:func:`sluice.metadata.store.update`).

    ``change`` gets the current document (None: there is none) and returns the
    new one, or None to leave it as it is. Returns the document as stored
    afterwards (None when there is none).
    """

    def change_json(value: dict[str, Any] | None) -> dict[str, Any] | None:
        new = change(None if value is None else kind.from_json(value))
        return None if new is None else new.to_json()

    doc = update(store, key, change_json, attempts)
    return None if doc is None or doc.value is None else kind.from_json(doc.value)
