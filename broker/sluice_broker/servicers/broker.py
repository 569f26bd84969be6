"""sluice.v1.Broker: the service clients call.

Each method checks what the core cannot (sizes that must not be negative,
a key that must not be empty) and hands the request over: data-path requests
to the :class:`~sluice.broker.replica_manager.ReplicaManager`, topic admin to the
:class:`~sluice.broker.cluster.ClusterView`, transactions and groups to their
coordinators. Metadata and FindCoordinator are answered from the cluster view.

Authorization (when ``authorizer.enabled``; decisions in :mod:`sluice.broker.security`): the
data path and topic admin check what Kafka checks (Produce: Write on the topic and, with a
transactional id, Write on it; Fetch: Read; ListOffsets and Metadata: Describe; CreateTopics:
Create on the cluster or the topic; DeleteTopics: Delete; CreatePartitions: Alter;
AlterPartitionReassignments: Alter on the cluster; ListPartitionReassignments and DescribeLogDirs:
Describe on the cluster, as Kafka's, the whole request refused with CLUSTER_AUTHORIZATION_FAILED). What is
refused is answered per topic with TOPIC_AUTHORIZATION_FAILED (or
TRANSACTIONAL_ID_AUTHORIZATION_FAILED); the rest of the request is served. The transaction
and group coordinators' RPCs are checked by :mod:`sluice.broker.security.coordinator_checks`.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import grpc

from sluice import errors
from sluice.acls import AclOperation, ResourceType
from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.cluster import (
    INTERNAL_TOPICS,
    ClusterView,
    TopicInfo,
)
from sluice.broker.data_path import FetchInput, FetchPartition, OffsetQuery, ProduceInput, ProducePartition
from sluice.broker.errors import InvalidArgumentError, SluiceError, answer
from sluice.broker.group import GroupCoordinator
from sluice.broker.group.admin import GroupAdmin
from sluice.broker.group.api import (
    CommitOffset,
    FetchedOffset,
    GroupDescription,
    HeartbeatAnswer,
    HeartbeatInput,
    OffsetCommitInput,
    OffsetFetchInput,
    Outcome,
    TxnOffsetCommitInput,
)
from sluice.broker.log.dir_space import read_space
from sluice.broker.log.fetch_response import FetchResponseWriter
from sluice.broker.replica_manager import ReplicaManager
from sluice.broker.security import coordinator_checks as checks
from sluice.broker.security.authorizer import Refusal, topic_refusal
from sluice.broker.security.client_ids import client_id
from sluice.broker.security.gate import RequestGate
from sluice.broker.security.peers import principal
from sluice.broker.servicers.acls import AclHandlers
from sluice.broker.servicers.quotas import QuotaHandlers
from sluice.broker.servicers.registration import Ctx, nonneg, service
from sluice.broker.topic_config_ops import ConfigChange
from sluice.broker.txn import TransactionCoordinator
from sluice.broker.txn.api import (
    HandleAnswer,
    InitProducerIdInput,
    ListTransactionsInput,
    PartitionAnswer,
    TxnDescription,
    TxnHandle,
)
from sluice.records import KAFKA_V2, RecordBatch, RecordDecodeError, to_sluice_format

MAX_WAIT_MS = 300_000  # the longest a Fetch may ask to wait

log = logging.getLogger(__name__)


def _sluice_encoded(
    batches: list[RecordBatch], raw: list[bytes], next_fetch_offset: int
) -> tuple[list[bytes], str, int]:
    """The stored batches for a client that reads only Sluice's record encoding: those a Kafka client
    produced (stored in Kafka's v2 records format) re-encoded, the rest sent as stored; and where
    the client goes on. A batch whose records cannot be decoded ends the list, with why (the
    partition's CORRUPT_MESSAGE), and the client goes on at that batch, never past it."""
    out: list[bytes] = []
    for batch, stored in zip(batches, raw, strict=True):
        if batch.records_format != KAFKA_V2:
            out.append(stored)
            continue
        try:
            out.append(to_sluice_format(batch).SerializeToString())
        except RecordDecodeError as exc:
            return out, str(exc), batch.base_offset
    return out, "", next_fetch_offset


async def admin_result(cluster: ClusterView, result: Any, action: Callable[[], str]) -> None:
    """Fill one topic's result of a topic-admin request: the topic id, or the refusal's code and message.

    The action runs in a worker thread (:meth:`ClusterView.admin`): its metadata writes may block."""
    try:
        result.topic_id = await cluster.admin(action)
    except SluiceError as exc:
        answer(result, exc)


def _refused(op: AclOperation, name: str) -> Callable[[], str]:
    def refuse() -> str:
        raise errors.TopicAuthorizationFailedError(topic_refusal(op, name))

    return refuse


class BrokerService:
    """sluice.v1.Broker."""

    def __init__(
        self,
        cluster: ClusterView,
        replicas: ReplicaManager,
        txn: TransactionCoordinator,
        groups: GroupCoordinator,
        gate: RequestGate,
    ) -> None:
        self.cluster = cluster
        self.replicas = replicas
        self.txn = txn
        self.groups = groups
        self.group_admin = GroupAdmin(groups, cluster.config.broker_id)
        self.gate = gate
        self.access = gate.access
        self.acls = AclHandlers(cluster.store, gate.access)
        self.quotas = QuotaHandlers(cluster.store, gate.access, gate.client_quotas)

    def _denied(self, ctx: Ctx, op: AclOperation, names: Iterable[str]) -> set[str]:
        return self.gate.denied_topics(ctx, op, names)

    def handler(self) -> grpc.GenericRpcHandler[Any, Any]:
        b = bpb
        return service(
            "sluice.v1.Broker",
            {
                "Metadata": (self.metadata, b.MetadataRequest),
                "DescribeTopics": (self.metadata, b.MetadataRequest),
                "Produce": (self.produce, b.ProduceRequest),
                "Fetch": (self.fetch, b.FetchRequest),
                "ListOffsets": (self.list_offsets, b.ListOffsetsRequest),
                "CreateTopics": (self.create_topics, b.CreateTopicsRequest),
                "DeleteTopics": (self.delete_topics, b.DeleteTopicsRequest),
                "CreatePartitions": (self.create_partitions, b.CreatePartitionsRequest),
                "AlterTopicConfigs": (self.alter_topic_configs, b.AlterTopicConfigsRequest),
                "AlterPartitionReassignments": (
                    self.alter_partition_reassignments,
                    b.AlterPartitionReassignmentsRequest,
                ),
                "ListPartitionReassignments": (self.list_partition_reassignments, b.ListPartitionReassignmentsRequest),
                "DescribeLogDirs": (self.describe_log_dirs, b.DescribeLogDirsRequest),
                "FindCoordinator": (self.find_coordinator, b.FindCoordinatorRequest),
                "InitProducerId": (self.init_producer_id, b.InitProducerIdRequest),
                "AddPartitionsToTxn": (self.add_partitions_to_txn, b.AddPartitionsToTxnRequest),
                "AddOffsetsToTxn": (self.add_offsets_to_txn, b.AddOffsetsToTxnRequest),
                "EndTxn": (self.end_txn, b.EndTxnRequest),
                "PrepareTxn": (self.prepare_txn, b.PrepareTxnRequest),
                "DescribeTransactions": (self.describe_transactions, b.DescribeTransactionsRequest),
                "ListTransactions": (self.list_transactions, b.ListTransactionsRequest),
                "DescribeProducers": (self.describe_producers, b.DescribeProducersRequest),
                "AbortTransaction": (self.abort_transaction, b.AbortTransactionRequest),
                "TxnOffsetCommit": (self.txn_offset_commit, b.TxnOffsetCommitRequest),
                "OffsetCommit": (self.offset_commit, b.OffsetCommitRequest),
                "OffsetFetch": (self.offset_fetch, b.OffsetFetchRequest),
                "ConsumerGroupHeartbeat": (self.heartbeat, b.ConsumerGroupHeartbeatRequest),
                "CreateAcls": (self.acls.create_acls, b.CreateAclsRequest),
                "DescribeAcls": (self.acls.describe_acls, b.DescribeAclsRequest),
                "DeleteAcls": (self.acls.delete_acls, b.DeleteAclsRequest),
                "DescribeClientQuotas": (self.quotas.describe_client_quotas, b.DescribeClientQuotasRequest),
                "AlterClientQuotas": (self.quotas.alter_client_quotas, b.AlterClientQuotasRequest),
                "ListGroups": (self.list_groups, b.ListGroupsRequest),
                "DescribeGroups": (self.describe_groups, b.DescribeGroupsRequest),
                "DeleteGroups": (self.delete_groups, b.DeleteGroupsRequest),
            },
            self.replicas.events,
        )

    # -- metadata ---------------------------------------------------------------------------------

    async def metadata(self, req: bpb.MetadataRequest, ctx: Ctx) -> bpb.MetadataResponse:
        self.cluster.refresh()
        resp = bpb.MetadataResponse(cluster_id=self.cluster.cluster_id, controller_id=-1)
        for b in sorted(self.cluster.brokers.values(), key=lambda b: b.broker_id):
            resp.brokers.add(broker_id=b.broker_id, host=b.host, port=b.port, rack=b.rack)
        names = list(req.topics) or sorted(
            n for n in self.cluster.topics if req.include_internal or n not in INTERNAL_TOPICS
        )
        denied = self._denied(ctx, AclOperation.DESCRIBE, names)
        for name in names:
            if name in denied:
                if req.topics:  # asked by name: say why; a listing leaves it out, as Kafka does
                    refusal = topic_refusal(AclOperation.DESCRIBE, name)
                    resp.topics.add(name=name, error_code=pb.TOPIC_AUTHORIZATION_FAILED, error_message=refusal)
                continue
            info = self.cluster.topics.get(name)
            if info is None:
                resp.topics.add(
                    name=name,
                    error_code=pb.UNKNOWN_TOPIC_OR_PARTITION,
                    error_message=f"topic {name!r} does not exist: create it first (sluice topics create {name}, "
                    "Admin.create_topic); Sluice's clients never auto-create topics, Kafka clients do on brokers "
                    "with auto.create.topics.enable=true",
                )
                continue
            self._topic_metadata(resp.topics.add(), info)
        return resp

    @staticmethod
    def _topic_metadata(out: bpb.TopicMetadata, info: TopicInfo) -> None:
        out.name = info.name
        out.topic_id = info.topic_id
        out.internal = info.internal
        out.replication_factor = info.replication_factor
        out.config.update(info.config)
        for p, part in enumerate(info.partitions):
            out.partitions.add(
                partition=p,
                # as Kafka (and the Kafka listener) answers: retriable, the client keeps looking it up
                error_code=pb.LEADER_NOT_AVAILABLE if part.leader < 0 else pb.NONE,
                leader=part.leader,
                leader_epoch=part.leader_epoch,
                replicas=part.replicas,
                isr=part.isr,
            )

    # -- data path --------------------------------------------------------------------------------

    async def produce(self, req: bpb.ProduceRequest, ctx: Ctx) -> bpb.ProduceResponse:
        quota = self.gate.produce
        if not quota.active:
            return await self._produce(req, ctx)
        who, client = principal(ctx), client_id(ctx)
        await self.gate.hold_while_over(quota, who, client, "Produce")
        resp = await self._produce(req, ctx)
        resp.throttle_time_ms = quota.record(who, req.ByteSize(), client)
        return resp

    async def _produce(self, req: bpb.ProduceRequest, ctx: Ctx) -> bpb.ProduceResponse:
        nonneg(req.timeout_ms, "timeout_ms")
        denied = self._denied(ctx, AclOperation.WRITE, (t.name for t in req.topics))
        txn_refusal = ""
        if req.transactional_id and not self.access.allowed(
            ctx, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, req.transactional_id
        ):
            txn_refusal = f"not authorized to Write transactional id {req.transactional_id!r}"
        allowed = ProduceInput(
            [
                ProducePartition(t.name, p.partition, p.batch)
                for t in req.topics
                if not txn_refusal and t.name not in denied
                for p in t.partitions
            ],
            acks=req.acks,
            timeout_ms=req.timeout_ms,
            transactional_id=req.transactional_id,
        )
        answered = iter(await self.replicas.produce(allowed) if allowed.batches else ())
        resp = bpb.ProduceResponse()
        for t in req.topics:
            out = resp.topics.add(name=t.name)
            for p in t.partitions:
                presp = out.partitions.add(partition=p.partition, base_offset=-1, log_append_time=-1)
                if txn_refusal:
                    presp.error_code, presp.error_message = pb.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, txn_refusal
                elif t.name in denied:
                    presp.error_code = pb.TOPIC_AUTHORIZATION_FAILED
                    presp.error_message = topic_refusal(AclOperation.WRITE, t.name)
                else:
                    r = next(answered)
                    presp.error_code, presp.error_message = r.error_code, r.error_message
                    presp.base_offset, presp.log_start_offset = r.base_offset, r.log_start_offset
                    presp.log_append_time = r.log_append_time
        return resp

    async def fetch(self, req: bpb.FetchRequest, ctx: Ctx) -> bytes:
        quota = self.gate.fetch
        if not quota.active:
            return await self._fetch(req, ctx)
        who, client = principal(ctx), client_id(ctx)
        await self.gate.hold_while_over(quota, who, client, "Fetch")
        body = await self._fetch(req, ctx)
        delay_ms = quota.record(who, len(body), client)
        # a serialized message and a second one concatenate as their merge: the field is added
        return body + bpb.FetchResponse(throttle_time_ms=delay_ms).SerializeToString() if delay_ms else body

    async def _fetch(self, req: bpb.FetchRequest, ctx: Ctx) -> bytes:
        """The serialized FetchResponse (FetchResponseWriter): stored batches are sent as they are."""
        nonneg(req.max_wait_ms, "max_wait_ms")
        nonneg(req.min_bytes, "min_bytes")
        nonneg(req.max_bytes, "max_bytes")
        if req.max_wait_ms > MAX_WAIT_MS:
            raise InvalidArgumentError(f"max_wait_ms must be at most {MAX_WAIT_MS}, not {req.max_wait_ms}")
        for topic in req.topics:
            for fp in topic.partitions:
                nonneg(fp.partition_max_bytes, "partition_max_bytes")
        denied = self._denied(ctx, AclOperation.READ, (t.name for t in req.topics))
        wanted = FetchInput(
            [
                FetchPartition(t.name, p.partition, p.fetch_offset, p.partition_max_bytes, p.current_leader_epoch)
                for t in req.topics
                if t.name not in denied
                for p in t.partitions
            ],
            max_wait_ms=req.max_wait_ms,
            min_bytes=req.min_bytes,
            max_bytes=req.max_bytes,
            read_committed=req.isolation_level == pb.READ_COMMITTED,
        )
        answered = iter(await self.replicas.fetch(wanted) if wanted.partitions else ())
        out = FetchResponseWriter()
        for t in req.topics:
            out.topic(t.name)
            for p in t.partitions:
                if t.name in denied:
                    refused = bpb.FetchPartitionResponse(
                        partition=p.partition, error_code=pb.TOPIC_AUTHORIZATION_FAILED,
                        error_message=topic_refusal(AclOperation.READ, t.name), high_watermark=-1,
                        last_stable_offset=-1, log_start_offset=-1, next_fetch_offset=p.fetch_offset,
                    )  # fmt: skip
                    out.partition(refused, [])
                    continue
                r = next(answered)
                sent, error_code, error_message = r.raw, r.error_code, r.error_message
                next_fetch_offset = r.next_fetch_offset
                if not req.kafka_v2_records:
                    sent, unreadable, next_fetch_offset = _sluice_encoded(r.batches, r.raw, next_fetch_offset)
                    if unreadable:
                        error_code, error_message = pb.CORRUPT_MESSAGE, unreadable
                header = bpb.FetchPartitionResponse(
                    partition=r.partition, error_code=error_code, error_message=error_message,
                    high_watermark=r.high_watermark, last_stable_offset=r.last_stable_offset,
                    log_start_offset=r.log_start_offset, next_fetch_offset=next_fetch_offset,
                    aborted_transactions=[
                        bpb.AbortedTransaction(producer_id=pid, first_offset=first) for pid, first in r.aborted
                    ],
                )  # fmt: skip
                out.partition(header, sent)
        return out.getvalue()

    async def list_offsets(self, req: bpb.ListOffsetsRequest, ctx: Ctx) -> bpb.ListOffsetsResponse:
        denied = self._denied(ctx, AclOperation.DESCRIBE, (t.name for t in req.topics))
        queries = [
            OffsetQuery(t.name, p.partition, p.timestamp)
            for t in req.topics
            if t.name not in denied
            for p in t.partitions
        ]
        read_committed = req.isolation_level == pb.READ_COMMITTED
        answered = iter(self.replicas.list_offsets(queries, read_committed) if queries else ())
        resp = bpb.ListOffsetsResponse()
        for t in req.topics:
            out = resp.topics.add(name=t.name)
            for p in t.partitions:
                if t.name in denied:
                    out.partitions.add(
                        partition=p.partition, error_code=pb.TOPIC_AUTHORIZATION_FAILED,
                        error_message=topic_refusal(AclOperation.DESCRIBE, t.name), offset=-1, timestamp=-1,
                        leader_epoch=-1,
                    )  # fmt: skip
                    continue
                a = next(answered)
                out.partitions.add(
                    partition=a.partition, error_code=a.error_code, error_message=a.error_message,
                    offset=a.offset, timestamp=a.timestamp, leader_epoch=a.leader_epoch,
                )  # fmt: skip
        return resp

    # -- topic admin ------------------------------------------------------------------------------

    async def create_topics(self, req: bpb.CreateTopicsRequest, ctx: Ctx) -> bpb.CreateTopicsResponse:
        resp = bpb.CreateTopicsResponse()
        on_cluster = not self.access.enabled or self.access.cluster(ctx, AclOperation.CREATE)
        denied = set() if on_cluster else self._denied(ctx, AclOperation.CREATE, (t.name for t in req.topics))
        for t in req.topics:
            await admin_result(
                self.cluster,
                resp.topics.add(name=t.name),
                _refused(AclOperation.CREATE, t.name)
                if t.name in denied
                else functools.partial(
                    self.cluster.create_topic,
                    t.name,
                    t.num_partitions,
                    t.replication_factor,
                    dict(t.config),
                    validate_only=req.validate_only,
                ),
            )
        return resp

    async def delete_topics(self, req: bpb.DeleteTopicsRequest, ctx: Ctx) -> bpb.DeleteTopicsResponse:
        resp = bpb.DeleteTopicsResponse()
        denied = self._denied(ctx, AclOperation.DELETE, req.names)
        for name in req.names:
            action = (
                _refused(AclOperation.DELETE, name)
                if name in denied
                else functools.partial(self.cluster.delete_topic, name)
            )
            await admin_result(self.cluster, resp.topics.add(name=name), action)
        return resp

    async def create_partitions(self, req: bpb.CreatePartitionsRequest, ctx: Ctx) -> bpb.CreatePartitionsResponse:
        resp = bpb.CreatePartitionsResponse()
        denied = self._denied(ctx, AclOperation.ALTER, (t.name for t in req.topics))
        for t in req.topics:
            await admin_result(
                self.cluster,
                resp.topics.add(name=t.name),
                _refused(AclOperation.ALTER, t.name)
                if t.name in denied
                else functools.partial(self.cluster.create_partitions, t.name, t.count, req.validate_only),
            )
        return resp

    async def alter_partition_reassignments(
        self, req: bpb.AlterPartitionReassignmentsRequest, ctx: Ctx
    ) -> bpb.AlterPartitionReassignmentsResponse:
        """Start or cancel reassignments (the Kafka listener's rules, :mod:`sluice.metadata.reassignment`)."""
        resp = bpb.AlterPartitionReassignmentsResponse()
        results: list[SluiceError | None]
        targets = [(p.topic, p.partition, None if p.cancel else list(p.replicas)) for p in req.partitions]
        named = Counter((t, i) for t, i, _ in targets)
        if self.access.enabled and not self.access.cluster(ctx, AclOperation.ALTER):
            refused = errors.ClusterAuthorizationFailedError("not authorized to Alter the cluster (no ACL allows it)")
            results = [refused] * len(targets)
        else:
            wanted = [i for i, (t, p, _) in enumerate(targets) if named[(t, p)] == 1]
            results = [
                errors.InvalidRequestError(f"{t}-{p} is named more than once in one request") for t, p, _ in targets
            ]
            try:
                answered = await self.cluster.admin(
                    self.cluster.alter_partition_reassignments,
                    [targets[i] for i in wanted],
                    allow_replication_factor_change=not req.disallow_replication_factor_change,
                )
            except SluiceError as exc:  # the store cut off: every partition is answered with it
                answered = [exc] * len(wanted)
            for i, result in zip(wanted, answered, strict=True):
                results[i] = result
        for (topic, partition, _), result in zip(targets, results, strict=True):
            out = resp.partitions.add(topic=topic, partition=partition)
            if result is not None:
                out.error_code, out.error_message = result.code, result.message
        return resp

    async def list_partition_reassignments(
        self, req: bpb.ListPartitionReassignmentsRequest, ctx: Ctx
    ) -> bpb.ListPartitionReassignmentsResponse:
        """The reassignments in progress (among the partitions named, or all), from the cluster view."""
        resp = bpb.ListPartitionReassignmentsResponse()
        if self.access.enabled and not self.access.cluster(ctx, AclOperation.DESCRIBE):
            resp.error_code = pb.CLUSTER_AUTHORIZATION_FAILED
            resp.error_message = "not authorized to Describe the cluster (no ACL allows it)"
            return resp
        wanted = [(p.topic, p.partition) for p in req.partitions] or None
        try:
            ongoing = await self.cluster.admin(self.cluster.list_partition_reassignments, wanted)
        except SluiceError as exc:  # the store cut off
            resp.error_code, resp.error_message = exc.code, exc.message
            return resp
        for topic, partition, state in ongoing:
            resp.reassignments.add(
                topic=topic,
                partition=partition,
                replicas=state.replicas,
                adding_replicas=state.adding_replicas,
                removing_replicas=state.removing_replicas,
            )
        return resp

    async def describe_log_dirs(self, req: bpb.DescribeLogDirsRequest, ctx: Ctx) -> bpb.DescribeLogDirsResponse:
        """This broker's log directory and the size of each replica it holds (Kafka's DescribeLogDirs,
        as the Kafka listener answers it): what a rebalance plan weighs its moves by."""
        data_dir = self.cluster.config.data_dir
        resp = bpb.DescribeLogDirsResponse(
            broker_id=self.cluster.config.broker_id, log_dir=data_dir, total_bytes=-1, usable_bytes=-1
        )
        if self.access.enabled and not self.access.cluster(ctx, AclOperation.DESCRIBE):
            resp.error_code = pb.CLUSTER_AUTHORIZATION_FAILED
            resp.error_message = "not authorized to Describe the cluster (no ACL allows it)"
            return resp
        failure = self.replicas.storage.failure
        if failure is not None:
            resp.error_code, resp.error_message = pb.KAFKA_STORAGE_ERROR, f"the log directory has failed: {failure}"
            return resp
        try:
            space = read_space(data_dir)
            resp.total_bytes, resp.usable_bytes = space.size_bytes, space.free_bytes
        except OSError:
            pass  # -1: unknown
        held = sorted(self.replicas.partitions)
        if req.partitions:
            wanted = {(p.topic, p.partition) for p in req.partitions}
            held = [key for key in held if key in wanted]
        for topic, partition in held:
            log = self.replicas.partitions.get((topic, partition))
            if log is not None:  # deleted meanwhile
                resp.partitions.add(topic=topic, partition=partition, size_bytes=log.size_bytes)
        return resp

    async def alter_topic_configs(self, req: bpb.AlterTopicConfigsRequest, ctx: Ctx) -> bpb.AlterTopicConfigsResponse:
        """Kafka's IncrementalAlterConfigs on topics: the cluster view applies it (the Kafka listener's rules)."""
        resp = bpb.AlterTopicConfigsResponse()
        named = Counter(t.name for t in req.topics)
        denied = self._denied(ctx, AclOperation.ALTER_CONFIGS, named)
        for t in req.topics:
            changes = [ConfigChange(c.key, c.operation, c.value if c.HasField("value") else None) for c in t.configs]

            def alter(name: str = t.name, changes: list[ConfigChange] = changes) -> str:
                if named[name] > 1:
                    raise errors.InvalidRequestError(f"topic {name!r} is named more than once in one request")
                self.cluster.alter_topic_config(name, changes, validate_only=req.validate_only)
                return self.cluster.topics[name].topic_id if name in self.cluster.topics else ""

            await admin_result(
                self.cluster,
                resp.topics.add(name=t.name),
                _refused(AclOperation.ALTER_CONFIGS, t.name) if t.name in denied else alter,
            )
        return resp

    # -- coordinators -----------------------------------------------------------------------------

    async def find_coordinator(self, req: bpb.FindCoordinatorRequest, ctx: Ctx) -> bpb.FindCoordinatorResponse:
        if not req.key:
            raise InvalidArgumentError("key (group id or transactional id) must not be empty")
        found = self.gate.find_coordinator(self.cluster, ctx, req.key, req.key_type)
        if found.refusal is not None:
            return bpb.FindCoordinatorResponse(
                node_id=-1, error_code=found.refusal.code, error_message=found.refusal.message
            )
        endpoint = self.cluster.brokers[found.broker_id]
        return bpb.FindCoordinatorResponse(node_id=endpoint.broker_id, host=endpoint.host, port=endpoint.port)

    async def init_producer_id(self, req: bpb.InitProducerIdRequest, ctx: Ctx) -> bpb.InitProducerIdResponse:
        refused = checks.check_init_producer_id(self.access, ctx, req.transactional_id) or self.gate.take_producer_id(
            principal(ctx), req.producer_id
        )
        if refused is not None:
            return bpb.InitProducerIdResponse(
                producer_id=-1, producer_epoch=-1, error_code=refused.code, error_message=refused.message
            )
        return _handle_response(
            bpb.InitProducerIdResponse,
            await self.txn.init_producer_id(
                InitProducerIdInput(
                    req.transactional_id,
                    req.transaction_timeout_ms,
                    req.producer_id,
                    req.producer_epoch,
                    req.keep_prepared_txn,
                    req.abort_prepared_txn,
                )
            ),
        )

    async def add_partitions_to_txn(
        self, req: bpb.AddPartitionsToTxnRequest, ctx: Ctx
    ) -> bpb.AddPartitionsToTxnResponse:
        pairs = [(t.name, p) for t in req.topics for p in t.partitions]
        refused = checks.check_add_partitions(self.access, ctx, req.transactional_id, pairs)
        if refused is not None:
            answers = [PartitionAnswer(t, p, r.code, r.message) for t, p, r in refused]
        else:
            answers = await self.txn.add_partitions_to_txn(_txn_handle(req), pairs)
        return bpb.AddPartitionsToTxnResponse(results=_partition_results(answers))

    async def add_offsets_to_txn(self, req: bpb.AddOffsetsToTxnRequest, ctx: Ctx) -> bpb.AddOffsetsToTxnResponse:
        refused = checks.check_txn_id(self.access, ctx, req.transactional_id) or checks.check_group(
            self.access, ctx, AclOperation.READ, req.group_id
        )
        if refused is not None:
            return bpb.AddOffsetsToTxnResponse(error_code=refused.code, error_message=refused.message)
        outcome = await self.txn.add_offsets_to_txn(_txn_handle(req), req.group_id)
        return bpb.AddOffsetsToTxnResponse(error_code=outcome.error_code, error_message=outcome.error_message)

    async def end_txn(self, req: bpb.EndTxnRequest, ctx: Ctx) -> bpb.EndTxnResponse:
        refused = checks.check_txn_id(self.access, ctx, req.transactional_id)
        if refused is not None:
            return bpb.EndTxnResponse(
                producer_id=-1, producer_epoch=-1, error_code=refused.code, error_message=refused.message
            )
        ended = await self.txn.end_txn(_txn_handle(req), req.committed, prepared_only=req.prepared)
        return _handle_response(bpb.EndTxnResponse, ended)

    async def prepare_txn(self, req: bpb.PrepareTxnRequest, ctx: Ctx) -> bpb.PrepareTxnResponse:
        refused = checks.check_txn_id(self.access, ctx, req.transactional_id)
        if refused is not None:
            return bpb.PrepareTxnResponse(
                error_code=refused.code, error_message=refused.message, producer_id=-1, producer_epoch=-1
            )
        return _handle_response(bpb.PrepareTxnResponse, await self.txn.prepare_txn(_txn_handle(req)))

    async def describe_transactions(
        self, req: bpb.DescribeTransactionsRequest, ctx: Ctx
    ) -> bpb.DescribeTransactionsResponse:
        allowed, refused = checks.filter_describe_transactions(self.access, ctx, req.transactional_ids)
        described = self.txn.describe_transactions(allowed) if allowed else []
        described += [TxnDescription(t, r.code, r.message) for t, r in refused.items()]
        # As Kafka (and the Kafka listener): a transaction lists only the partitions of topics the
        # caller may Describe.
        hidden = self._denied(ctx, AclOperation.DESCRIBE, (t for d in described for t, _p in d.partitions))
        for d in described:
            d.partitions = [(t, p) for t, p in d.partitions if t not in hidden]
        return bpb.DescribeTransactionsResponse(transactions=[transaction_state(d) for d in described])

    async def list_transactions(self, req: bpb.ListTransactionsRequest, ctx: Ctx) -> bpb.ListTransactionsResponse:
        nonneg(req.duration_filter_ms, "duration_filter_ms")
        listed = self.txn.list_transactions(
            ListTransactionsInput(
                frozenset(req.state_filters), frozenset(req.producer_id_filters), req.duration_filter_ms
            )
        )
        visible = checks.listable_txn_ids(self.access, ctx, (t.transactional_id for t in listed.transactions))
        return bpb.ListTransactionsResponse(
            error_code=listed.error_code,
            transactions=[
                bpb.ListedTransaction(
                    transactional_id=t.transactional_id,
                    producer_id=t.producer_id,
                    producer_epoch=t.producer_epoch,
                    state=t.state,
                    coordinator_id=t.coordinator_id,
                )
                for t in listed.transactions
                if t.transactional_id in visible
            ],
        )

    async def describe_producers(self, req: bpb.DescribeProducersRequest, ctx: Ctx) -> bpb.DescribeProducersResponse:
        """The producers with state on each partition (this broker must lead it); Read on the topic, as Kafka."""
        denied = self._denied(ctx, AclOperation.READ, (p.topic for p in req.partitions))
        resp = bpb.DescribeProducersResponse()
        for tp in req.partitions:
            out = resp.partitions.add(topic=tp.topic, partition=tp.partition)
            if tp.topic in denied:
                out.error_code = pb.TOPIC_AUTHORIZATION_FAILED
                out.error_message = topic_refusal(AclOperation.READ, tp.topic)
                continue
            try:
                found = self.replicas.describe_producers(tp.topic, tp.partition)
            except SluiceError as exc:
                answer(out, exc)
                continue
            out.active_producers.extend(
                bpb.ActiveProducer(
                    producer_id=p.producer_id, producer_epoch=p.producer_epoch, last_sequence=p.last_sequence,
                    last_timestamp=p.last_timestamp, coordinator_epoch=p.coordinator_epoch,
                    current_txn_start_offset=p.current_txn_start_offset,
                )
                for p in found
            )  # fmt: skip
        return resp

    async def abort_transaction(self, req: bpb.AbortTransactionRequest, ctx: Ctx) -> bpb.AbortTransactionResponse:
        """Abort a hanging transaction on one partition (this broker must lead it): ClusterAction on
        the cluster, which Kafka's WriteTxnMarkers needs, since it ends another producer's transaction."""
        resp = bpb.AbortTransactionResponse(marker_offset=-1)
        if self.access.enabled and not self.access.cluster(ctx, AclOperation.CLUSTER_ACTION):
            resp.error_code = pb.CLUSTER_AUTHORIZATION_FAILED
            resp.error_message = "aborting another producer's transaction needs ClusterAction on the cluster"
            return resp
        try:
            resp.marker_offset = await self.replicas.abort_hanging_transaction(
                req.topic, req.partition, req.producer_id, req.producer_epoch, req.coordinator_epoch
            )
        except SluiceError as exc:
            answer(resp, exc)
        return resp

    async def txn_offset_commit(self, req: bpb.TxnOffsetCommitRequest, ctx: Ctx) -> bpb.TxnOffsetCommitResponse:
        commit = commit_input(req)
        pairs = [(o.topic, o.partition) for o in commit.offsets]
        refused = checks.check_offset_commit(self.access, ctx, req.group_id, pairs, req.transactional_id)
        if refused is not None:
            answers = [PartitionAnswer(t, p, r.code, r.message) for t, p, r in refused]
        else:
            txn = TxnOffsetCommitInput(commit, req.transactional_id, req.producer_id, req.producer_epoch)
            answers = await self.groups.txn_offset_commit(txn)
        return bpb.TxnOffsetCommitResponse(results=_partition_results(answers))

    async def offset_commit(self, req: bpb.OffsetCommitRequest, ctx: Ctx) -> bpb.OffsetCommitResponse:
        commit = commit_input(req)
        pairs = [(o.topic, o.partition) for o in commit.offsets]
        refused = checks.check_offset_commit(self.access, ctx, req.group_id, pairs)
        if refused is not None:
            answers = [PartitionAnswer(t, p, r.code, r.message) for t, p, r in refused]
        else:
            answers = await self.groups.offset_commit(commit)
        return bpb.OffsetCommitResponse(results=_partition_results(answers))

    async def offset_fetch(self, req: bpb.OffsetFetchRequest, ctx: Ctx) -> bpb.OffsetFetchResponse:
        refused = checks.check_offset_fetch(self.access, ctx, req.group_id)
        if refused is not None:
            return bpb.OffsetFetchResponse(error_code=refused.code, error_message=refused.message)
        wanted = tuple((p.topic, p.partition) for p in req.partitions) or None  # none named: all of them
        found = await self.groups.offset_fetch(OffsetFetchInput(req.group_id, wanted, req.require_stable))
        # Partitions of topics the caller may not Describe: TOPIC_AUTHORIZATION_FAILED, no offset.
        denied = self._denied(ctx, AclOperation.DESCRIBE, (p.topic for p in found.partitions))
        resp = bpb.OffsetFetchResponse(error_code=found.error_code, error_message=found.error_message)
        for p in found.partitions:
            if p.topic in denied:
                p = FetchedOffset(
                    p.topic, p.partition, error_code=pb.TOPIC_AUTHORIZATION_FAILED,
                    error_message=topic_refusal(AclOperation.DESCRIBE, p.topic),
                )  # fmt: skip
            resp.partitions.add(
                topic=p.topic, partition=p.partition, committed_offset=p.offset, committed_leader_epoch=p.leader_epoch,
                metadata=p.metadata, error_code=p.error_code, error_message=p.error_message,
            )  # fmt: skip
        return resp

    async def heartbeat(self, req: bpb.ConsumerGroupHeartbeatRequest, ctx: Ctx) -> bpb.ConsumerGroupHeartbeatResponse:
        refused = checks.check_heartbeat(self.access, ctx, req.group_id, req.subscribed_topic_names)
        if refused is not None:
            return bpb.ConsumerGroupHeartbeatResponse(
                error_code=refused.code, error_message=refused.message, member_id=req.member_id,
                member_epoch=req.member_epoch,
            )  # fmt: skip
        return heartbeat_response(await self.groups.member_heartbeat(req.group_id, heartbeat_input(req)))

    # -- group administration (kafka-consumer-groups.sh), with Kafka's checks: Describe on a group
    # to list or describe it (groups the caller may not see are left out of a list), Delete to delete.

    async def list_groups(self, req: bpb.ListGroupsRequest, ctx: Ctx) -> bpb.ListGroupsResponse:
        listed = await self.group_admin.list_groups(req.states_filter)
        return bpb.ListGroupsResponse(
            error_code=listed.error_code,
            error_message=listed.error_message,
            groups=[
                bpb.ListedGroup(group_id=g.group_id, state=g.state, coordinator_id=g.coordinator_id)
                for g in listed.groups
                if checks.check_group(self.access, ctx, AclOperation.DESCRIBE, g.group_id) is None
            ],
        )

    async def describe_groups(self, req: bpb.DescribeGroupsRequest, ctx: Ctx) -> bpb.DescribeGroupsResponse:
        refused = self._group_refusals(ctx, AclOperation.DESCRIBE, req.group_ids)
        allowed = [g for g in req.group_ids if g not in refused]
        by_id = {g.group_id: g for g in await self.group_admin.describe_groups(allowed)}
        return bpb.DescribeGroupsResponse(
            groups=[
                bpb.DescribedGroup(group_id=g, error_code=refused[g].code, error_message=refused[g].message)
                if g in refused
                else _described_group(by_id[g])
                for g in req.group_ids
            ]
        )

    async def delete_groups(self, req: bpb.DeleteGroupsRequest, ctx: Ctx) -> bpb.DeleteGroupsResponse:
        refused = self._group_refusals(ctx, AclOperation.DELETE, req.group_ids)
        answered = await self.group_admin.delete_groups(g for g in req.group_ids if g not in refused)
        outcomes = {**answered, **{g: Outcome(r.code, r.message) for g, r in refused.items()}}
        return bpb.DeleteGroupsResponse(
            results=[
                bpb.DeletedGroup(group_id=g, error_code=outcomes[g].error_code, error_message=outcomes[g].error_message)
                for g in req.group_ids
            ]
        )

    def _group_refusals(self, ctx: Ctx, op: AclOperation, group_ids: Iterable[str]) -> dict[str, Refusal]:
        """GROUP_AUTHORIZATION_FAILED for each group the caller may not ``op``."""
        out = {}
        for g in group_ids:
            refusal = checks.check_group(self.access, ctx, op, g)
            if refusal is not None:
                out[g] = refusal
        return out


_HandleResponse = TypeVar("_HandleResponse", bpb.InitProducerIdResponse, bpb.EndTxnResponse, bpb.PrepareTxnResponse)


def _handle_response(kind: type[_HandleResponse], a: HandleAnswer) -> _HandleResponse:
    """The gRPC answer of a call that answers a producer handle."""
    resp = kind(
        producer_id=a.producer_id, producer_epoch=a.producer_epoch, error_code=a.error_code,
        error_message=a.error_message,
    )  # fmt: skip
    if isinstance(resp, bpb.InitProducerIdResponse):
        resp.previous_state = a.previous_state
    return resp


def _txn_handle(
    req: bpb.AddPartitionsToTxnRequest | bpb.AddOffsetsToTxnRequest | bpb.EndTxnRequest | bpb.PrepareTxnRequest,
) -> TxnHandle:
    version = 1 if isinstance(req, bpb.PrepareTxnRequest) else req.transaction_version
    return TxnHandle(req.transactional_id, req.producer_id, req.producer_epoch, version)


def transaction_state(d: TxnDescription) -> bpb.TransactionState:
    """DescribeTransactions' gRPC answer for one id (brokers ask it of each other too: KIP-890 verification)."""
    return bpb.TransactionState(
        transactional_id=d.transactional_id, error_code=d.error_code, error_message=d.error_message, state=d.state,
        producer_id=d.producer_id, producer_epoch=d.producer_epoch, transaction_timeout_ms=d.transaction_timeout_ms,
        transaction_start_time_ms=d.transaction_start_time_ms, last_update_time_ms=d.last_update_time_ms,
        coordinator_id=d.coordinator_id, resume_producer_id=d.resume_producer_id,
        resume_producer_epoch=d.resume_producer_epoch,
        partitions=[pb.TopicPartition(topic=t, partition=p) for t, p in d.partitions],
    )  # fmt: skip


def _partition_results(answers: Iterable[PartitionAnswer]) -> list[bpb.TxnPartitionResult]:
    return [
        bpb.TxnPartitionResult(
            topic=a.topic, partition=a.partition, error_code=a.error_code, error_message=a.error_message
        )
        for a in answers
    ]


def commit_input(req: bpb.OffsetCommitRequest | bpb.TxnOffsetCommitRequest) -> OffsetCommitInput:
    """The commit a gRPC OffsetCommit or TxnOffsetCommit carries."""
    return OffsetCommitInput(
        group_id=req.group_id,
        offsets=tuple(
            CommitOffset(t.name, p.partition, p.committed_offset, p.committed_leader_epoch, p.metadata)
            for t in req.topics
            for p in t.partitions
        ),
        member_id=req.member_id,
        member_epoch=req.member_epoch,
        instance_id=req.group_instance_id if req.HasField("group_instance_id") else None,
    )


def heartbeat_input(req: bpb.ConsumerGroupHeartbeatRequest) -> HeartbeatInput:
    """A gRPC ConsumerGroupHeartbeat as the group coordinator takes it."""
    names = tuple(req.subscribed_topic_names)
    return HeartbeatInput(
        member_id=req.member_id,
        member_epoch=req.member_epoch,
        subscription=None if req.subscription_unchanged and not names else names,
        owned=frozenset((owned.topic, owned.partition) for owned in req.owned_partitions),
        session_timeout_ms=req.session_timeout_ms,
        rebalance_timeout_ms=req.rebalance_timeout_ms,
    )


def heartbeat_response(a: HeartbeatAnswer) -> bpb.ConsumerGroupHeartbeatResponse:
    return bpb.ConsumerGroupHeartbeatResponse(
        member_id=a.member_id, member_epoch=a.member_epoch, heartbeat_interval_ms=a.heartbeat_interval_ms,
        error_code=a.error_code, error_message=a.error_message,
        assignment=[pb.TopicPartition(topic=t, partition=p) for t, p in a.assignment],
    )  # fmt: skip


def _tps(tps: Iterable[tuple[str, int]]) -> list[pb.TopicPartition]:
    return [pb.TopicPartition(topic=t, partition=p) for t, p in tps]


def _described_group(d: GroupDescription) -> bpb.DescribedGroup:
    return bpb.DescribedGroup(
        group_id=d.group_id, coordinator_id=d.coordinator_id, error_code=d.error_code, error_message=d.error_message,
        state=d.state, group_epoch=d.group_epoch,
        members=[
            bpb.DescribedGroupMember(
                member_id=m.member_id, member_epoch=m.member_epoch, subscribed_topic_names=m.subscribed_topic_names,
                assignment=_tps(m.assignment), target_assignment=_tps(m.target_assignment),
            )
            for m in d.members
        ],
    )  # fmt: skip
