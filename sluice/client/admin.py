"""The Sluice admin client: topics, transactions and group offsets, one RPC each.

Thin on purpose: every method is one request (to any broker, to each broker,
or to the coordinator of a key), retried while the error is retriable and
the broker answers, and the per-item error code raised as its
:mod:`sluice.errors` class (``TopicAlreadyExistsError``,
``InvalidTopicError``, ``TransactionalIdNotFoundError`` ...). Results are
frozen dataclasses named as in Kafka's admin API.

Two differences from the retry rule elsewhere, because an admin call
answers a question about *now*: UNKNOWN_TOPIC_OR_PARTITION (retriable for
producers, since a new topic takes a moment to appear) is raised at once by
``describe_topic`` and ``delete_topic``.

``list_offsets`` (Kafka's Admin.listOffsets) goes to each partition's leader
rather than to any broker, through the consumer's ListOffsets path, and
retries OFFSET_NOT_AVAILABLE like every retriable error: a leader just elected
answers it to ``LATEST`` until its high watermark covers what the previous
leader may have exposed (KIP-207), so an end offset read here never goes back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Protocol, TypeVar

from sluice import errors
from sluice.acls import AclBinding, AclBindingFilter, AclOperation, AclPermissionType, ResourcePatternType, ResourceType
from sluice.api.v1 import broker_pb2, records_pb2
from sluice.client._network import (
    COORDINATOR_MOVED_CODES,
    GROUP,
    TRANSACTION,
    Backoff,
    Cluster,
    Deadline,
    Rpc,
    first_error,
    response_error,
)
from sluice.client._network import rpc as rpcs
from sluice.client._network.leaders import Answer, call_leaders
from sluice.client._network.security import ClientSecurity
from sluice.client.consumer.fetcher import list_offsets_at
from sluice.client.quotas import ClientQuotaAlteration, ClientQuotaEntity, ClientQuotaFilter
from sluice.client.types import PreparedTransaction, TopicPartition

RequestT = TypeVar("RequestT")
ResponseT = TypeVar("ResponseT")


@dataclass(frozen=True, slots=True)
class PartitionDescription:
    partition: int
    leader: int  # broker id, -1 without a leader
    replicas: list[int]
    isr: list[int]
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class TopicDescription:
    name: str
    topic_id: str
    partitions: list[PartitionDescription]
    config: dict[str, str] = field(default_factory=dict)
    internal: bool = False
    replication_factor: int = 0


@dataclass(frozen=True, slots=True)
class TransactionDescription:
    """A transactional id as its coordinator sees it (mirrors TransactionState in broker.proto)."""

    transactional_id: str
    # Empty, Ongoing, PrepareCommit, PrepareAbort, CompleteCommit, CompleteAbort, PrepareEpochFence, Dead, Prepared
    state: str
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    transaction_start_time_ms: int  # -1 when no transaction is open
    partitions: list[TopicPartition]
    coordinator_id: int
    last_update_time_ms: int


@dataclass(frozen=True, slots=True)
class PartitionReassignment:
    """A reassignment in progress (Kafka's ``PartitionReassignment``).

    ``replicas``: the partition's replicas now, the target first, then the replicas being
    removed; ``adding_replicas`` are catching up, ``removing_replicas`` go when they have.
    """

    replicas: list[int]
    adding_replicas: list[int]
    removing_replicas: list[int]

    @property
    def target(self) -> list[int]:
        return [b for b in self.replicas if b not in self.removing_replicas]


@dataclass(frozen=True, slots=True)
class LogDirDescription:
    """One broker's log directory (Kafka's ``LogDirDescription``) and the size of each replica it holds.

    ``error`` is the broker's refusal (ClusterAuthorizationFailedError, KafkaStorageError for a
    failed directory), with no partitions then. Sizes are bytes of the stored batches.
    """

    broker_id: int
    path: str
    total_bytes: int  # -1: unknown
    usable_bytes: int  # -1: unknown
    replica_sizes: dict[TopicPartition, int] = field(default_factory=dict)
    error: errors.SluiceError | None = None


@dataclass(frozen=True, slots=True)
class ListedTransaction:
    transactional_id: str
    producer_id: int
    state: str
    coordinator_id: int
    producer_epoch: int = -1

    @property
    def handle(self) -> PreparedTransaction:
        """The id, producer id and epoch: for a Prepared one, what commits or aborts it."""
        return PreparedTransaction(self.transactional_id, self.producer_id, self.producer_epoch)


@dataclass(frozen=True, slots=True)
class ProducerState:
    """A producer with state on a partition, as its leader has it (Kafka's ``DescribeProducers``)."""

    producer_id: int
    producer_epoch: int
    last_sequence: int  # -1: none
    last_timestamp: int  # ms, of its newest record on the partition
    coordinator_epoch: int  # of the last marker written for it there; -1: none
    current_transaction_start_offset: int  # first offset of its open transaction there; -1: none open


@dataclass(frozen=True, slots=True)
class ListOffsetsResultInfo:
    """A ListOffsets answer: the offset (-1 when no record matches a timestamp) and its record's timestamp."""

    offset: int
    timestamp: int  # -1 for earliest and latest


@dataclass(frozen=True, slots=True)
class BrokerDescription:
    broker_id: int
    host: str
    port: int
    rack: str | None


@dataclass(frozen=True, slots=True)
class ClusterDescription:
    cluster_id: str
    controller_id: int
    brokers: list[BrokerDescription]


@dataclass(frozen=True, slots=True)
class ConsumerGroupListing:
    """A group as ListGroups names it (Kafka's ConsumerGroupListing)."""

    group_id: str
    state: str  # Empty, Stable, Reconciling; a classic group's (Kafka clients): PreparingRebalance ...
    coordinator_id: int


@dataclass(frozen=True, slots=True)
class MemberDescription:
    """One member of a group: its epoch, subscription, and current and target assignment."""

    member_id: str
    member_epoch: int
    subscribed_topic_names: list[str]
    assignment: list[TopicPartition]
    target_assignment: list[TopicPartition]


@dataclass(frozen=True, slots=True)
class ConsumerGroupDescription:
    """A group as its coordinator sees it (Kafka's ConsumerGroupDescription)."""

    group_id: str
    state: str  # Empty, Stable, Reconciling
    group_epoch: int
    coordinator_id: int
    members: list[MemberDescription]


_ISOLATION_LEVELS = {"read_uncommitted": records_pb2.READ_UNCOMMITTED, "read_committed": records_pb2.READ_COMMITTED}


class Admin:
    """Administers topics, transactions and consumer group offsets."""

    # Offset specs for list_offsets (Kafka's OffsetSpec); any value >= 0 is a timestamp in ms.
    EARLIEST = -2
    LATEST = -1
    MAX_TIMESTAMP = -3

    def __init__(
        self,
        bootstrap_servers: str | list[str],
        *,
        request_timeout_ms: int = 30_000,
        security_protocol: str = "PLAINTEXT",
        ssl_cafile: str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
        sasl_mechanism: str | None = None,
        sasl_oauthbearer_token_file: str | None = None,
        client_id: str | None = None,
    ) -> None:
        self.client_id = client_id or "sluice-admin"
        self._timeout = request_timeout_ms / 1000.0
        self._cluster = Cluster(
            bootstrap_servers,
            request_timeout_ms=request_timeout_ms,
            client_id=self.client_id,
            security=ClientSecurity.build(
                security_protocol,
                ssl_cafile,
                ssl_certfile,
                ssl_keyfile,
                sasl_mechanism=sasl_mechanism,
                sasl_oauthbearer_token_file=sasl_oauthbearer_token_file,
            ),
        )

    def _deadline(self, timeout: float | None) -> Deadline:
        return Deadline(self._timeout if timeout is None else timeout)

    def _any(
        self,
        rpc: Rpc[RequestT, ResponseT],
        request: RequestT,
        error_of: Callable[[ResponseT], tuple[int, str]],
        deadline: Deadline,
        no_retry: frozenset[int] = frozenset(),
    ) -> ResponseT:
        """An RPC any broker answers, retried while its error is retriable (and not in ``no_retry``)."""
        backoff = Backoff()
        while True:
            try:
                response = self._cluster.call_any(rpc, request, deadline.timeout(self._timeout))
            except errors.SluiceError as exc:
                if not exc.retriable or deadline.expired():
                    raise
                backoff.sleep(deadline)
                continue
            code, message = error_of(response)
            if code == records_pb2.NONE:
                return response
            err = errors.error_for(code, message)
            if not err.retriable or code in no_retry or deadline.expired():
                raise err
            backoff.sleep(deadline)

    # ------------------------------------------------------------------ ACLs (Kafka's shape)

    def create_acls(self, acls: Iterable[AclBinding], timeout: float | None = None) -> None:
        """Create ``acls`` (creating one that exists changes nothing). Raises the first refusal:
        SecurityDisabledError (authorizer off), ClusterAuthorizationFailedError (no Alter on the
        cluster), InvalidRequestError (an ACL the broker cannot accept)."""
        request = broker_pb2.CreateAclsRequest(creations=[_acl_proto(b) for b in acls])
        if not request.creations:
            return

        def error_of(r: broker_pb2.CreateAclsResponse) -> tuple[int, str]:
            return next(((x.error_code, x.error_message) for x in r.results if x.error_code), (0, ""))

        self._any(rpcs.CREATE_ACLS, request, error_of, self._deadline(timeout))

    def describe_acls(self, acl_filter: AclBindingFilter, timeout: float | None = None) -> list[AclBinding]:
        """The ACLs ``acl_filter`` matches."""
        response = self._any(
            rpcs.DESCRIBE_ACLS,
            broker_pb2.DescribeAclsRequest(filter=_filter_proto(acl_filter)),
            lambda r: (r.error_code, r.error_message),
            self._deadline(timeout),
        )
        return [_acl_binding(a) for a in response.acls]

    def delete_acls(self, filters: Iterable[AclBindingFilter], timeout: float | None = None) -> list[AclBinding]:
        """Delete every ACL one of ``filters`` matches; returns the ACLs deleted."""
        request = broker_pb2.DeleteAclsRequest(filters=[_filter_proto(f) for f in filters])

        def error_of(r: broker_pb2.DeleteAclsResponse) -> tuple[int, str]:
            return next(((x.error_code, x.error_message) for x in r.results if x.error_code), (0, ""))

        response = self._any(rpcs.DELETE_ACLS, request, error_of, self._deadline(timeout))
        return [_acl_binding(a) for result in response.results for a in result.deleted]

    # ------------------------------------------------------------------ client quotas (Kafka's shape)

    def alter_client_quotas(
        self, alterations: Iterable[ClientQuotaAlteration], *, validate_only: bool = False, timeout: float | None = None
    ) -> None:
        """Set or remove quotas of entities (``user``, ``client-id`` or both: producer_byte_rate,
        consumer_byte_rate). Raises the first refusal: InvalidRequestError (an entity type or key
        Sluice does not keep, a value that is not a positive whole number), ClusterAuthorizationFailedError
        (no AlterConfigs on the cluster)."""
        request = broker_pb2.AlterClientQuotasRequest(
            entries=[a.to_proto() for a in alterations], validate_only=validate_only
        )
        if not request.entries:
            return

        def error_of(r: broker_pb2.AlterClientQuotasResponse) -> tuple[int, str]:
            return next(((x.error_code, x.error_message) for x in r.results if x.error_code), (0, ""))

        self._any(rpcs.ALTER_CLIENT_QUOTAS, request, error_of, self._deadline(timeout))

    def describe_client_quotas(
        self, quota_filter: ClientQuotaFilter | None = None, timeout: float | None = None
    ) -> dict[ClientQuotaEntity, dict[str, float]]:
        """The quotas of the entities ``quota_filter`` matches (default: every entity)."""
        response = self._any(
            rpcs.DESCRIBE_CLIENT_QUOTAS,
            (quota_filter or ClientQuotaFilter.all()).to_proto(),
            lambda r: (r.error_code, r.error_message),
            self._deadline(timeout),
        )
        return {ClientQuotaEntity.from_proto(e.entity): {v.key: v.value for v in e.values} for e in response.entries}

    # ------------------------------------------------------------------ topics

    def create_topic(
        self,
        name: str,
        partitions: int | None = None,
        replication_factor: int | None = None,
        config: Mapping[str, str] | None = None,
        *,
        validate_only: bool = False,
        timeout: float | None = None,
    ) -> str:
        """Create a topic; returns its topic id. None for partitions/replication_factor: the broker's default.

        Raises TopicAlreadyExistsError, InvalidTopicError, InvalidPartitionsError,
        InvalidReplicationFactorError, InvalidConfigError ...
        """
        # 0 on the wire means "the broker's default", so 0 (or less) given here must be refused, not
        # sent: it created a topic of num.partitions partitions. The CLI refuses it the same way.
        if partitions is not None and partitions < 1:
            raise errors.InvalidPartitionsError(f"partitions must be at least 1, not {partitions} (None: the default)")
        if replication_factor is not None and replication_factor < 1:
            raise errors.InvalidReplicationFactorError(
                f"replication factor must be at least 1, not {replication_factor} (None: the default)"
            )
        request = broker_pb2.CreateTopicsRequest(
            topics=[
                broker_pb2.CreatableTopic(
                    name=name,
                    num_partitions=partitions or 0,
                    replication_factor=replication_factor or 0,
                    config={k: str(v) for k, v in (config or {}).items()},
                )
            ],
            validate_only=validate_only,
        )
        response: broker_pb2.CreateTopicsResponse = self._any(
            rpcs.CREATE_TOPICS, request, _topic_error(name), self._deadline(timeout)
        )
        return next((t.topic_id for t in response.topics if t.name == name), "")

    def delete_topic(self, name: str, timeout: float | None = None) -> None:
        """Delete a topic. Raises UnknownTopicOrPartitionError if there is none of that name."""
        request = broker_pb2.DeleteTopicsRequest(names=[name])
        self._any(
            rpcs.DELETE_TOPICS,
            request,
            _topic_error(name),
            self._deadline(timeout),
            no_retry=frozenset({records_pb2.UNKNOWN_TOPIC_OR_PARTITION}),
        )

    def create_partitions(
        self, name: str, count: int, *, validate_only: bool = False, timeout: float | None = None
    ) -> None:
        """Grow a topic to ``count`` partitions in total (never fewer: InvalidPartitionsError)."""
        request = broker_pb2.CreatePartitionsRequest(
            topics=[broker_pb2.CreatePartitionsTopic(name=name, count=count)], validate_only=validate_only
        )
        self._any(
            rpcs.CREATE_PARTITIONS,
            request,
            _topic_error(name),
            self._deadline(timeout),
            no_retry=frozenset({records_pb2.UNKNOWN_TOPIC_OR_PARTITION}),
        )

    # ------------------------------------------------------------------ reassignment (KIP-455)

    def alter_partition_reassignments(
        self,
        reassignments: Mapping[TopicPartition, Sequence[int] | None] | Mapping[tuple[str, int], Sequence[int] | None],
        *,
        allow_replication_factor_change: bool = True,
        timeout: float | None = None,
    ) -> dict[TopicPartition, errors.SluiceError | None]:
        """Start (target replicas, preferred leader first) or cancel (None) partition reassignments.

        Returns one result per partition, as Kafka's ``alterPartitionReassignments`` does: None
        when the broker recorded it, else the refusal (UnknownTopicOrPartitionError,
        InvalidReplicaAssignmentError for an empty list, a broker twice or an unknown broker,
        InvalidReplicationFactorError, NoReassignmentInProgressError). A refusal of the whole
        request (ClusterAuthorizationFailedError: no Alter on the cluster) is raised. The move
        itself goes on in the cluster: :meth:`list_partition_reassignments` shows it until done.
        """
        request = broker_pb2.AlterPartitionReassignmentsRequest(
            disallow_replication_factor_change=not allow_replication_factor_change
        )
        for key, replicas in reassignments.items():
            topic, partition = key
            request.partitions.add(
                topic=str(topic), partition=int(partition), replicas=list(replicas or ()), cancel=replicas is None
            )
        if not request.partitions:
            return {}

        def error_of(r: broker_pb2.AlterPartitionReassignmentsResponse) -> tuple[int, str]:
            # retried while some partition's error is retriable (the store unreachable); else answered.
            # An unknown partition is an answer here: the broker read the store itself.
            return next(
                (
                    (x.error_code, x.error_message)
                    for x in r.partitions
                    if x.error_code != records_pb2.UNKNOWN_TOPIC_OR_PARTITION
                    and errors.error_for(x.error_code).retriable
                ),
                (records_pb2.NONE, ""),
            )

        response = self._any(rpcs.ALTER_PARTITION_REASSIGNMENTS, request, error_of, self._deadline(timeout))
        out: dict[TopicPartition, errors.SluiceError | None] = {}
        for x in response.partitions:
            if x.error_code == records_pb2.CLUSTER_AUTHORIZATION_FAILED:
                raise errors.error_for(x.error_code, x.error_message)
            out[TopicPartition(x.topic, x.partition)] = (
                errors.error_for(x.error_code, x.error_message) if x.error_code else None
            )
        return out

    def list_partition_reassignments(
        self, partitions: Iterable[TopicPartition | tuple[str, int]] | None = None, timeout: float | None = None
    ) -> dict[TopicPartition, PartitionReassignment]:
        """The reassignments in progress (among ``partitions``, or all): a finished one is not listed."""
        request = broker_pb2.ListPartitionReassignmentsRequest(
            partitions=[records_pb2.TopicPartition(topic=str(t), partition=int(p)) for t, p in partitions or ()]
        )
        response = self._any(
            rpcs.LIST_PARTITION_REASSIGNMENTS,
            request,
            lambda r: (r.error_code, r.error_message),
            self._deadline(timeout),
        )
        return {
            TopicPartition(x.topic, x.partition): PartitionReassignment(
                list(x.replicas), list(x.adding_replicas), list(x.removing_replicas)
            )
            for x in response.reassignments
        }

    def describe_log_dirs(
        self, partitions: Iterable[TopicPartition | tuple[str, int]] | None = None, timeout: float | None = None
    ) -> dict[int, LogDirDescription]:
        """Every broker's log directory and replica sizes (Kafka's ``describeLogDirs``), by broker id.

        Each registered broker is asked about itself, all at once; a broker that does not answer
        within ``timeout`` is left out (the caller sees whose sizes it lacks). ``partitions``
        limits the replicas listed (default: all). Needs Describe on the cluster.
        """
        request = broker_pb2.DescribeLogDirsRequest(
            partitions=[records_pb2.TopicPartition(topic=str(t), partition=int(p)) for t, p in partitions or ()]
        )
        out: dict[int, LogDirDescription] = {}
        for broker_id, r in self._cluster.call_all(
            rpcs.DESCRIBE_LOG_DIRS, request, self._deadline(timeout).timeout(self._timeout)
        ):
            out[broker_id] = LogDirDescription(
                broker_id,
                r.log_dir,
                r.total_bytes,
                r.usable_bytes,
                {TopicPartition(x.topic, x.partition): x.size_bytes for x in r.partitions},
                errors.error_for(r.error_code, r.error_message) if r.error_code else None,
            )
        return out

    def alter_topic_config(
        self,
        name: str,
        changes: Mapping[str, str | None],
        *,
        validate_only: bool = False,
        timeout: float | None = None,
    ) -> None:
        """Change a topic's config overrides without a restart (Kafka's incremental alter).

        ``changes``: key -> new value, or None to drop the override (the broker's value applies
        again), e.g. ``{"retention.ms": "3600000", "cleanup.policy": None}``. All or nothing:
        an unknown key or a bad value is InvalidConfigError naming the key, and nothing changes.
        """
        configs = [
            broker_pb2.ConfigAlteration(key=k, operation=broker_pb2.CONFIG_DELETE)
            if v is None
            else broker_pb2.ConfigAlteration(key=k, operation=broker_pb2.CONFIG_SET, value=v)
            for k, v in changes.items()
        ]
        request = broker_pb2.AlterTopicConfigsRequest(
            topics=[broker_pb2.AlterTopicConfigsTopic(name=name, configs=configs)], validate_only=validate_only
        )
        self._any(
            rpcs.ALTER_TOPIC_CONFIGS,
            request,
            _topic_error(name),
            self._deadline(timeout),
            no_retry=frozenset({records_pb2.UNKNOWN_TOPIC_OR_PARTITION}),
        )

    def list_topics(self, include_internal: bool = False, timeout: float | None = None) -> list[str]:
        """Names of the cluster's topics (the internal ones too with ``include_internal``)."""
        request = broker_pb2.MetadataRequest(topics=[], include_internal=include_internal)
        response: broker_pb2.MetadataResponse = self._any(
            rpcs.METADATA, request, lambda r: (records_pb2.NONE, ""), self._deadline(timeout)
        )
        return sorted(
            t.name for t in response.topics if t.error_code == records_pb2.NONE and (include_internal or not t.internal)
        )

    def describe_topic(self, name: str, timeout: float | None = None) -> TopicDescription:
        """Partitions (leader, replicas, ISR, leader epoch), config and id of a topic."""
        return self.describe_topics([name], timeout)[0]

    def describe_topics(self, names: Iterable[str], timeout: float | None = None) -> list[TopicDescription]:
        wanted = list(names)
        request = broker_pb2.MetadataRequest(topics=wanted, include_internal=True)

        def error_of(r: broker_pb2.MetadataResponse) -> tuple[int, str]:
            found = {t.name for t in r.topics}
            missing = [n for n in wanted if n not in found]
            if missing:
                return records_pb2.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {missing[0]!r}"
            return first_error((t.error_code, t.error_message or f"topic {t.name!r}") for t in r.topics)

        response: broker_pb2.MetadataResponse = self._any(
            rpcs.DESCRIBE_TOPICS,
            request,
            error_of,
            self._deadline(timeout),
            no_retry=frozenset({records_pb2.UNKNOWN_TOPIC_OR_PARTITION}),
        )
        by_name = {t.name: t for t in response.topics}
        return [_describe(by_name[n]) for n in wanted]

    def describe_cluster(self, timeout: float | None = None) -> ClusterDescription:
        request = broker_pb2.MetadataRequest(topics=[])
        response: broker_pb2.MetadataResponse = self._any(
            rpcs.METADATA, request, lambda r: (records_pb2.NONE, ""), self._deadline(timeout)
        )
        return ClusterDescription(
            cluster_id=response.cluster_id,
            controller_id=response.controller_id,
            brokers=[BrokerDescription(b.broker_id, b.host, b.port, b.rack or None) for b in response.brokers],
        )

    # ------------------------------------------------------------------ transactions

    def describe_transactions(
        self, transactional_ids: Iterable[str], timeout: float | None = None
    ) -> list[TransactionDescription]:
        """The state of each transactional id, from its coordinator, in the order asked. Raises the
        first id's error (TransactionalIdNotFoundError for an id never used); see
        :meth:`describe_transactions_each` for every answer at once."""
        wanted = list(transactional_ids)
        found = self.describe_transactions_each(wanted, timeout)
        out: list[TransactionDescription] = []
        for txn_id in wanted:
            answer = found[txn_id]
            if isinstance(answer, errors.SluiceError):
                raise answer
            out.append(answer)
        return out

    def describe_transactions_each(
        self, transactional_ids: Iterable[str], timeout: float | None = None
    ) -> dict[str, TransactionDescription | errors.SluiceError]:
        """Each transactional id's description, or the error it got (Kafka's
        ``DescribeTransactionsResult.byTransactionalId``).

        One DescribeTransactions per coordinator carries all of its ids, as Kafka's admin client
        batches them: the operator describes thousands of ids per status round. Ids whose
        coordinator moved, is loading or did not answer are asked again (their coordinator found
        anew) until the deadline; then they keep that retriable error.
        """
        deadline = self._deadline(timeout)
        pending = list(dict.fromkeys(transactional_ids))
        out: dict[str, TransactionDescription | errors.SluiceError] = {}
        backoff = Backoff()
        while pending:
            by_coordinator: dict[str, list[str]] = {}
            for i, txn_id in enumerate(pending):
                try:
                    _node, address = self._cluster.find_coordinator(txn_id, TRANSACTION, deadline)
                except errors.SluiceError as exc:  # no broker answers: the others would wait as long
                    out.update(dict.fromkeys(pending[i:], exc))
                    break
                by_coordinator.setdefault(address, []).append(txn_id)
            again: list[str] = []
            for address, ids in by_coordinator.items():
                again += self._describe_at(address, ids, deadline, out)
            if not again or deadline.expired():
                break
            pending = again
            backoff.sleep(deadline)
        return out

    def _describe_at(
        self,
        address: str,
        ids: list[str],
        deadline: Deadline,
        out: dict[str, TransactionDescription | errors.SluiceError],
    ) -> list[str]:
        """One DescribeTransactions to the coordinator at ``address``; its answers into ``out``, and
        the ids worth asking again (retriable errors)."""
        request = broker_pb2.DescribeTransactionsRequest(transactional_ids=ids)
        try:
            response = self._cluster.call(address, rpcs.DESCRIBE_TRANSACTIONS, request, deadline.timeout(self._timeout))
        except (errors.BrokerNotAvailableError, errors.RequestTimedOutError) as exc:
            for txn_id in ids:
                self._cluster.forget_coordinator(txn_id, TRANSACTION)
                out[txn_id] = exc
            return ids
        answered = {t.transactional_id: t for t in response.transactions}
        again: list[str] = []
        for txn_id in ids:
            t = answered.get(txn_id)
            if t is None:
                out[txn_id] = errors.error_for(
                    records_pb2.TRANSACTIONAL_ID_NOT_FOUND, f"no transactional id {txn_id!r}"
                )
            elif t.error_code != records_pb2.NONE:
                failed = errors.error_for(t.error_code, t.error_message)
                out[txn_id] = failed
                if t.error_code in COORDINATOR_MOVED_CODES:
                    self._cluster.forget_coordinator(txn_id, TRANSACTION)
                if failed.retriable:
                    again.append(txn_id)
            else:
                out[txn_id] = TransactionDescription(
                    transactional_id=t.transactional_id,
                    state=t.state,
                    producer_id=t.producer_id,
                    producer_epoch=t.producer_epoch,
                    transaction_timeout_ms=t.transaction_timeout_ms,
                    transaction_start_time_ms=t.transaction_start_time_ms,
                    partitions=[TopicPartition(p.topic, p.partition) for p in t.partitions],
                    coordinator_id=t.coordinator_id,
                    last_update_time_ms=t.last_update_time_ms,
                )
        return again

    def fence_producers(
        self, transactional_ids: Iterable[str], transaction_timeout_ms: int = 60_000, timeout: float | None = None
    ) -> dict[str, tuple[int, int]]:
        """Fence the current producer of each transactional id, as Kafka's ``Admin.fenceProducers``.

        Sends InitProducerId for the id as a new producer would: the coordinator
        bumps the epoch, so the live producer gets PRODUCER_FENCED on its next
        request, and an open transaction is aborted first (the coordinator
        answers CONCURRENT_TRANSACTIONS while it aborts; retried here). Returns
        id -> (producer id, new epoch). The id's transaction timeout becomes
        ``transaction_timeout_ms``, as with any InitProducerId.
        """
        deadline = self._deadline(timeout)
        out: dict[str, tuple[int, int]] = {}
        for txn_id in transactional_ids:
            response: broker_pb2.InitProducerIdResponse = self._cluster.coordinator_call(
                txn_id,
                TRANSACTION,
                rpcs.INIT_PRODUCER_ID,
                broker_pb2.InitProducerIdRequest(
                    transactional_id=txn_id,
                    transaction_timeout_ms=transaction_timeout_ms,
                    producer_id=-1,
                    producer_epoch=-1,
                ),
                response_error,
                deadline,
            )
            out[txn_id] = (response.producer_id, response.producer_epoch)
        return out

    def list_transactions(
        self,
        states: Iterable[str] | None = None,
        producer_ids: Iterable[int] | None = None,
        timeout: float | None = None,
        *,
        duration_filter_ms: int = 0,
    ) -> list[ListedTransaction]:
        """Transactional ids known to the coordinators (every broker is asked), optionally filtered.

        ``duration_filter_ms`` > 0 lists only transactions open for longer than that (KIP-994)."""
        if duration_filter_ms < 0:
            raise ValueError(f"duration_filter_ms must be >= 0, not {duration_filter_ms}")
        request = broker_pb2.ListTransactionsRequest(
            state_filters=list(states or ()),
            producer_id_filters=list(producer_ids or ()),
            duration_filter_ms=duration_filter_ms,
        )
        seen: dict[str, ListedTransaction] = {}
        for _broker_id, response in self._cluster.call_all(
            rpcs.LIST_TRANSACTIONS, request, self._deadline(timeout).timeout(self._timeout)
        ):
            errors.check(response.error_code, "ListTransactions failed")
            for t in response.transactions:
                seen.setdefault(
                    t.transactional_id,
                    ListedTransaction(t.transactional_id, t.producer_id, t.state, t.coordinator_id, t.producer_epoch),
                )
        return sorted(seen.values(), key=lambda t: t.transactional_id)

    def describe_producers(
        self, partitions: Iterable[TopicPartition], timeout: float | None = None
    ) -> dict[TopicPartition, list[ProducerState]]:
        """The producers with state on each partition, asked of its leader (Kafka's ``describeProducers``).

        What ``find-hanging`` reads: a producer whose ``current_transaction_start_offset`` is set
        has a transaction open there. Raises the first non-retriable error of a partition.
        """

        def request_of(group: Sequence[TopicPartition]) -> broker_pb2.DescribeProducersRequest:
            return broker_pb2.DescribeProducersRequest(
                partitions=[records_pb2.TopicPartition(topic=tp.topic, partition=tp.partition) for tp in group]
            )

        def answers_of(r: broker_pb2.DescribeProducersResponse) -> Iterator[Answer[list[ProducerState]]]:
            for p in r.partitions:
                producers = [
                    ProducerState(
                        a.producer_id, a.producer_epoch, a.last_sequence, a.last_timestamp, a.coordinator_epoch,
                        a.current_txn_start_offset,
                    )
                    for a in p.active_producers
                ]  # fmt: skip
                yield TopicPartition(p.topic, p.partition), p.error_code, p.error_message, producers

        wanted = list(dict.fromkeys(partitions))  # read once: ``partitions`` may be a one-shot iterator
        found = call_leaders(
            self._cluster, wanted, rpcs.DESCRIBE_PRODUCERS, request_of, answers_of, self._timeout,
            self._deadline(timeout), "producers",
        )  # fmt: skip
        return {tp: found[tp] for tp in wanted}

    def abort_transaction(
        self,
        partition: TopicPartition,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        timeout: float | None = None,
    ) -> int:
        """Abort a hanging transaction on ``partition`` (Kafka's ``abortTransaction``); the ABORT marker's offset.

        For a transaction its coordinator will never end (data it does not know of), which holds
        the partition's last stable offset back. The partition's leader refuses a transaction
        whose producer wrote within ``transaction.max.timeout.ms`` (INVALID_TXN_STATE: it may still
        be live). ``producer_epoch`` and ``coordinator_epoch`` as :meth:`describe_producers` gives
        them. ClusterAction on the cluster is needed when the authorizer is on.
        """
        request = broker_pb2.AbortTransactionRequest(
            topic=partition.topic,
            partition=partition.partition,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            coordinator_epoch=coordinator_epoch,
        )

        def answers_of(r: broker_pb2.AbortTransactionResponse) -> Iterator[Answer[int]]:
            yield partition, r.error_code, r.error_message, r.marker_offset

        found = call_leaders(
            self._cluster, [partition], rpcs.ABORT_TRANSACTION, lambda _group: request, answers_of, self._timeout,
            self._deadline(timeout), "the ABORT marker",
        )  # fmt: skip
        return found[partition]

    def list_prepared_transactions(self, timeout: float | None = None) -> list[ListedTransaction]:
        """Every transaction in state Prepared, waiting for its external coordinator's decision."""
        return self.list_transactions(states=["Prepared"], timeout=timeout)

    def commit_prepared_transaction(self, handle: PreparedTransaction, timeout: float | None = None) -> None:
        """Commit a prepared transaction (two-phase commit, the idea of KIP-939) from any client.

        Repeating a commit that went through is fine (a retried driver).
        Raises ProducerFencedError (an older epoch), InvalidProducerEpochError
        (a newer one), InvalidProducerIdMappingError (another producer id),
        TransactionalIdNotFoundError (no such id), InvalidTxnStateError (the
        id has no prepared transaction: never prepared, or it was aborted).
        The records become visible to read_committed consumers once the
        coordinator wrote the COMMIT markers, right after this returns.
        """
        self._end_prepared(handle, True, timeout)

    def abort_prepared_transaction(self, handle: PreparedTransaction, timeout: float | None = None) -> None:
        """Abort a prepared transaction from any client (errors as commit_prepared_transaction)."""
        self._end_prepared(handle, False, timeout)

    def _end_prepared(self, handle: PreparedTransaction, commit: bool, timeout: float | None) -> None:
        if not handle.transactional_id:
            raise ValueError("the handle has no transactional id")
        self._cluster.coordinator_call(
            handle.transactional_id,
            TRANSACTION,
            rpcs.END_TXN,
            broker_pb2.EndTxnRequest(
                transactional_id=handle.transactional_id,
                producer_id=handle.producer_id,
                producer_epoch=handle.producer_epoch,
                committed=commit,
                prepared=True,
            ),
            response_error,
            self._deadline(timeout),
        )

    # ------------------------------------------------------------------ offsets

    def list_offsets(
        self,
        specs: Mapping[TopicPartition, int],
        *,
        isolation_level: str = "read_uncommitted",
        timeout: float | None = None,
    ) -> dict[TopicPartition, ListOffsetsResultInfo]:
        """Offsets of each partition by spec: ``Admin.EARLIEST``, ``Admin.LATEST`` (the high watermark,
        or the last stable offset with ``isolation_level="read_committed"``), ``Admin.MAX_TIMESTAMP`` or a
        timestamp in ms (the first offset whose record is at least that recent)."""
        isolation = _ISOLATION_LEVELS.get(isolation_level)
        if isolation is None:
            raise ValueError(f"isolation_level must be one of {sorted(_ISOLATION_LEVELS)}, not {isolation_level!r}")
        for tp, spec in specs.items():
            if spec < self.MAX_TIMESTAMP:
                raise ValueError(f"offset spec {spec} of {tp}: use EARLIEST, LATEST, MAX_TIMESTAMP or a timestamp >= 0")
        found = list_offsets_at(self._cluster, dict(specs), isolation, self._timeout, self._deadline(timeout))
        return {tp: ListOffsetsResultInfo(-1 if off is None else off, ts) for tp, (off, ts) in found.items()}

    # ------------------------------------------------------------------ consumer groups

    def list_consumer_group_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None = None, timeout: float | None = None
    ) -> dict[TopicPartition, int]:
        """The group's committed offsets (stable ones only), for ``partitions`` or all it has."""
        request = broker_pb2.OffsetFetchRequest(
            group_id=group_id,
            partitions=[records_pb2.TopicPartition(topic=tp.topic, partition=tp.partition) for tp in partitions or ()],
            require_stable=False,
        )
        response: broker_pb2.OffsetFetchResponse = self._cluster.coordinator_call(
            group_id,
            GROUP,
            rpcs.OFFSET_FETCH,
            request,
            response_error,
            self._deadline(timeout),
        )
        return {
            TopicPartition(p.topic, p.partition): p.committed_offset
            for p in response.partitions
            if p.error_code == records_pb2.NONE and p.committed_offset >= 0
        }

    def alter_consumer_group_offsets(
        self, group_id: str, offsets: Mapping[TopicPartition, int], timeout: float | None = None
    ) -> None:
        """Commit ``offsets`` for a group from outside it (e.g. to reset a stopped group)."""
        by_topic: dict[str, list[broker_pb2.OffsetCommitPartition]] = {}
        for tp, off in offsets.items():
            by_topic.setdefault(tp.topic, []).append(
                broker_pb2.OffsetCommitPartition(
                    partition=tp.partition, committed_offset=off, committed_leader_epoch=-1
                )
            )
        request = broker_pb2.OffsetCommitRequest(
            group_id=group_id,
            member_id="",
            member_epoch=-1,
            topics=[broker_pb2.OffsetCommitTopic(name=t, partitions=ps) for t, ps in by_topic.items()],
        )
        self._cluster.coordinator_call(
            group_id,
            GROUP,
            rpcs.OFFSET_COMMIT,
            request,
            lambda r: first_error((x.error_code, x.error_message) for x in r.results),
            self._deadline(timeout),
        )

    # ------------------------------------------------------------------ consumer group administration
    # (kafka-consumer-groups.sh: list, describe, delete; offsets are above)

    def list_consumer_groups(
        self, states: Iterable[str] | None = None, timeout: float | None = None
    ) -> list[ConsumerGroupListing]:
        """Every group the coordinators hold (every broker is asked), optionally only in ``states``.

        A coordinator still loading a partition answers COORDINATOR_LOAD_IN_PROGRESS: retried
        until the deadline, so a group is not missed because its coordinator just moved.
        """
        deadline = self._deadline(timeout)
        request = broker_pb2.ListGroupsRequest(states_filter=list(states or ()))
        backoff = Backoff()
        while True:
            answers = self._cluster.call_all(rpcs.LIST_GROUPS, request, deadline.timeout(self._timeout))
            code, message = first_error((r.error_code, r.error_message) for _b, r in answers)
            if code == records_pb2.NONE:
                break
            err = errors.error_for(code, message)
            if not err.retriable or deadline.expired():
                raise err
            backoff.sleep(deadline)
        seen: dict[str, ConsumerGroupListing] = {}
        for _broker_id, response in answers:
            for g in response.groups:
                seen.setdefault(g.group_id, ConsumerGroupListing(g.group_id, g.state, g.coordinator_id))
        return sorted(seen.values(), key=lambda g: g.group_id)

    def describe_consumer_groups(
        self, group_ids: Iterable[str], timeout: float | None = None
    ) -> dict[str, ConsumerGroupDescription]:
        """Each group's state, epoch and members, from its coordinator. Raises GroupIdNotFoundError."""
        deadline = self._deadline(timeout)
        out: dict[str, ConsumerGroupDescription] = {}
        for group_id in group_ids:
            response: broker_pb2.DescribeGroupsResponse = self._cluster.coordinator_call(
                group_id,
                GROUP,
                rpcs.DESCRIBE_GROUPS,
                broker_pb2.DescribeGroupsRequest(group_ids=[group_id]),
                _group_error(group_id, lambda r: r.groups),
                deadline,
            )
            g = next(g for g in response.groups if g.group_id == group_id)
            out[group_id] = ConsumerGroupDescription(
                group_id=g.group_id,
                state=g.state,
                group_epoch=g.group_epoch,
                coordinator_id=g.coordinator_id,
                members=[
                    MemberDescription(
                        member_id=m.member_id,
                        member_epoch=m.member_epoch,
                        subscribed_topic_names=list(m.subscribed_topic_names),
                        assignment=[TopicPartition(p.topic, p.partition) for p in m.assignment],
                        target_assignment=[TopicPartition(p.topic, p.partition) for p in m.target_assignment],
                    )
                    for m in g.members
                ],
            )
        return out

    def delete_consumer_groups(self, group_ids: Iterable[str], timeout: float | None = None) -> None:
        """Delete each group's committed offsets, in order. Raises NonEmptyGroupError while a group has
        members, GroupIdNotFoundError for a group that does not exist (the groups before it are deleted)."""
        deadline = self._deadline(timeout)
        for group_id in group_ids:
            self._cluster.coordinator_call(
                group_id,
                GROUP,
                rpcs.DELETE_GROUPS,
                broker_pb2.DeleteGroupsRequest(group_ids=[group_id]),
                _group_error(group_id, lambda r: r.results),
                deadline,
            )

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        self._cluster.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class _TopicResult(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def error_code(self) -> int: ...

    @property
    def error_message(self) -> str: ...


class _TopicResults(Protocol):
    """A response with one result per topic (CreateTopics, DeleteTopics, CreatePartitions)."""

    @property
    def topics(self) -> Iterable[_TopicResult]: ...


def _topic_error(name: str) -> Callable[[_TopicResults], tuple[int, str]]:
    def error_of(response: _TopicResults) -> tuple[int, str]:
        for t in response.topics:
            if t.name == name:
                return t.error_code, t.error_message or f"topic {name!r}"
        return records_pb2.NONE, ""

    return error_of


class _GroupResult(Protocol):
    @property
    def group_id(self) -> str: ...

    @property
    def error_code(self) -> int: ...

    @property
    def error_message(self) -> str: ...


GroupResponseT = TypeVar("GroupResponseT")


def _group_error(
    group_id: str, results: Callable[[GroupResponseT], Iterable[_GroupResult]]
) -> Callable[[GroupResponseT], tuple[int, str]]:
    """The error of ``group_id``'s result in a DescribeGroups/DeleteGroups answer."""

    def error_of(response: GroupResponseT) -> tuple[int, str]:
        for g in results(response):
            if g.group_id == group_id:
                return g.error_code, g.error_message or f"group {group_id!r}"
        return records_pb2.UNKNOWN_SERVER_ERROR, f"the coordinator did not answer for group {group_id!r}"

    return error_of


def _describe(t: broker_pb2.TopicMetadata) -> TopicDescription:
    return TopicDescription(
        name=t.name,
        topic_id=t.topic_id,
        partitions=[
            PartitionDescription(
                partition=p.partition,
                leader=p.leader,
                replicas=list(p.replicas),
                isr=list(p.isr),
                leader_epoch=p.leader_epoch,
            )
            for p in sorted(t.partitions, key=lambda p: p.partition)
        ],
        config=dict(t.config),
        internal=t.internal,
        replication_factor=t.replication_factor,
    )


__all__ = [
    "Admin",
    "BrokerDescription",
    "ClusterDescription",
    "ConsumerGroupDescription",
    "ConsumerGroupListing",
    "ListedTransaction",
    "LogDirDescription",
    "MemberDescription",
    "PartitionDescription",
    "PartitionReassignment",
    "ProducerState",
    "TopicDescription",
    "TransactionDescription",
]


def _acl_proto(b: AclBinding) -> broker_pb2.Acl:
    return broker_pb2.Acl(
        resource_type=b.resource_type, name=b.name, pattern_type=b.pattern_type, principal=b.principal,
        host=b.host, operation=b.operation, permission_type=b.permission_type,
    )  # fmt: skip


def _acl_binding(a: broker_pb2.Acl) -> AclBinding:
    return AclBinding(
        ResourceType(a.resource_type), a.name, ResourcePatternType(a.pattern_type), a.principal, a.host,
        AclOperation(a.operation), AclPermissionType(a.permission_type),
    )  # fmt: skip


def _filter_proto(f: AclBindingFilter) -> broker_pb2.AclFilter:
    out = broker_pb2.AclFilter(
        resource_type=f.resource_type, pattern_type=f.pattern_type, operation=f.operation,
        permission_type=f.permission_type,
    )  # fmt: skip
    if f.name is not None:
        out.name = f.name
    if f.principal is not None:
        out.principal = f.principal
    if f.host is not None:
        out.host = f.host
    return out
