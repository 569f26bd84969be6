"""OffsetCommit, OffsetFetch, TxnOffsetCommit: committed offsets through the group coordinator.

The coordinator's own calls (the gRPC servicer makes the same, with the plain values of
:mod:`sluice.broker.group.api`), so an offset committed by a Kafka consumer is the one a
Sluice consumer of the same group resumes from, and a
transactional commit (``send_offsets_to_transaction``) obeys the same markers.

Served: OffsetCommit 2-9 and OffsetFetch 1-9 (v10 of both names topics by id:
next), TxnOffsetCommit 0-4 (v5 belongs to transaction.version 2). A commit
from outside the group (generation -1, empty member id: assign() consumers)
is accepted while the group has no members, as over gRPC. The generation (or
KIP-848 member epoch) is passed on as the member epoch; the coordinator checks
it by the group's kind: a classic group's current generation (Kafka's
ClassicGroup rule), a KIP-848 member's epoch.

Authorization is the gRPC servicer's (:mod:`sluice.broker.security.coordinator_checks`):
the commits need (Write on the transactional id,) Read on the group and Read on
each topic; a refusal commits nothing (GROUP_/TRANSACTIONAL_ID_AUTHORIZATION_FAILED
on every partition, or TOPIC_AUTHORIZATION_FAILED on the refused topics'
partitions and OPERATION_NOT_ATTEMPTED on the others). OffsetFetch needs
Describe on the group (GROUP_AUTHORIZATION_FAILED, per group from v8; on each
partition at v1, which has no group-level error) and Describe on each topic:
a topic asked for by name answers TOPIC_AUTHORIZATION_FAILED with no offset,
and an all-topics fetch leaves the others out, as Kafka does.
"""

from __future__ import annotations

from collections.abc import Iterable

from sluice.acls import AclOperation
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.group.api import (
    CommitOffset,
    FetchedOffset,
    OffsetCommitInput,
    OffsetFetchInput,
    PartitionAnswer,
    TxnOffsetCommitInput,
)
from sluice.broker.kafka import authorization
from sluice.broker.kafka.context import KafkaContext
from sluice.broker.kafka_wire.codec import Message, Versions
from sluice.broker.kafka_wire.messages import offset_commit_response as ocr
from sluice.broker.kafka_wire.messages import offset_fetch_response as ofr
from sluice.broker.kafka_wire.messages import txn_offset_commit_response as tcr
from sluice.broker.kafka_wire.messages.offset_commit_request import OffsetCommitRequest, OffsetCommitRequestTopic
from sluice.broker.kafka_wire.messages.offset_fetch_request import OffsetFetchRequest
from sluice.broker.kafka_wire.messages.request_header import RequestHeader
from sluice.broker.kafka_wire.messages.txn_offset_commit_request import (
    TxnOffsetCommitRequest,
    TxnOffsetCommitRequestTopic,
)
from sluice.broker.security import coordinator_checks as checks


def _offsets(topics: Iterable[OffsetCommitRequestTopic | TxnOffsetCommitRequestTopic]) -> tuple[CommitOffset, ...]:
    return tuple(
        CommitOffset(
            t.name, p.partition_index, p.committed_offset, p.committed_leader_epoch, p.committed_metadata or ""
        )
        for t in topics
        for p in t.partitions
    )


async def _commit(
    ctx: KafkaContext, commit: OffsetCommitInput, txn: tuple[str, int, int] | None
) -> dict[str, list[tuple[int, int]]]:
    """The commit's answers by topic: (partition, error code); ``txn``: (id, producer id, epoch)."""
    pairs = [(o.topic, o.partition) for o in commit.offsets]
    refused = checks.check_offset_commit(
        ctx.access, ctx.caller, commit.group_id, pairs, None if txn is None else txn[0]
    )
    if refused is not None:
        answers = [PartitionAnswer(t, p, r.code, r.message) for t, p, r in refused]
    elif txn is None:
        answers = await ctx.groups.offset_commit(commit)
    else:
        answers = await ctx.groups.txn_offset_commit(TxnOffsetCommitInput(commit, *txn))
    by_topic: dict[str, list[tuple[int, int]]] = {}
    for a in answers:
        by_topic.setdefault(a.topic, []).append((a.partition, int(a.error_code)))
    return by_topic


class OffsetCommitHandler:
    api_key = 8
    versions = Versions(2, 9)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, OffsetCommitRequest)
        commit = OffsetCommitInput(
            request.group_id, _offsets(request.topics), request.member_id, request.generation_id_or_member_epoch,
            request.group_instance_id,
        )  # fmt: skip
        return ocr.OffsetCommitResponse(
            topics=[
                ocr.OffsetCommitResponseTopic(
                    name=name, partitions=[ocr.OffsetCommitResponsePartition(p, e) for p, e in parts]
                )
                for name, parts in (await _commit(ctx, commit, None)).items()
            ]
        )


class TxnOffsetCommitHandler:
    api_key = 28
    versions = Versions(0, 4)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, TxnOffsetCommitRequest)
        commit = OffsetCommitInput(
            request.group_id, _offsets(request.topics), request.member_id, request.generation_id,
            request.group_instance_id,
        )  # fmt: skip
        txn = (request.transactional_id, request.producer_id, request.producer_epoch)
        return tcr.TxnOffsetCommitResponse(
            topics=[
                tcr.TxnOffsetCommitResponseTopic(
                    name=name, partitions=[tcr.TxnOffsetCommitResponsePartition(p, e) for p, e in parts]
                )
                for name, parts in (await _commit(ctx, commit, txn)).items()
            ]
        )


class OffsetFetchHandler:
    api_key = 9
    versions = Versions(1, 9)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, OffsetFetchRequest)
        if header.request_api_version < 8:
            wanted = None if request.topics is None else [(t.name, t.partition_indexes) for t in request.topics]
            code, topics = await self._fetch(
                ctx, header.request_api_version, request.group_id, wanted, request.require_stable
            )
            return ofr.OffsetFetchResponse(
                error_code=code,
                topics=[
                    ofr.OffsetFetchResponseTopic(
                        name=name,
                        partitions=[
                            ofr.OffsetFetchResponsePartition(
                                p.partition, p.offset, p.leader_epoch, p.metadata, int(p.error_code)
                            )
                            for p in parts
                        ],
                    )
                    for name, parts in topics.items()
                ],
            )
        resp = ofr.OffsetFetchResponse()
        for group in request.groups:
            wanted = None if group.topics is None else [(t.name or "", t.partition_indexes) for t in group.topics]
            code, topics = await self._fetch(
                ctx, header.request_api_version, group.group_id, wanted, request.require_stable
            )
            resp.groups.append(
                ofr.OffsetFetchResponseGroup(
                    group_id=group.group_id,
                    error_code=code,
                    topics=[
                        ofr.OffsetFetchResponseTopics(
                            name=name,
                            partitions=[
                                ofr.OffsetFetchResponsePartitions(
                                    p.partition, p.offset, p.leader_epoch, p.metadata, int(p.error_code)
                                )
                                for p in parts
                            ],
                        )
                        for name, parts in topics.items()
                    ],
                )
            )
        return resp

    @staticmethod
    async def _fetch(
        ctx: KafkaContext,
        version: int,
        group_id: str,
        wanted: list[tuple[str, list[int]]] | None,
        require_stable: bool,
    ) -> tuple[int, dict[str, list[FetchedOffset]]]:
        topics: dict[str, list[FetchedOffset]] = {}
        refused = checks.check_offset_fetch(ctx.access, ctx.caller, group_id)
        if refused is not None:
            for name, partitions in wanted if version < 2 and wanted else []:  # v1: no group-level error
                topics.setdefault(name, []).extend(
                    FetchedOffset(name, p, error_code=refused.code, error_message=refused.message) for p in partitions
                )
            return int(refused.code), topics
        denied = authorization.denied_topics(ctx, AclOperation.DESCRIBE, (n for n, _ in wanted or []))
        named = tuple((name, p) for name, partitions in wanted or [] if name not in denied for p in partitions)
        # The coordinator reads every partition of the group when none is named: asked only when that
        # is what the client asked for (null), or for the group's error (an empty list asks for nothing).
        request = OffsetFetchInput(group_id, named or None, require_stable)
        answer = await ctx.groups.offset_fetch(request) if named or not wanted else None
        code = 0 if answer is None else int(answer.error_code)
        if answer is not None and wanted != []:
            # in an all-topics answer the topics the caller may not Describe are left out, as Kafka does
            hidden = set() if wanted else authorization.denied_topics(
                ctx, AclOperation.DESCRIBE, (p.topic for p in answer.partitions)
            )  # fmt: skip
            for p in answer.partitions:
                if p.topic not in hidden:
                    topics.setdefault(p.topic, []).append(p)
        for name, partitions in wanted or []:
            if name in denied:
                topics.setdefault(name, []).extend(
                    FetchedOffset(name, index, error_code=pb.TOPIC_AUTHORIZATION_FAILED) for index in partitions
                )
        return code, topics
