"""Fetch responses written from stored batch bytes parse to the message the protobuf API would build."""

from __future__ import annotations

from sluice.api.v1 import broker_pb2 as bpb
from sluice.broker.log.fetch_response import FetchResponseWriter
from sluice.records import build_batch


def test_written_response_parses_to_the_same_message() -> None:
    batches = [
        build_batch([(None, b"v" * n)] * 3, producer_id=1, producer_epoch=0, base_sequence=0) for n in (1, 500, 70_000)
    ]
    for i, b in enumerate(batches):
        b.base_offset = 10 * i
    stored = [b.SerializeToString() for b in batches]
    headers = [
        bpb.FetchPartitionResponse(
            partition=0, high_watermark=30, last_stable_offset=20, log_start_offset=0, next_fetch_offset=30
        ),
        bpb.FetchPartitionResponse(partition=1, error_code=6, error_message="not leader", high_watermark=-1),
        bpb.FetchPartitionResponse(partition=2, high_watermark=9, next_fetch_offset=9),
    ]
    headers[2].aborted_transactions.add(producer_id=4, first_offset=3)
    writer = FetchResponseWriter()
    writer.topic("a")
    writer.partition(headers[0], stored)
    writer.partition(headers[1], [])
    writer.topic("b")
    writer.partition(headers[2], stored[:1])
    writer.topic("empty")
    got = bpb.FetchResponse.FromString(writer.getvalue())

    expected = bpb.FetchResponse()
    a = expected.topics.add(name="a")
    p0 = a.partitions.add()
    p0.CopyFrom(headers[0])
    p0.batches.extend(batches)
    a.partitions.add().CopyFrom(headers[1])
    b = expected.topics.add(name="b")
    p2 = b.partitions.add()
    p2.CopyFrom(headers[2])
    p2.batches.extend(batches[:1])
    expected.topics.add(name="empty")
    assert got == expected
    assert len(writer.getvalue()) == expected.ByteSize()


def test_an_empty_response() -> None:
    assert FetchResponseWriter().getvalue() == b""


def test_replica_fetch_response_parses_to_the_same_message() -> None:
    from sluice.api.v1 import interbroker_pb2 as ipb
    from sluice.broker.log.fetch_response import ReplicaFetchResponseWriter

    batches = [build_batch([(b"k", b"v" * n)], producer_id=2, producer_epoch=1, base_sequence=0) for n in (3, 9000)]
    for i, b in enumerate(batches):
        b.base_offset = 5 + i
    headers = [
        ipb.ReplicaFetchPartitionResponse(
            topic="t", partition=0, high_watermark=6, log_start_offset=0, log_end_offset=7
        ),
        ipb.ReplicaFetchPartitionResponse(topic="t", partition=1, high_watermark=3),
        ipb.ReplicaFetchPartitionResponse(topic="u", partition=0, error_code=6, error_message="not leader"),
    ]
    headers[1].diverging_epoch.epoch = 2
    headers[1].diverging_epoch.end_offset = 3
    writer = ReplicaFetchResponseWriter()
    writer.partition(headers[0], [b.SerializeToString() for b in batches])
    writer.partition(headers[1], [])
    writer.partition(headers[2], [])
    expected = ipb.ReplicaFetchResponse()
    for h in headers:
        expected.partitions.add().CopyFrom(h)
    expected.partitions[0].batches.extend(batches)
    assert ipb.ReplicaFetchResponse.FromString(writer.getvalue()) == expected
    assert len(writer.getvalue()) == expected.ByteSize()
