"""What Kafka checks before the transaction and group coordinators act, and the refusals.

Each ``check_*`` function takes the broker's :class:`Access`, the caller (a gRPC call, or the
:class:`~sluice.broker.security.peers.Caller` of a Kafka-listener connection: both protocols
ask these same functions) and what the request asks, and returns the refusal to answer
(:class:`Refusal`: Kafka's error code and why; per partition where the request has partitions)
or None when the request may go to the coordinator. All are None while the authorizer is off.
Nothing here knows a protocol's messages: both adapters call these with plain values.

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

from collections.abc import Iterable, Sequence

from sluice.acls import AclOperation, ResourceType
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.security.authorizer import Access, Refusal, Who, topic_refusal

R, W, D = AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE
TOPIC, GROUP, TXN = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID
_NOT_ATTEMPTED = "not attempted: another partition of the request was refused"


def _txn_refusal(op: AclOperation, txn_id: str) -> str:
    return f"not authorized to {op.name.title()} transactional id {txn_id!r} (no ACL allows it)"


def _group_refusal(op: AclOperation, group: str) -> str:
    return f"not authorized to {op.name.title()} group {group!r} (no ACL allows it)"


def _refused_partitions(
    pairs: Iterable[tuple[str, int]], whole: Refusal | None, denied: set[str], op: AclOperation
) -> list[tuple[str, int, Refusal]]:
    """Each partition's refusal: the whole request's, or its topic's, or "not attempted"."""
    out = []
    for topic, partition in pairs:
        if whole is not None:
            out.append((topic, partition, whole))
        elif topic in denied:
            out.append((topic, partition, Refusal(pb.TOPIC_AUTHORIZATION_FAILED, topic_refusal(op, topic))))
        else:
            out.append((topic, partition, Refusal(pb.OPERATION_NOT_ATTEMPTED, _NOT_ATTEMPTED)))
    return out


def check_find_coordinator(access: Access, ctx: Who, key: str, transactional: bool) -> Refusal | None:
    """Describe on the transactional id (``transactional``) or the group."""
    if transactional:
        if not access.allowed(ctx, D, TXN, key):
            return Refusal(pb.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, _txn_refusal(D, key))
    elif not access.allowed(ctx, D, GROUP, key):
        return Refusal(pb.GROUP_AUTHORIZATION_FAILED, _group_refusal(D, key))
    return None


def check_init_producer_id(access: Access, ctx: Who, transactional_id: str) -> Refusal | None:
    if not access.enabled:
        return None
    if transactional_id:
        if access.allowed(ctx, W, TXN, transactional_id):
            return None
        return Refusal(pb.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, _txn_refusal(W, transactional_id))
    if access.cluster(ctx, AclOperation.IDEMPOTENT_WRITE) or access.allowed_on_some(ctx, W, TOPIC):
        return None  # KIP-679: Write on any topic is enough for an idempotent producer
    return Refusal(
        pb.CLUSTER_AUTHORIZATION_FAILED,
        "an idempotent producer needs IdempotentWrite on the cluster or Write on some topic",
    )


def check_txn_id(access: Access, ctx: Who, txn_id: str) -> Refusal | None:
    """Write on the transactional id (AddOffsetsToTxn, EndTxn, PrepareTxn)."""
    if access.allowed(ctx, W, TXN, txn_id):
        return None
    return Refusal(pb.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, _txn_refusal(W, txn_id))


def check_group(access: Access, ctx: Who, op: AclOperation, group: str) -> Refusal | None:
    if access.allowed(ctx, op, GROUP, group):
        return None
    return Refusal(pb.GROUP_AUTHORIZATION_FAILED, _group_refusal(op, group))


def check_add_partitions(
    access: Access, ctx: Who, txn_id: str, pairs: Sequence[tuple[str, int]]
) -> list[tuple[str, int, Refusal]] | None:
    """Each partition's refusal, in the order asked, when any is refused (none is added then)."""
    refused = check_txn_id(access, ctx, txn_id)
    denied = set() if refused is not None else access.denied_topics(ctx, W, (t for t, _p in pairs))
    if refused is None and not denied:
        return None
    return _refused_partitions(pairs, refused, denied, W)


def check_offset_commit(
    access: Access, ctx: Who, group_id: str, pairs: Sequence[tuple[str, int]], txn_id: str | None = None
) -> list[tuple[str, int, Refusal]] | None:
    """OffsetCommit (and TxnOffsetCommit, with its ``txn_id``): each partition's refusal, in the
    order asked, when any is refused; nothing of the commit is applied then."""
    refused = check_txn_id(access, ctx, txn_id) if txn_id is not None else None
    refused = refused or check_group(access, ctx, R, group_id)
    denied = set() if refused is not None else access.denied_topics(ctx, R, (t for t, _p in pairs))
    if refused is None and not denied:
        return None
    return _refused_partitions(pairs, refused, denied, R)


def check_offset_fetch(access: Access, ctx: Who, group_id: str) -> Refusal | None:
    """Describe on the group; the topics the caller may not Describe are the adapter's to hide
    (``Access.denied_topics``), because how they are hidden differs by protocol version."""
    return check_group(access, ctx, D, group_id)


def check_heartbeat(access: Access, ctx: Who, group_id: str, subscribed: Iterable[str]) -> Refusal | None:
    """Read on the group, Describe on every subscribed topic (the first refused one is named)."""
    refused = check_group(access, ctx, R, group_id)
    if refused is None:
        denied = access.denied_topics(ctx, D, subscribed)
        if denied:
            refused = Refusal(pb.TOPIC_AUTHORIZATION_FAILED, topic_refusal(D, sorted(denied)[0]))
    return refused


def filter_describe_transactions(
    access: Access, ctx: Who, txn_ids: Iterable[str]
) -> tuple[list[str], dict[str, Refusal]]:
    """(the ids the caller may Describe, the refusal of each of the others)."""
    allowed: list[str] = []
    refused: dict[str, Refusal] = {}
    for txn_id in txn_ids:
        if access.allowed(ctx, D, TXN, txn_id):
            allowed.append(txn_id)
        else:
            refused[txn_id] = Refusal(pb.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, _txn_refusal(D, txn_id))
    return allowed, refused


def listable_txn_ids(access: Access, ctx: Who, txn_ids: Iterable[str]) -> set[str]:
    """The transactional ids ListTransactions shows the caller: those it may Describe (Kafka's rule)."""
    return {t for t in txn_ids if not access.enabled or access.allowed(ctx, D, TXN, t)}
