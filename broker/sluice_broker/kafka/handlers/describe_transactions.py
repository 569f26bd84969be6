"""DescribeTransactions and ListTransactions: what ``kafka-transactions.sh`` shows, from the coordinator.

The transaction coordinator's own answers (the gRPC calls). Each broker lists
the transactional ids it coordinates, as Kafka's brokers do; admin clients ask
every broker. States keep Kafka's names (Empty, Ongoing, PrepareCommit,
PrepareAbort, CompleteCommit, CompleteAbort, PrepareEpochFence, Dead), plus
Sluice's Prepared for a transaction held by PrepareTxn.

ListTransactions is served at v0: v1's duration filter needs each
transaction's start time in the coordinator's list answer, and v2's id pattern
a regular-expression filter (next steps); a client that sees v0 advertised
sends neither.

Authorization is the gRPC servicer's: Describe on each transactional id
(DescribeTransactions answers TRANSACTIONAL_ID_AUTHORIZATION_FAILED for the
others; ListTransactions leaves them out). As in Kafka, a described
transaction lists only the partitions of topics the caller may Describe.
"""

from __future__ import annotations

from collections import defaultdict

from sluice.acls import AclOperation
from sluice.broker.kafka import authorization
from sluice.broker.kafka.context import KafkaContext
from sluice.broker.kafka_wire.codec import Message, Versions
from sluice.broker.kafka_wire.messages import describe_transactions_response as dtr
from sluice.broker.kafka_wire.messages import list_transactions_response as ltr
from sluice.broker.kafka_wire.messages.describe_transactions_request import DescribeTransactionsRequest
from sluice.broker.kafka_wire.messages.list_transactions_request import ListTransactionsRequest
from sluice.broker.kafka_wire.messages.request_header import RequestHeader
from sluice.broker.security import coordinator_checks as checks
from sluice.broker.txn.api import ListTransactionsInput, TxnDescription

STATES = {
    "Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort",
    "PrepareEpochFence", "Dead", "Prepared",
}  # fmt: skip


class DescribeTransactionsHandler:
    api_key = 65
    versions = Versions(0, 0)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, DescribeTransactionsRequest)
        allowed, refused = checks.filter_describe_transactions(ctx.access, ctx.caller, request.transactional_ids)
        described = ctx.txn.describe_transactions(allowed) if allowed else []
        described += [TxnDescription(t, r.code, r.message) for t, r in refused.items()]
        hidden = authorization.denied_topics(
            ctx, AclOperation.DESCRIBE, (topic for t in described for topic, _p in t.partitions)
        )
        resp = dtr.DescribeTransactionsResponse()
        for t in described:
            by_topic: dict[str, list[int]] = defaultdict(list)
            for topic, partition in t.partitions:
                if topic not in hidden:
                    by_topic[topic].append(partition)
            resp.transaction_states.append(
                dtr.TransactionState(
                    error_code=int(t.error_code),
                    transactional_id=t.transactional_id,
                    transaction_state=t.state,
                    transaction_timeout_ms=t.transaction_timeout_ms,
                    transaction_start_time_ms=t.transaction_start_time_ms,
                    producer_id=t.producer_id,
                    producer_epoch=t.producer_epoch,
                    topics=[dtr.TopicData(topic, sorted(parts)) for topic, parts in sorted(by_topic.items())],
                )
            )
        return resp


class ListTransactionsHandler:
    api_key = 66
    versions = Versions(0, 0)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, ListTransactionsRequest)
        known = [s for s in request.state_filters if s in STATES]
        answer = ctx.txn.list_transactions(
            ListTransactionsInput(frozenset(known), frozenset(request.producer_id_filters))
        )
        visible = checks.listable_txn_ids(ctx.access, ctx.caller, (t.transactional_id for t in answer.transactions))
        resp = ltr.ListTransactionsResponse(
            error_code=int(answer.error_code),
            unknown_state_filters=[s for s in request.state_filters if s not in STATES],
        )
        if request.state_filters and not known:  # only unknown states asked for: nothing matches
            return resp
        for t in answer.transactions:
            if t.transactional_id in visible:
                resp.transaction_states.append(ltr.TransactionState(t.transactional_id, t.producer_id, t.state))
        return resp
