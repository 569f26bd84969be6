"""What Kafka checks before the transaction and group coordinators act, and the refusals.

Each ``check_*`` function takes the broker's :class:`Access`, the caller (a gRPC call, or the
:class:`~sluice.broker.security.peers.Caller` of a Kafka-listener connection: both protocols
ask these same functions) and the request, and returns the refusal to answer (the RPC's own
response type, with Kafka's error codes) or None when the request may go to the coordinator.
All are None while the authorizer is off.

The rules (Kafka's KafkaApis): FindCoordinator needs Describe on the group or transactional id;
InitProducerId Write on the transactional id, or without one IdempotentWrite on the cluster or
Write on any topic (KIP-679); AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, PrepareTxn and
TxnOffsetCommit Write on the transactional id; AddOffsetsToTxn, TxnOffsetCommit, OffsetCommit
and ConsumerGroupHeartbeat Read on the group, OffsetFetch Describe; the topics of a commit need
Read, of AddPartitionsToTxn Write, of a heartbeat's subscription and of OffsetFetch Describe.
When some topics of a request are refused, the refused ones answer TOPIC_AUTHORIZATION_FAILED
and the others OPERATION_NOT_ATTEMPTED: nothing of it is applied (for commits Kafka applies the
allowed part; all-or-nothing here keeps a transaction's offsets whole).
"""

from __future__ import annotations

from collections.abc import Iterable

from sluice.acls import AclOperation, ResourceType
from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.security.authorizer import Access, Who, topic_refusal

R, W, D = AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE
TOPIC, GROUP, TXN = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID
_NOT_ATTEMPTED = "not attempted: another partition of the request was refused"


def _txn_refusal(op: AclOperation, txn_id: str) -> str:
    return f"not authorized to {op.name.title()} transactional id {txn_id!r} (no ACL allows it)"


def _group_refusal(op: AclOperation, group: str) -> str:
    return f"not authorized to {op.name.title()} group {group!r} (no ACL allows it)"


def _partition_results(
    pairs: Iterable[tuple[str, int]], denied: set[str], op: AclOperation
) -> list[bpb.TxnPartitionResult]:
    out = []
    for topic, partition in pairs:
        if topic in denied:
            out.append(bpb.TxnPartitionResult(
                topic=topic, partition=partition, error_code=pb.TOPIC_AUTHORIZATION_FAILED,
                error_message=topic_refusal(op, topic),
            ))  # fmt: skip
        else:
            out.append(bpb.TxnPartitionResult(
                topic=topic, partition=partition, error_code=pb.OPERATION_NOT_ATTEMPTED, error_message=_NOT_ATTEMPTED
            ))  # fmt: skip
    return out


def _all_results(pairs: Iterable[tuple[str, int]], code: pb.ErrorCode, message: str) -> list[bpb.TxnPartitionResult]:
    return [bpb.TxnPartitionResult(topic=t, partition=p, error_code=code, error_message=message) for t, p in pairs]


def check_find_coordinator(
    access: Access, ctx: Who, req: bpb.FindCoordinatorRequest
) -> bpb.FindCoordinatorResponse | None:
    if req.key_type == bpb.TRANSACTION:
        if not access.allowed(ctx, D, TXN, req.key):
            return bpb.FindCoordinatorResponse(
                node_id=-1, error_code=pb.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, error_message=_txn_refusal(D, req.key)
            )
    elif not access.allowed(ctx, D, GROUP, req.key):
        return bpb.FindCoordinatorResponse(
            node_id=-1, error_code=pb.GROUP_AUTHORIZATION_FAILED, error_message=_group_refusal(D, req.key)
        )
    return None


def check_init_producer_id(
    access: Access, ctx: Who, req: bpb.InitProducerIdRequest
) -> bpb.InitProducerIdResponse | None:
    if not access.enabled:
        return None
    if req.transactional_id:
        if access.allowed(ctx, W, TXN, req.transactional_id):
            return None
        code, message = pb.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, _txn_refusal(W, req.transactional_id)
    else:
        if access.cluster(ctx, AclOperation.IDEMPOTENT_WRITE) or access.allowed_on_some(ctx, W, TOPIC):
            return None  # KIP-679: Write on any topic is enough for an idempotent producer
        code = pb.CLUSTER_AUTHORIZATION_FAILED
        message = "an idempotent producer needs IdempotentWrite on the cluster or Write on some topic"
    return bpb.InitProducerIdResponse(producer_id=-1, producer_epoch=-1, error_code=code, error_message=message)


def check_txn_id(access: Access, ctx: Who, txn_id: str) -> tuple[pb.ErrorCode, str] | None:
    """Write on the transactional id (AddOffsetsToTxn, EndTxn, PrepareTxn)."""
    if access.allowed(ctx, W, TXN, txn_id):
        return None
    return pb.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, _txn_refusal(W, txn_id)


def check_group(access: Access, ctx: Who, op: AclOperation, group: str) -> tuple[pb.ErrorCode, str] | None:
    if access.allowed(ctx, op, GROUP, group):
        return None
    return pb.GROUP_AUTHORIZATION_FAILED, _group_refusal(op, group)


def check_add_partitions(
    access: Access, ctx: Who, req: bpb.AddPartitionsToTxnRequest
) -> bpb.AddPartitionsToTxnResponse | None:
    pairs = [(t.name, p) for t in req.topics for p in t.partitions]
    refused = check_txn_id(access, ctx, req.transactional_id)
    if refused is not None:
        return bpb.AddPartitionsToTxnResponse(results=_all_results(pairs, *refused))
    denied = access.denied_topics(ctx, W, (t.name for t in req.topics))
    if denied:
        return bpb.AddPartitionsToTxnResponse(results=_partition_results(pairs, denied, W))
    return None


def _commit_refusal(
    access: Access, ctx: Who, group: str, topics: Iterable[bpb.OffsetCommitTopic], txn_id: str | None
) -> list[bpb.TxnPartitionResult] | None:
    topics = list(topics)
    pairs = [(t.name, p.partition) for t in topics for p in t.partitions]
    refused = check_txn_id(access, ctx, txn_id) if txn_id is not None else None
    refused = refused or check_group(access, ctx, R, group)
    if refused is not None:
        return _all_results(pairs, *refused)
    denied = access.denied_topics(ctx, R, (t.name for t in topics))
    return _partition_results(pairs, denied, R) if denied else None


def check_txn_offset_commit(
    access: Access, ctx: Who, req: bpb.TxnOffsetCommitRequest
) -> bpb.TxnOffsetCommitResponse | None:
    results = _commit_refusal(access, ctx, req.group_id, req.topics, req.transactional_id)
    return None if results is None else bpb.TxnOffsetCommitResponse(results=results)


def check_offset_commit(access: Access, ctx: Who, req: bpb.OffsetCommitRequest) -> bpb.OffsetCommitResponse | None:
    results = _commit_refusal(access, ctx, req.group_id, req.topics, None)
    return None if results is None else bpb.OffsetCommitResponse(results=results)


def check_offset_fetch(access: Access, ctx: Who, req: bpb.OffsetFetchRequest) -> bpb.OffsetFetchResponse | None:
    refused = check_group(access, ctx, D, req.group_id)
    if refused is not None:
        return bpb.OffsetFetchResponse(error_code=refused[0], error_message=refused[1])
    return None


def filter_offset_fetch(access: Access, ctx: Who, resp: bpb.OffsetFetchResponse) -> bpb.OffsetFetchResponse:
    """Partitions of topics the caller may not Describe: TOPIC_AUTHORIZATION_FAILED, no offset."""
    denied = access.denied_topics(ctx, D, (p.topic for p in resp.partitions)) if access.enabled else set()
    for p in resp.partitions:
        if p.topic in denied:
            p.committed_offset, p.committed_leader_epoch, p.metadata = -1, -1, ""
            p.error_code, p.error_message = pb.TOPIC_AUTHORIZATION_FAILED, topic_refusal(D, p.topic)
    return resp


def check_heartbeat(
    access: Access, ctx: Who, req: bpb.ConsumerGroupHeartbeatRequest
) -> bpb.ConsumerGroupHeartbeatResponse | None:
    refused = check_group(access, ctx, R, req.group_id)
    if refused is None:
        denied = access.denied_topics(ctx, D, req.subscribed_topic_names)
        if denied:
            first = sorted(denied)[0]
            refused = pb.TOPIC_AUTHORIZATION_FAILED, topic_refusal(D, first)
    if refused is None:
        return None
    return bpb.ConsumerGroupHeartbeatResponse(
        error_code=refused[0], error_message=refused[1], member_id=req.member_id, member_epoch=req.member_epoch
    )


def filter_describe_transactions(
    access: Access, ctx: Who, req: bpb.DescribeTransactionsRequest
) -> tuple[bpb.DescribeTransactionsRequest, list[bpb.TransactionState]]:
    """(the ids the caller may Describe, the refusals of the others)."""
    allowed = bpb.DescribeTransactionsRequest()
    refused: list[bpb.TransactionState] = []
    for txn_id in req.transactional_ids:
        if access.allowed(ctx, D, TXN, txn_id):
            allowed.transactional_ids.append(txn_id)
        else:
            refused.append(bpb.TransactionState(
                transactional_id=txn_id, error_code=pb.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                error_message=_txn_refusal(D, txn_id),
            ))  # fmt: skip
    return allowed, refused


def filter_list_transactions(
    access: Access, ctx: Who, resp: bpb.ListTransactionsResponse
) -> bpb.ListTransactionsResponse:
    """Only the transactional ids the caller may Describe (Kafka's ListTransactions)."""
    if not access.enabled:
        return resp
    kept = [t for t in resp.transactions if access.allowed(ctx, D, TXN, t.transactional_id)]
    del resp.transactions[:]
    resp.transactions.extend(kept)
    return resp
