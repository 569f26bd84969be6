"""Every bad input gets a clear error, the broker keeps serving, and stored data does not change."""

from __future__ import annotations

import random

import grpc
import pytest

from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import records_pb2 as pb
from sluice.records import build_batch, control_batch
from sluice.testing import LocalCluster

from .wire import Wire, batch_of

RPCS = [
    "Metadata", "Produce", "Fetch", "ListOffsets", "CreateTopics", "DeleteTopics", "CreatePartitions",
    "DescribeTopics", "FindCoordinator", "InitProducerId", "AddPartitionsToTxn", "AddOffsetsToTxn", "EndTxn",
    "DescribeTransactions", "ListTransactions", "TxnOffsetCommit", "OffsetCommit", "OffsetFetch",
    "ConsumerGroupHeartbeat", "AlterTopicConfigs", "AlterPartitionReassignments", "ListPartitionReassignments",
    "DescribeLogDirs",
]  # fmt: skip


@pytest.fixture
def wire(cluster: LocalCluster, unique_topic: str):  # type: ignore[no-untyped-def]
    w = Wire(cluster.bootstrap_servers.split(",")[0])
    w.create_topic(unique_topic, partitions=2)
    w.produce(unique_topic, 0, batch_of([b"keep-me"]))
    yield w
    assert [v for _o, v in w.read_all(unique_topic, 0, read_committed=False)] == [b"keep-me"]
    assert w.read_all(unique_topic, 1, read_committed=False) == []
    w.close()


def raw_call(wire: Wire | grpc.Channel, service: str, method: str, payload: bytes) -> tuple[grpc.StatusCode, bytes]:
    channel = wire.channel if isinstance(wire, Wire) else wire
    call = channel.unary_unary(
        f"/sluice.v1.{service}/{method}", request_serializer=lambda b: b, response_deserializer=lambda b: b
    )
    try:
        return grpc.StatusCode.OK, call(payload, timeout=10)
    except grpc.RpcError as exc:
        return exc.code(), exc.details().encode()


def test_random_bytes_on_every_rpc(wire: Wire, cluster: LocalCluster) -> None:
    rng = random.Random(1234)
    # WriteTxnMarkers is served on the inter-broker listener only (to a broker: here with broker 0's
    # own certificate); on the client port it is refused whatever the bytes (test_interbroker_door.py).
    interbroker = cluster.interbroker_channel(0)
    for method in [*RPCS, "WriteTxnMarkers"]:
        service = "InterBroker" if method == "WriteTxnMarkers" else "Broker"
        for _ in range(20):
            payload = rng.randbytes(rng.randint(1, 300))
            code, _details = raw_call(interbroker if service == "InterBroker" else wire, service, method, payload)
            # Either undecodable (INVALID_ARGUMENT), or decodable by chance and answered normally.
            assert code in (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT), (method, code)
    interbroker.close()
    assert wire.stub.Metadata(bpb.MetadataRequest()).brokers  # still serving


def test_truncated_protobuf_is_invalid_argument(wire: Wire, unique_topic: str) -> None:
    req = bpb.ProduceRequest(
        acks=-1,
        topics=[
            bpb.ProduceTopicData(
                name=unique_topic, partitions=[bpb.ProducePartitionData(partition=0, batch=batch_of([b"x" * 50]))]
            )
        ],
    ).SerializeToString()
    code, details = raw_call(wire, "Broker", "Produce", req[:-10])
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert b"ProduceRequest" in details


def test_wrong_crc_is_corrupt_message(wire: Wire, unique_topic: str) -> None:
    batch = batch_of([b"payload"])
    batch.crc ^= 1
    assert wire.produce(unique_topic, 0, batch).error_code == pb.CORRUPT_MESSAGE
    batch = batch_of([b"payload"])
    batch.records = batch.records[:-1] + b"!"
    assert wire.produce(unique_topic, 0, batch).error_code == pb.CORRUPT_MESSAGE


def test_oversize_batch_is_message_too_large(wire: Wire, unique_topic: str) -> None:
    resp = wire.produce(unique_topic, 0, batch_of([b"x" * (2 << 20)]))
    assert resp.error_code == pb.MESSAGE_TOO_LARGE
    assert "max.message.bytes" in resp.error_message


def test_bad_batch_headers(wire: Wire, unique_topic: str) -> None:
    assert wire.produce(unique_topic, 0, control_batch(5, 0, True, 0)).error_code == pb.INVALID_RECORD
    empty = build_batch([(None, b"x")])
    empty.record_count = 0
    assert wire.produce(unique_topic, 0, empty).error_code == pb.INVALID_RECORD
    odd = batch_of([b"x"])
    odd.compression = 5  # no such codec
    assert wire.produce(unique_topic, 0, odd).error_code == pb.UNSUPPORTED_COMPRESSION_TYPE
    unknown = batch_of([b"x"])
    unknown.records_format = 7  # type: ignore[assignment]  # no such encoding
    refused = wire.produce(unique_topic, 0, unknown)
    assert refused.error_code == pb.INVALID_RECORD and "records_format 7" in refused.error_message
    assert wire.produce(unique_topic, 0, batch_of([b"x"]), acks=5).error_code == pb.INVALID_REQUIRED_ACKS


def test_unknown_topics_and_partitions(wire: Wire, unique_topic: str) -> None:
    assert wire.produce("no-such-topic", 0, batch_of([b"x"])).error_code == pb.UNKNOWN_TOPIC_OR_PARTITION
    assert wire.produce(unique_topic, 7, batch_of([b"x"])).error_code == pb.UNKNOWN_TOPIC_OR_PARTITION
    assert wire.produce(unique_topic, -1, batch_of([b"x"])).error_code == pb.UNKNOWN_TOPIC_OR_PARTITION
    assert wire.fetch(unique_topic, 9).error_code == pb.UNKNOWN_TOPIC_OR_PARTITION


def test_internal_topics_refuse_client_writes(wire: Wire) -> None:
    resp = wire.produce("__consumer_offsets", 0, batch_of([b"x"]))
    assert resp.error_code == pb.INVALID_TOPIC_EXCEPTION


def test_negative_and_out_of_range_offsets(wire: Wire, unique_topic: str) -> None:
    assert wire.fetch(unique_topic, 0, offset=-5).error_code == pb.OFFSET_OUT_OF_RANGE
    assert wire.fetch(unique_topic, 0, offset=1000).error_code == pb.OFFSET_OUT_OF_RANGE
    with pytest.raises(grpc.RpcError) as err:
        wire.stub.Fetch(bpb.FetchRequest(max_wait_ms=-1))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("name", ["", "a b", "x" * 250, "..", "__mine", "ünïcode"])
def test_invalid_topic_names(wire: Wire, name: str) -> None:
    resp = wire.stub.CreateTopics(bpb.CreateTopicsRequest(topics=[bpb.CreatableTopic(name=name, num_partitions=1)]))
    assert resp.topics[0].error_code == pb.INVALID_TOPIC_EXCEPTION, resp.topics[0].error_message


def test_invalid_topic_settings(wire: Wire, unique_topic: str) -> None:
    cases = [
        (bpb.CreatableTopic(name=f"{unique_topic}-n", num_partitions=-3), pb.INVALID_PARTITIONS),
        (
            bpb.CreatableTopic(name=f"{unique_topic}-r", num_partitions=1, replication_factor=9),
            pb.INVALID_REPLICATION_FACTOR,
        ),
        (
            bpb.CreatableTopic(name=f"{unique_topic}-c", num_partitions=1, config={"retention.ms": "soon"}),
            pb.INVALID_CONFIG,
        ),
        (
            bpb.CreatableTopic(name=f"{unique_topic}-k", num_partitions=1, config={"no.such.key": "1"}),
            pb.INVALID_CONFIG,
        ),
        (bpb.CreatableTopic(name=unique_topic, num_partitions=1), pb.TOPIC_ALREADY_EXISTS),
    ]
    for topic, code in cases:
        resp = wire.stub.CreateTopics(bpb.CreateTopicsRequest(topics=[topic]))
        assert resp.topics[0].error_code == code, (topic, resp.topics[0].error_message)
    shrink = wire.stub.CreatePartitions(
        bpb.CreatePartitionsRequest(topics=[bpb.CreatePartitionsTopic(name=unique_topic, count=1)])
    )
    assert shrink.topics[0].error_code == pb.INVALID_PARTITIONS


def test_wrong_producer_epochs(wire: Wire, unique_topic: str) -> None:
    topic = f"{unique_topic}-epochs"
    wire.create_topic(topic)
    pid, epoch = wire.init_producer_id()
    newer = wire.produce(topic, 0, batch_of([b"a"], producer_id=pid, producer_epoch=epoch + 1, base_sequence=0))
    assert newer.error_code == pb.NONE
    stale = wire.produce(topic, 0, batch_of([b"b"], producer_id=pid, producer_epoch=epoch, base_sequence=1))
    assert stale.error_code == pb.INVALID_PRODUCER_EPOCH
    bad = wire.produce(topic, 0, batch_of([b"c"], producer_id=pid, producer_epoch=-4, base_sequence=0))
    assert bad.error_code == pb.INVALID_RECORD
    assert [v for _o, v in wire.read_all(topic, 0)] == [b"a"]


def test_transaction_calls_with_wrong_ids_and_epochs(wire: Wire, unique_topic: str) -> None:
    txn_id = f"{unique_topic}-tx"
    pid, epoch = wire.init_producer_id(txn_id)
    add = wire.stub.AddPartitionsToTxn(
        bpb.AddPartitionsToTxnRequest(
            transactional_id=txn_id,
            producer_id=pid + 1000,
            producer_epoch=epoch,
            topics=[bpb.TxnTopic(name=unique_topic, partitions=[0])],
        )
    )
    assert add.results[0].error_code == pb.INVALID_PRODUCER_ID_MAPPING
    end = wire.stub.EndTxn(
        bpb.EndTxnRequest(transactional_id=txn_id, producer_id=pid, producer_epoch=epoch - 1, committed=True)
    )
    assert end.error_code in (pb.PRODUCER_FENCED, pb.INVALID_PRODUCER_EPOCH)
    # a transactional write to a partition that was never added to the transaction (KIP-890)
    resp = wire.produce(
        unique_topic,
        0,
        batch_of([b"sneaky"], producer_id=pid, producer_epoch=epoch, base_sequence=0, transactional=True),
        transactional_id=txn_id,
    )
    assert resp.error_code == pb.INVALID_TXN_STATE
    timeout = wire.stub.InitProducerId(bpb.InitProducerIdRequest(transactional_id=txn_id, transaction_timeout_ms=10**9))
    assert timeout.error_code == pb.INVALID_TRANSACTION_TIMEOUT
