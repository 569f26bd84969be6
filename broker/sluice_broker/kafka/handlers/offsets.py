"""OffsetCommit, OffsetFetch, TxnOffsetCommit: committed offsets through the group coordinator.

The coordinator's own calls (the gRPC ones), so an offset committed by a Kafka
consumer is the one a Sluice consumer of the same group resumes from, and a
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
from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import records_pb2 as pb
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


def _topics(topics: Iterable[OffsetCommitRequestTopic | TxnOffsetCommitRequestTopic]) -> list[bpb.OffsetCommitTopic]:
    out = []
    for t in topics:
        out.append(
            bpb.OffsetCommitTopic(
                name=t.name,
                partitions=[
                    bpb.OffsetCommitPartition(
                        partition=p.partition_index,
                        committed_offset=p.committed_offset,
                        committed_leader_epoch=p.committed_leader_epoch,
                        metadata=p.committed_metadata or "",
                    )
                    for p in t.partitions
                ],
            )
        )
    return out


def _grouped(results: Iterable[bpb.TxnPartitionResult]) -> dict[str, list[tuple[int, int]]]:
    by_topic: dict[str, list[tuple[int, int]]] = {}
    for r in results:
        by_topic.setdefault(r.topic, []).append((r.partition, int(r.error_code)))
    return by_topic


class OffsetCommitHandler:
    api_key = 8
    versions = Versions(2, 9)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, OffsetCommitRequest)
        core = bpb.OffsetCommitRequest(
            group_id=request.group_id,
            member_id=request.member_id,
            member_epoch=request.generation_id_or_member_epoch,
            topics=_topics(request.topics),
            group_instance_id=request.group_instance_id,
        )
        refused = checks.check_offset_commit(ctx.access, ctx.caller, core)
        answer = refused if refused is not None else await ctx.groups.offset_commit(core)
        return ocr.OffsetCommitResponse(
            topics=[
                ocr.OffsetCommitResponseTopic(
                    name=name, partitions=[ocr.OffsetCommitResponsePartition(p, e) for p, e in parts]
                )
                for name, parts in _grouped(answer.results).items()
            ]
        )


class TxnOffsetCommitHandler:
    api_key = 28
    versions = Versions(0, 4)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, TxnOffsetCommitRequest)
        core = bpb.TxnOffsetCommitRequest(
            transactional_id=request.transactional_id,
            group_id=request.group_id,
            producer_id=request.producer_id,
            producer_epoch=request.producer_epoch,
            member_id=request.member_id,
            member_epoch=request.generation_id,
            topics=_topics(request.topics),
            group_instance_id=request.group_instance_id,
        )
        refused = checks.check_txn_offset_commit(ctx.access, ctx.caller, core)
        answer = refused if refused is not None else await ctx.groups.txn_offset_commit(core)
        return tcr.TxnOffsetCommitResponse(
            topics=[
                tcr.TxnOffsetCommitResponseTopic(
                    name=name, partitions=[tcr.TxnOffsetCommitResponsePartition(p, e) for p, e in parts]
                )
                for name, parts in _grouped(answer.results).items()
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
                                p.partition, p.committed_offset, p.committed_leader_epoch, p.metadata, int(p.error_code)
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
                                    p.partition,
                                    p.committed_offset,
                                    p.committed_leader_epoch,
                                    p.metadata,
                                    int(p.error_code),
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
    ) -> tuple[int, dict[str, list[bpb.OffsetFetchPartition]]]:
        request = bpb.OffsetFetchRequest(group_id=group_id, require_stable=require_stable)
        topics: dict[str, list[bpb.OffsetFetchPartition]] = {}
        refused = checks.check_offset_fetch(ctx.access, ctx.caller, request)
        if refused is not None:
            for name, partitions in wanted if version < 2 and wanted else []:  # v1: no group-level error
                topics.setdefault(name, []).extend(
                    bpb.OffsetFetchPartition(
                        topic=name, partition=p, committed_offset=-1, committed_leader_epoch=-1,
                        error_code=refused.error_code,
                    )
                    for p in partitions
                )  # fmt: skip
            return int(refused.error_code), topics
        denied = authorization.denied_topics(ctx, AclOperation.DESCRIBE, (n for n, _ in wanted or []))
        for name, partitions in wanted or []:
            if name not in denied:
                request.partitions.extend(pb.TopicPartition(topic=name, partition=p) for p in partitions)
        # The coordinator reads every partition of the group when none is named: asked only when that
        # is what the client asked for (null), or for the group's error (an empty list asks for nothing).
        answer = await ctx.groups.offset_fetch(request) if request.partitions or not wanted else None
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
                    bpb.OffsetFetchPartition(
                        topic=name, partition=index, committed_offset=-1, committed_leader_epoch=-1,
                        error_code=pb.TOPIC_AUTHORIZATION_FAILED,
                    )
                    for index in partitions
                )  # fmt: skip
        return code, topics
