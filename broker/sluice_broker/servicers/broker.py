"""sluice.v1.Broker: the service clients call.

Each method checks what the core cannot (sizes that must not be negative,
a key that must not be empty) and hands the request over: data-path requests
to the :class:`~sluice.broker.replica_manager.ReplicaManager`, topic admin to the
:class:`~sluice.broker.cluster.ClusterView`, transactions and groups to their
coordinators. Metadata and FindCoordinator are answered from the cluster view.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import grpc

from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.cluster import (
    CONSUMER_OFFSETS_TOPIC,
    INTERNAL_TOPICS,
    TRANSACTION_STATE_TOPIC,
    ClusterView,
    TopicInfo,
    coordinator_partition,
)
from sluice.broker.errors import InvalidArgumentError, SluiceError, answer
from sluice.broker.group import GroupCoordinator
from sluice.broker.replica_manager import ReplicaManager
from sluice.broker.servicers.group_admin import GroupAdmin
from sluice.broker.servicers.registration import Ctx, nonneg, service
from sluice.broker.txn import TransactionCoordinator

MAX_WAIT_MS = 300_000  # the longest a Fetch may ask to wait


def admin_result(result: Any, action: Callable[[], str]) -> None:
    """Fill one topic's result of a topic-admin request: the topic id, or the refusal's code and message."""
    try:
        result.topic_id = action()
    except SluiceError as exc:
        answer(result, exc)


class BrokerService:
    """sluice.v1.Broker."""

    def __init__(
        self,
        cluster: ClusterView,
        replicas: ReplicaManager,
        txn: TransactionCoordinator,
        groups: GroupCoordinator,
    ) -> None:
        self.cluster = cluster
        self.replicas = replicas
        self.txn = txn
        self.groups = groups
        self.group_admin = GroupAdmin(groups, cluster.config.broker_id)

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
                "FindCoordinator": (self.find_coordinator, b.FindCoordinatorRequest),
                "InitProducerId": (lambda r, c: self.txn.init_producer_id(r), b.InitProducerIdRequest),
                "AddPartitionsToTxn": (lambda r, c: self.txn.add_partitions_to_txn(r), b.AddPartitionsToTxnRequest),
                "AddOffsetsToTxn": (lambda r, c: self.txn.add_offsets_to_txn(r), b.AddOffsetsToTxnRequest),
                "EndTxn": (lambda r, c: self.txn.end_txn(r), b.EndTxnRequest),
                "PrepareTxn": (lambda r, c: self.txn.prepare_txn(r), b.PrepareTxnRequest),
                "DescribeTransactions": (self.describe_transactions, b.DescribeTransactionsRequest),
                "ListTransactions": (self.list_transactions, b.ListTransactionsRequest),
                "TxnOffsetCommit": (lambda r, c: self.groups.txn_offset_commit(r), b.TxnOffsetCommitRequest),
                "OffsetCommit": (lambda r, c: self.groups.offset_commit(r), b.OffsetCommitRequest),
                "OffsetFetch": (lambda r, c: self.groups.offset_fetch(r), b.OffsetFetchRequest),
                "ConsumerGroupHeartbeat": (
                    lambda r, c: self.groups.heartbeat(r),
                    b.ConsumerGroupHeartbeatRequest,
                ),
                "ListGroups": (lambda r, c: self.group_admin.list_groups(r), b.ListGroupsRequest),
                "DescribeGroups": (lambda r, c: self.group_admin.describe_groups(r), b.DescribeGroupsRequest),
                "DeleteGroups": (lambda r, c: self.group_admin.delete_groups(r), b.DeleteGroupsRequest),
            },
            self.replicas.events,
        )

    # -- metadata ---------------------------------------------------------------------------------

    async def metadata(self, req: bpb.MetadataRequest, _ctx: Ctx) -> bpb.MetadataResponse:
        self.cluster.refresh()
        resp = bpb.MetadataResponse(cluster_id=self.cluster.cluster_id, controller_id=-1)
        for b in sorted(self.cluster.brokers.values(), key=lambda b: b.broker_id):
            resp.brokers.add(broker_id=b.broker_id, host=b.host, port=b.port, rack=b.rack)
        names = list(req.topics) or sorted(
            n for n in self.cluster.topics if req.include_internal or n not in INTERNAL_TOPICS
        )
        for name in names:
            info = self.cluster.topics.get(name)
            if info is None:
                resp.topics.add(
                    name=name,
                    error_code=pb.UNKNOWN_TOPIC_OR_PARTITION,
                    error_message=f"topic {name!r} does not exist",
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
                leader=part.leader,
                leader_epoch=part.leader_epoch,
                replicas=part.replicas,
                isr=part.isr,
            )

    # -- data path --------------------------------------------------------------------------------

    async def produce(self, req: bpb.ProduceRequest, _ctx: Ctx) -> bpb.ProduceResponse:
        nonneg(req.timeout_ms, "timeout_ms")
        return await self.replicas.produce(req)

    async def fetch(self, req: bpb.FetchRequest, _ctx: Ctx) -> bytes:
        nonneg(req.max_wait_ms, "max_wait_ms")
        nonneg(req.min_bytes, "min_bytes")
        nonneg(req.max_bytes, "max_bytes")
        if req.max_wait_ms > MAX_WAIT_MS:
            raise InvalidArgumentError(f"max_wait_ms must be at most {MAX_WAIT_MS}, not {req.max_wait_ms}")
        for topic in req.topics:
            for fp in topic.partitions:
                nonneg(fp.partition_max_bytes, "partition_max_bytes")
        return await self.replicas.fetch(req)

    async def list_offsets(self, req: bpb.ListOffsetsRequest, _ctx: Ctx) -> bpb.ListOffsetsResponse:
        return self.replicas.list_offsets(req)

    # -- topic admin ------------------------------------------------------------------------------

    async def create_topics(self, req: bpb.CreateTopicsRequest, _ctx: Ctx) -> bpb.CreateTopicsResponse:
        resp = bpb.CreateTopicsResponse()
        for t in req.topics:
            admin_result(
                resp.topics.add(name=t.name),
                functools.partial(
                    self.cluster.create_topic,
                    t.name,
                    t.num_partitions,
                    t.replication_factor,
                    dict(t.config),
                    validate_only=req.validate_only,
                ),
            )
        return resp

    async def delete_topics(self, req: bpb.DeleteTopicsRequest, _ctx: Ctx) -> bpb.DeleteTopicsResponse:
        resp = bpb.DeleteTopicsResponse()
        for name in req.names:
            admin_result(resp.topics.add(name=name), functools.partial(self.cluster.delete_topic, name))
        return resp

    async def create_partitions(self, req: bpb.CreatePartitionsRequest, _ctx: Ctx) -> bpb.CreatePartitionsResponse:
        resp = bpb.CreatePartitionsResponse()
        for t in req.topics:
            admin_result(
                resp.topics.add(name=t.name),
                functools.partial(self.cluster.create_partitions, t.name, t.count, req.validate_only),
            )
        return resp

    # -- coordinators -----------------------------------------------------------------------------

    async def find_coordinator(self, req: bpb.FindCoordinatorRequest, _ctx: Ctx) -> bpb.FindCoordinatorResponse:
        if not req.key:
            raise InvalidArgumentError("key (group id or transactional id) must not be empty")
        topic = TRANSACTION_STATE_TOPIC if req.key_type == bpb.TRANSACTION else CONSUMER_OFFSETS_TOPIC
        info = self.cluster.topics.get(topic)
        resp = bpb.FindCoordinatorResponse(node_id=-1)
        if info is None:
            resp.error_code = pb.COORDINATOR_NOT_AVAILABLE
            resp.error_message = f"{topic} does not exist yet"
            return resp
        leader = info.partitions[coordinator_partition(req.key, len(info.partitions))].leader
        endpoint = self.cluster.brokers.get(leader)
        if endpoint is None:
            resp.error_code = pb.COORDINATOR_NOT_AVAILABLE
            resp.error_message = f"the coordinator partition of {req.key!r} has no live leader"
            return resp
        resp.node_id, resp.host, resp.port = endpoint.broker_id, endpoint.host, endpoint.port
        return resp

    async def describe_transactions(
        self, req: bpb.DescribeTransactionsRequest, _ctx: Ctx
    ) -> bpb.DescribeTransactionsResponse:
        return self.txn.describe_transactions(req)

    async def list_transactions(self, req: bpb.ListTransactionsRequest, _ctx: Ctx) -> bpb.ListTransactionsResponse:
        nonneg(req.duration_filter_ms, "duration_filter_ms")
        return self.txn.list_transactions(req)
