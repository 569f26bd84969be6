"""Raw gRPC helpers for tests that speak the wire protocol directly.

Tests of broker behaviour that the client hides on purpose (a sequence gap,
an unknown producer id, a retried batch, malformed requests) talk to the
broker through the generated stubs, exactly as a client in another language
would.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import broker_pb2_grpc
from sluice.api.v1 import records_pb2 as pb
from sluice.records import RecordBatch, build_batch, decode_records


class Wire:
    def __init__(self, address: str) -> None:
        self.address = address
        self.channel = grpc.insecure_channel(
            address,
            options=[("grpc.max_receive_message_length", 200 << 20), ("grpc.max_send_message_length", 200 << 20)],
        )
        self.stub = broker_pb2_grpc.BrokerStub(self.channel)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        self.channel.close()

    def create_topic(self, name: str, partitions: int = 1, config: dict[str, str] | None = None) -> None:
        resp = self.stub.CreateTopics(
            bpb.CreateTopicsRequest(
                topics=[bpb.CreatableTopic(name=name, num_partitions=partitions, replication_factor=1, config=config)]
            )
        )
        assert resp.topics[0].error_code == pb.NONE, resp.topics[0].error_message

    def init_producer_id(self, transactional_id: str = "", timeout_ms: int = 60000) -> tuple[int, int]:
        resp = self.stub.InitProducerId(
            bpb.InitProducerIdRequest(
                transactional_id=transactional_id,
                transaction_timeout_ms=timeout_ms,
                producer_id=-1,
                producer_epoch=-1,
            )
        )
        assert resp.error_code == pb.NONE, resp.error_message
        return resp.producer_id, resp.producer_epoch

    def produce(
        self,
        topic: str,
        partition: int,
        batch: RecordBatch,
        acks: int = -1,
        transactional_id: str = "",
    ) -> bpb.ProducePartitionResponse:
        req = bpb.ProduceRequest(
            acks=acks,
            timeout_ms=30000,
            transactional_id=transactional_id,
            topics=[
                bpb.ProduceTopicData(
                    name=topic, partitions=[bpb.ProducePartitionData(partition=partition, batch=batch)]
                )
            ],
        )
        resp = self.stub.Produce(req)
        return resp.topics[0].partitions[0]

    def fetch(
        self,
        topic: str,
        partition: int,
        offset: int = 0,
        read_committed: bool = True,
        max_wait_ms: int = 0,
        kafka_v2_records: bool = False,
    ) -> bpb.FetchPartitionResponse:
        req = bpb.FetchRequest(
            kafka_v2_records=kafka_v2_records,
            max_wait_ms=max_wait_ms,
            min_bytes=1,
            isolation_level=pb.READ_COMMITTED if read_committed else pb.READ_UNCOMMITTED,
            topics=[
                bpb.FetchTopic(
                    name=topic,
                    partitions=[bpb.FetchPartition(partition=partition, fetch_offset=offset, current_leader_epoch=-1)],
                )
            ],
            replica_id=-1,
        )
        return self.stub.Fetch(req).topics[0].partitions[0]

    def read_all(self, topic: str, partition: int, read_committed: bool = True) -> list[tuple[int, bytes | None]]:
        """(offset, value) of every record visible at the isolation level, at most 1000 fetches."""
        out: list[tuple[int, bytes | None]] = []
        offset = 0
        for _ in range(1000):
            resp = self.fetch(topic, partition, offset, read_committed)
            assert resp.error_code == pb.NONE, resp.error_message
            for batch in resp.batches:
                if batch.control:
                    continue
                out.extend((r.offset, r.value) for r in decode_records(batch) if r.offset >= offset)
            if resp.next_fetch_offset == offset:
                return out
            offset = resp.next_fetch_offset
        raise AssertionError("read_all did not reach the end in 1000 fetches")


def batch_of(values: Sequence[bytes], **header: int | bool) -> RecordBatch:
    return build_batch([(None, v) for v in values], **header)
