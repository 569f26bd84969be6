"""AlterPartitionReassignments and ListPartitionReassignments (Kafka's KIP-455 admin APIs).

What ``kafka-reassign-partitions --execute / --verify / --cancel`` and ``Admin.alterPartitionReassignments``
/ ``listPartitionReassignments`` send. Thin over the cluster view: a target replica list starts a
reassignment and a null one cancels it (:meth:`~sluice.broker.cluster.ClusterView.alter_partition_reassignments`,
the rules in :mod:`sluice.metadata.reassignment`); the controller completes it. A refusal is per
partition, with Kafka's code: UNKNOWN_TOPIC_OR_PARTITION, INVALID_REPLICA_ASSIGNMENT (empty list,
a broker twice, an unknown broker), INVALID_REPLICATION_FACTOR (v1 with
``allow_replication_factor_change`` false), NO_REASSIGNMENT_IN_PROGRESS (cancel of a partition
that is not moving). The answer comes once the reassignment is *recorded*, as Kafka's does;
``--verify`` (ListPartitionReassignments plus Metadata) tells when it is done.

Authorization (Kafka's): Alter on the cluster for AlterPartitionReassignments, Describe on the
cluster for ListPartitionReassignments; without it the whole request is refused with
CLUSTER_AUTHORIZATION_FAILED (and every partition carries it, as Kafka's error response does).
"""

from __future__ import annotations

from collections import Counter

from sluice import errors
from sluice.acls import AclOperation
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.kafka import authorization
from sluice.broker.kafka.context import KafkaContext
from sluice.broker.kafka_wire.codec import Message, Versions
from sluice.broker.kafka_wire.messages.alter_partition_reassignments_request import (
    AlterPartitionReassignmentsRequest,
)
from sluice.broker.kafka_wire.messages.alter_partition_reassignments_response import (
    AlterPartitionReassignmentsResponse,
    ReassignablePartitionResponse,
    ReassignableTopicResponse,
)
from sluice.broker.kafka_wire.messages.list_partition_reassignments_request import ListPartitionReassignmentsRequest
from sluice.broker.kafka_wire.messages.list_partition_reassignments_response import (
    ListPartitionReassignmentsResponse,
    OngoingPartitionReassignment,
    OngoingTopicReassignment,
)
from sluice.broker.kafka_wire.messages.request_header import RequestHeader
from sluice.errors import SluiceError


class AlterPartitionReassignmentsHandler:
    api_key = 45
    versions = Versions(0, 1)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, AlterPartitionReassignmentsRequest)
        resp = AlterPartitionReassignmentsResponse(
            allow_replication_factor_change=request.allow_replication_factor_change, error_message=None
        )
        refused: SluiceError | None = None
        if not authorization.cluster_allowed(ctx, AclOperation.ALTER):
            refused = errors.ClusterAuthorizationFailedError(authorization.cluster_refusal(AclOperation.ALTER))
            resp.error_code, resp.error_message = int(refused.code), refused.message
        targets = [(t.name, p.partition_index, p.replicas) for t in request.topics for p in t.partitions]
        counts = Counter((n, i) for n, i, _ in targets)
        duplicates = {key for key, count in counts.items() if count > 1}  # Kafka: INVALID_REQUEST for each
        results: list[SluiceError | None] = [refused] * len(targets)
        if refused is None:
            wanted = [i for i, (n, p, _) in enumerate(targets) if (n, p) not in duplicates]
            answered: list[SluiceError | None]
            try:
                answered = await ctx.cluster.admin(
                    ctx.cluster.alter_partition_reassignments,
                    [targets[i] for i in wanted],
                    allow_replication_factor_change=request.allow_replication_factor_change,
                )
            except SluiceError as exc:  # the store cut off: every partition is answered with it (retriable)
                answered = [exc] * len(wanted)
            for i, result in zip(wanted, answered, strict=True):
                results[i] = result
            for i, (n, p, _) in enumerate(targets):
                if (n, p) in duplicates:
                    results[i] = errors.InvalidRequestError(f"{n}-{p} is named more than once")
        by_topic: dict[str, ReassignableTopicResponse] = {}
        for (name, index, _), result in zip(targets, results, strict=True):
            topic = by_topic.get(name)
            if topic is None:
                topic = by_topic[name] = ReassignableTopicResponse(name=name)
                resp.responses.append(topic)
            partition = ReassignablePartitionResponse(partition_index=index, error_message=None)
            if result is not None:
                partition.error_code, partition.error_message = int(result.code), result.message
            topic.partitions.append(partition)
        return resp


class ListPartitionReassignmentsHandler:
    api_key = 46
    versions = Versions(0, 0)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, ListPartitionReassignmentsRequest)
        resp = ListPartitionReassignmentsResponse(error_message=None)
        if not authorization.cluster_allowed(ctx, AclOperation.DESCRIBE):
            resp.error_code = pb.CLUSTER_AUTHORIZATION_FAILED
            resp.error_message = authorization.cluster_refusal(AclOperation.DESCRIBE)
            return resp
        wanted = None if request.topics is None else [(t.name, i) for t in request.topics for i in t.partition_indexes]
        try:
            ongoing = await ctx.cluster.admin(ctx.cluster.list_partition_reassignments, wanted)
        except SluiceError as exc:  # the store cut off
            resp.error_code, resp.error_message = int(exc.code), exc.message
            return resp
        by_topic: dict[str, OngoingTopicReassignment] = {}
        for name, index, state in ongoing:
            topic = by_topic.get(name)
            if topic is None:
                topic = by_topic[name] = OngoingTopicReassignment(name=name)
                resp.topics.append(topic)
            topic.partitions.append(
                OngoingPartitionReassignment(
                    partition_index=index,
                    replicas=list(state.replicas),
                    adding_replicas=list(state.adding_replicas),
                    removing_replicas=list(state.removing_replicas),
                )
            )
        return resp
