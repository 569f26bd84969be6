"""Authorization on the Kafka listener: what each API needs, asked of the broker's one authorizer.

Every decision is :class:`~sluice.broker.security.authorizer.Access`'s, the very object the
gRPC servicers ask (one ACL set followed from the metadata store, super users, the brokers'
own certificates, TransactionalId ``allowedUsers``, deny by default), asked about the
connection's :class:`~sluice.broker.security.peers.Caller` (``ctx.caller``). The coordinator
APIs go through the functions the gRPC servicer calls
(:mod:`sluice.broker.security.coordinator_checks`), so one rule serves both protocols; the
helpers below serve the rest. What each API needs, as Kafka's ``KafkaApis`` checks it, and what
a refusal answers (every code non-retriable):

* Produce: Write on each topic (TOPIC_AUTHORIZATION_FAILED per partition, the rest served);
  with transactional batches, Write on the transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED
  on every partition, nothing appended).
* Fetch: Read on each topic; ListOffsets: Describe; DescribeProducers: Read;
  OffsetForLeaderEpoch: Describe, or ClusterAction on the cluster for all (per partition).
* Metadata: Describe on each topic: TOPIC_AUTHORIZATION_FAILED for a topic asked by name
  (whether it exists is not said), left out of the all-topics list.
* CreateTopics: Create on the cluster or the topic; DeleteTopics: Delete (and Describe for a
  topic named by id, else no name is returned); CreatePartitions: Alter (per topic).
* DescribeConfigs: DescribeConfigs on the topic (TOPIC_AUTHORIZATION_FAILED), on the cluster for
  a broker (CLUSTER_AUTHORIZATION_FAILED), per resource; IncrementalAlterConfigs: AlterConfigs,
  the same way.
* DescribeClientQuotas: DescribeConfigs on the cluster (the whole request); AlterClientQuotas:
  AlterConfigs on the cluster (each entry CLUSTER_AUTHORIZATION_FAILED).
* FindCoordinator: Describe on the group / transactional id (GROUP_ / TRANSACTIONAL_ID_
  AUTHORIZATION_FAILED, per key).
* InitProducerId: Write on the transactional id; without one IdempotentWrite on the cluster or
  Write on some topic (KIP-679; CLUSTER_AUTHORIZATION_FAILED).
* AddPartitionsToTxn: Write on the transactional id (every partition refused) and on each topic
  (refused ones TOPIC_AUTHORIZATION_FAILED, the rest OPERATION_NOT_ATTEMPTED: none is added).
* AddOffsetsToTxn: Write on the transactional id, Read on the group; EndTxn: Write on the id.
* TxnOffsetCommit: Write on the transactional id, Read on the group and on each topic;
  OffsetCommit: Read on the group and each topic. A refusal commits nothing.
* OffsetFetch: Describe on the group; Describe on each topic (a named topic's partitions
  TOPIC_AUTHORIZATION_FAILED, the all-topics answer leaves it out).
* DescribeTransactions: Describe on each id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED), its
  partitions listed only for describable topics; ListTransactions leaves the others out.
* ListGroups: Describe on the cluster, else only the groups the caller may Describe;
  DeleteGroups: Delete on each group (GROUP_AUTHORIZATION_FAILED per group).
* DescribeCluster, ApiVersions: nothing (authorized operations are reported when asked for).

Internal topics are never writable by clients, super users included (the replica manager
refuses them: INVALID_TOPIC_EXCEPTION), nor deletable.

The group APIs: JoinGroup, SyncGroup, Heartbeat and LeaveGroup need Read on the group
(:func:`group_refusal`: GROUP_AUTHORIZATION_FAILED, nothing done); DescribeGroups and
ConsumerGroupDescribe Describe on each group (refused groups answer GROUP_AUTHORIZATION_FAILED in
their own entry, and :func:`authorized_operations` fills ``authorized_operations`` when asked
for); ConsumerGroupHeartbeat the gRPC heartbeat's check (Read on the group, Describe on each
subscribed topic).
"""

from __future__ import annotations

from collections.abc import Iterable

from sluice.acls import AclOperation, ResourceType
from sluice.broker.kafka.context import KafkaContext
from sluice.broker.security import coordinator_checks as checks
from sluice.broker.security.authorizer import CLUSTER_NAME, operation_name
from sluice.broker.security.authorizer import topic_refusal as topic_refusal  # the handlers' refusals

Op = AclOperation
# The operations Kafka reports for each resource type (its AclEntry.supportedOperations).
SUPPORTED: dict[ResourceType, tuple[AclOperation, ...]] = {
    ResourceType.TOPIC: (Op.READ, Op.WRITE, Op.CREATE, Op.DESCRIBE, Op.DELETE, Op.ALTER,
                         Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS),
    ResourceType.GROUP: (Op.READ, Op.DESCRIBE, Op.DELETE),
    ResourceType.CLUSTER: (Op.CREATE, Op.CLUSTER_ACTION, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS,
                           Op.IDEMPOTENT_WRITE, Op.ALTER, Op.DESCRIBE),
    ResourceType.TRANSACTIONAL_ID: (Op.DESCRIBE, Op.WRITE),
}  # fmt: skip
NOT_PROVIDED = -(2**31)  # Kafka's "authorized operations not asked for" (Integer.MIN_VALUE)


def allowed(ctx: KafkaContext, op: AclOperation, resource_type: ResourceType, name: str) -> bool:
    return ctx.access.allowed(ctx.caller, op, resource_type, name)


def cluster_allowed(ctx: KafkaContext, op: AclOperation) -> bool:
    return ctx.access.allowed(ctx.caller, op, ResourceType.CLUSTER, CLUSTER_NAME)


def denied_topics(ctx: KafkaContext, op: AclOperation, names: Iterable[str]) -> set[str]:
    """The topics among ``names`` the connection's caller may not ``op`` (the gate's partial denial)."""
    return ctx.gate.denied_topics(ctx.caller, op, names)


def cluster_refusal(op: AclOperation) -> str:
    return f"not authorized to {operation_name(op)} the cluster (no ACL allows it)"


def group_refusal(ctx: KafkaContext, op: AclOperation, group: str) -> tuple[int, str] | None:
    """(GROUP_AUTHORIZATION_FAILED, why) when the caller may not ``op`` the group, else None."""
    refused = checks.check_group(ctx.access, ctx.caller, op, group)
    return None if refused is None else (int(refused.code), refused.message)


def authorized_operations(ctx: KafkaContext, resource_type: ResourceType, name: str) -> int:
    """Kafka's bit field of the operations the caller may do on the resource (bit ``1 << op``)."""
    bits = 0
    for op in SUPPORTED[resource_type]:
        if ctx.access.allowed(ctx.caller, op, resource_type, name):
            bits |= 1 << int(op)
    return bits


def cluster_operations(ctx: KafkaContext) -> int:
    """The cluster's authorized operations as Kafka reports them: 0 without Describe on the cluster."""
    if not cluster_allowed(ctx, AclOperation.DESCRIBE):
        return 0
    return authorized_operations(ctx, ResourceType.CLUSTER, CLUSTER_NAME)
