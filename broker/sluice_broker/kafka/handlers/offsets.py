"""OffsetCommit, OffsetFetch, TxnOffsetCommit: committed offsets through the group coordinator.

The coordinator's own calls (the gRPC ones), so an offset committed by a Kafka
consumer is the one a Sluice consumer of the same group resumes from, and a
transactional commit (``send_offsets_to_transaction``) obeys the same markers.

Served: OffsetCommit 2-9 and OffsetFetch 1-9 (v10 of both names topics by id:
next), TxnOffsetCommit 0-4 (v5 belongs to transaction.version 2). A commit
from outside the group (generation -1, empty member id: assign() consumers)
is accepted as over gRPC. Classic-protocol generations are passed on as the
member epoch; until JoinGroup/SyncGroup are served the only members are those
of the coordinator's KIP-848 groups.
"""

from __future__ import annotations

from collections.abc import Iterable

from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.kafka.codec import Message, Versions
from sluice.broker.kafka.context import KafkaContext
from sluice.broker.kafka.messages import offset_commit_response as ocr
from sluice.broker.kafka.messages import offset_fetch_response as ofr
from sluice.broker.kafka.messages import txn_offset_commit_response as tcr
from sluice.broker.kafka.messages.offset_commit_request import OffsetCommitRequest, OffsetCommitRequestTopic
from sluice.broker.kafka.messages.offset_fetch_request import OffsetFetchRequest
from sluice.broker.kafka.messages.request_header import RequestHeader
from sluice.broker.kafka.messages.txn_offset_commit_request import TxnOffsetCommitRequest, TxnOffsetCommitRequestTopic


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
        answer = await ctx.groups.offset_commit(
            bpb.OffsetCommitRequest(
                group_id=request.group_id,
                member_id=request.member_id,
                member_epoch=request.generation_id_or_member_epoch,
                topics=_topics(request.topics),
            )
        )
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
        answer = await ctx.groups.txn_offset_commit(
            bpb.TxnOffsetCommitRequest(
                transactional_id=request.transactional_id,
                group_id=request.group_id,
                producer_id=request.producer_id,
                producer_epoch=request.producer_epoch,
                member_id=request.member_id,
                member_epoch=request.generation_id,
                topics=_topics(request.topics),
            )
        )
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
            code, topics = await self._fetch(ctx, request.group_id, wanted, request.require_stable)
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
            code, topics = await self._fetch(ctx, group.group_id, wanted, request.require_stable)
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
        ctx: KafkaContext, group_id: str, wanted: list[tuple[str, list[int]]] | None, require_stable: bool
    ) -> tuple[int, dict[str, list[bpb.OffsetFetchPartition]]]:
        request = bpb.OffsetFetchRequest(group_id=group_id, require_stable=require_stable)
        for name, partitions in wanted or []:
            request.partitions.extend(pb.TopicPartition(topic=name, partition=p) for p in partitions)
        answer = await ctx.groups.offset_fetch(request)
        topics: dict[str, list[bpb.OffsetFetchPartition]] = {}
        if wanted is not None and not wanted:  # an empty list asks for nothing (null asks for everything)
            return int(answer.error_code), topics
        for p in answer.partitions:
            topics.setdefault(p.topic, []).append(p)
        return int(answer.error_code), topics
