"""Produce and Fetch over the Kafka listener, against real broker processes, kafka-python as the client.

kafka-python's producer (idempotent and transactional) and consumer (read_committed and
read_uncommitted) were written by people who never saw Sluice: they check sequence numbers,
control batches, aborted-transaction lists and base offsets. The cross-protocol tests read
through one protocol what the other wrote and compare offsets, keys, values, headers and
timestamps. Raw requests (kafka-python's protocol classes) cover what no well-behaved client
sends: corrupt CRCs, magic 1, two batches, unknown topic ids, fetch sessions, acks=0.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import crc32c
import pytest

from sluice.api.v1 import records_pb2 as pb
from sluice.client import Admin, Consumer, Producer, TopicPartition
from sluice.records import decode_records, verify_crc
from sluice.testing import LocalCluster

kafka = pytest.importorskip("kafka")  # the dev extra installs kafka-python
from kafka import KafkaConsumer, KafkaProducer  # noqa: E402
from kafka.protocol.consumer import FetchRequest, FetchResponse  # noqa: E402
from kafka.protocol.metadata import MetadataRequest, MetadataResponse  # noqa: E402
from kafka.protocol.producer import ProduceRequest, ProduceResponse  # noqa: E402
from kafka.record.default_records import DefaultRecordBatchBuilder  # noqa: E402
from kafka.record.legacy_records import LegacyRecordBatchBuilder  # noqa: E402
from kafka.record.memory_records import MemoryRecords  # noqa: E402

from .test_kafka_listener import ask, connect, kafka_address, read_frame  # noqa: E402
from .wire import Wire  # noqa: E402

TS = 1_700_000_000_000
CORRUPT_MESSAGE, NOT_LEADER_OR_FOLLOWER, INVALID_RECORD, UNKNOWN_TOPIC_ID = 2, 6, 87, 100
UNSUPPORTED_COMPRESSION_TYPE = 76
FETCH_SESSION_ID_NOT_FOUND = 70

Row = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes]], int]  # offset, key, value, headers, ts


@pytest.fixture(scope="module")
def kcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(brokers=1, data_dir=tmp_path_factory.mktemp("kafka-data"), kafka_listener=True) as cluster:
        yield cluster


def create(cluster: LocalCluster, topic: str, partitions: int = 1, rf: int = 1) -> None:
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    admin.create_topic(topic, partitions=partitions, replication_factor=rf)
    admin.close()


def kafka_read(cluster: LocalCluster, topic: str, isolation: str, partition: int = 0, idle_ms: int = 4000) -> list[Row]:
    """Every record of one partition from the beginning, read by kafka-python's consumer (no group)."""
    consumer = KafkaConsumer(
        bootstrap_servers=cluster.kafka_bootstrap_servers,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level=isolation,
        consumer_timeout_ms=idle_ms,
        request_timeout_ms=60000,
    )
    try:
        consumer.assign([kafka.TopicPartition(topic, partition)])
        return [(m.offset, m.key, m.value, list(m.headers), m.timestamp) for m in consumer]
    finally:
        consumer.close()


def grpc_read(cluster: LocalCluster, topic: str, isolation: str, count: int, limit_s: float = 60) -> list[Row]:
    consumer = Consumer(bootstrap_servers=cluster.bootstrap_servers, group_id=None, isolation_level=isolation)
    consumer.assign([TopicPartition(topic, 0)])
    consumer.seek_to_beginning()
    out: list[Row] = []
    deadline = time.monotonic() + limit_s
    while len(out) < count and time.monotonic() < deadline:
        out += [(r.offset, r.key, r.value, list(r.headers), r.timestamp) for r in consumer.poll(timeout=0.5)]
    consumer.close()
    return out


def kafka_producer(cluster: LocalCluster, **kwargs: Any) -> Any:
    return KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap_servers, request_timeout_ms=60000, **kwargs)


def produce_idempotent(cluster: LocalCluster, topic: str, n: int) -> list[int]:
    producer = kafka_producer(cluster, enable_idempotence=True, acks="all")
    try:
        futures = [
            producer.send(topic, key=b"k%d" % i, value=b"v%d" % i, headers=[("n", b"%d" % i)], timestamp_ms=TS + i)
            for i in range(n)
        ]
        return [f.get(timeout=60).offset for f in futures]
    finally:
        producer.close()


def expected_rows(n: int) -> list[Row]:
    return [(i, b"k%d" % i, b"v%d" % i, [("n", b"%d" % i)], TS + i) for i in range(n)]


def test_idempotent_acks_all_then_consumed_from_the_beginning(kcluster: LocalCluster) -> None:
    create(kcluster, "kafka-idem")
    assert produce_idempotent(kcluster, "kafka-idem", 200) == list(range(200))
    assert kafka_read(kcluster, "kafka-idem", "read_uncommitted") == expected_rows(200)


def transactional_abort_then_commit(cluster: LocalCluster, topic: str, txn_id: str) -> None:
    producer = kafka_producer(cluster, transactional_id=txn_id)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(5):
            producer.send(topic, value=b"aborted-%d" % i, timestamp_ms=TS)
        producer.flush()
        producer.abort_transaction()
        producer.begin_transaction()
        for i in range(5):
            producer.send(topic, value=b"committed-%d" % i, timestamp_ms=TS)
        producer.commit_transaction()
    finally:
        producer.close()


def check_transactional_reads(cluster: LocalCluster, topic: str) -> None:
    committed = [v for _, _, v, _, _ in kafka_read(cluster, topic, "read_committed")]
    assert committed == [b"committed-%d" % i for i in range(5)]
    everything = kafka_read(cluster, topic, "read_uncommitted")
    # 5 aborted records, the ABORT marker (offset 5), 5 committed records, the COMMIT marker (offset 11)
    assert [(o, v) for o, _, v, _, _ in everything] == [(i, b"aborted-%d" % i) for i in range(5)] + [
        (6 + i, b"committed-%d" % i) for i in range(5)
    ]


def test_transactional_abort_then_commit_read_committed_and_uncommitted(kcluster: LocalCluster) -> None:
    create(kcluster, "kafka-txn-data")
    transactional_abort_then_commit(kcluster, "kafka-txn-data", "kafka-txn-data-id")
    check_transactional_reads(kcluster, "kafka-txn-data")
    # the gRPC consumer sees the same committed records at the same offsets
    got = grpc_read(kcluster, "kafka-txn-data", "read_committed", 5)
    assert [(o, v) for o, _, v, _, _ in got] == [(6 + i, b"committed-%d" % i) for i in range(5)]


def fetch_raw(cluster: LocalCluster, version: int, topic: str, offset: int, isolation: int, session_id: int = 0) -> Any:
    part = FetchRequest.FetchTopic.FetchPartition(partition=0, fetch_offset=offset, partition_max_bytes=1 << 20)
    request = FetchRequest[version](
        replica_id=-1,
        max_wait_ms=100,
        min_bytes=0,
        max_bytes=1 << 22,
        isolation_level=isolation,
        session_id=session_id,
        session_epoch=-1,
        topics=[FetchRequest.FetchTopic(topic=topic, topic_id=topic_id(cluster, topic), partitions=[part])],
    )
    return ask(cluster, request, FetchResponse[version])


def topic_id(cluster: LocalCluster, topic: str) -> uuid.UUID:
    request = MetadataRequest[12](topics=[MetadataRequest.MetadataRequestTopic(name=topic)])
    [answered] = ask(cluster, request, MetadataResponse[12]).topics
    return answered.topic_id  # type: ignore[no-any-return]


def batches(records: Any) -> list[Any]:
    memory = MemoryRecords(bytes(records)) if isinstance(records, bytes | bytearray) else records
    out = []
    while (batch := memory.next_batch()) is not None:
        out.append(batch)
    return out


def test_fetch_answers_lso_and_aborted_transactions_at_every_version(kcluster: LocalCluster) -> None:
    topic = "kafka-txn-raw"
    create(kcluster, topic)
    transactional_abort_then_commit(kcluster, topic, "kafka-txn-raw-id")
    for version in (4, 7, 11, 12, 13, 16, 18):
        resp = fetch_raw(kcluster, version, topic, 0, isolation=1)
        assert resp.error_code == 0 and resp.session_id == 0
        [p] = resp.responses[0].partitions
        assert (p.error_code, p.high_watermark, p.last_stable_offset) == (0, 12, 12)
        assert [(a.producer_id, a.first_offset) for a in p.aborted_transactions] != []
        assert [a.first_offset for a in p.aborted_transactions] == [0]
        found = batches(p.records)
        assert [b.base_offset for b in found] == [0, 5, 6, 11]
        assert [b.is_control_batch for b in found] == [False, True, False, True]
        assert all(b.is_transactional for b in found)
        uncommitted = fetch_raw(kcluster, version, topic, 0, isolation=0).responses[0].partitions[0]
        assert uncommitted.aborted_transactions is None or uncommitted.aborted_transactions == []
    # no fetch sessions: a request naming one is told it does not exist
    assert fetch_raw(kcluster, 12, topic, 0, 0, session_id=7).error_code == FETCH_SESSION_ID_NOT_FOUND


def kafka_v1_batch() -> bytes:
    builder = LegacyRecordBatchBuilder(1, 0, 1 << 20)
    builder.append(0, TS, None, b"magic-1")
    return bytes(builder.build())


def kafka_v2_batch(n: int = 3) -> bytearray:
    builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 20)
    for i in range(n):
        builder.append(i, TS + i, None, b"raw-%d" % i, [])
    return builder.build()


def produce_raw(cluster: LocalCluster, version: int, topic: str, records: bytes, acks: int = 1, tid: Any = None) -> Any:
    part = ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=records)
    data = ProduceRequest.TopicProduceData(name=topic, topic_id=tid or uuid.UUID(int=0), partition_data=[part])
    request = ProduceRequest[version](transactional_id=None, acks=acks, timeout_ms=30000, topic_data=[data])
    return ask(cluster, request, ProduceResponse[version])


def partition_answer(resp: Any) -> tuple[int, int]:
    [topic] = resp.responses
    [p] = topic.partition_responses
    return p.error_code, p.base_offset


def test_kafka_batches_are_stored_as_sent_and_every_kind_of_client_reads_them(kcluster: LocalCluster) -> None:
    """A v2 batch (a null header value included, which Sluice's own record encoding cannot hold) is
    stored as sent: a Kafka consumer gets it back byte for byte, Sluice's client decodes Kafka's
    encoding itself, and a gRPC client that does not ask for it gets Sluice's encoding."""
    topic = "kafka-as-sent"
    create(kcluster, topic)
    builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 20)
    builder.append(0, TS, None, b"fine", [("h", b"x")])
    builder.append(1, TS + 1, b"k", b"null header", [("trace", None)])
    sent = bytes(builder.build())
    [answer] = produce_raw(kcluster, 9, topic, sent).responses
    [p] = answer.partition_responses
    assert (p.error_code, p.base_offset) == (0, 0)
    assert kafka_read(kcluster, topic, "read_uncommitted") == [
        (0, None, b"fine", [("h", b"x")], TS),
        (1, b"k", b"null header", [("trace", None)], TS + 1),
    ]
    assert grpc_read(kcluster, topic, "read_committed", 2) == [
        (0, None, b"fine", [("h", b"x")], TS),
        (1, b"k", b"null header", [("trace", b"")], TS + 1),
    ]
    wire = Wire(kcluster.brokers[0].address)
    try:
        [as_stored] = wire.fetch(topic, 0, kafka_v2_records=True).batches
        [converted] = wire.fetch(topic, 0).batches
    finally:
        wire.close()
    assert as_stored.records_format == pb.RECORDS_FORMAT_KAFKA_V2 and as_stored.records == sent[61:]
    assert converted.records_format == pb.RECORDS_FORMAT_SLUICE and verify_crc(converted)
    assert [(r.offset, r.key, r.value, r.headers) for r in decode_records(converted)] == [
        (0, None, b"fine", [("h", b"x")]),
        (1, b"k", b"null header", [("trace", b"")]),
    ]


def test_with_stored_as_sent_off_kafka_batches_are_stored_in_sluices_encoding(tmp_path: Path) -> None:
    """kafka.records.stored.as.sent=false (a rolling upgrade from brokers that cannot read
    records_format): a Kafka client's batch is stored in Sluice's record encoding and read back the same."""
    topic = "kafka-converted"
    with LocalCluster(brokers=1, data_dir=tmp_path, kafka_listener=True,
                      config={"kafka.records.stored.as.sent": "false"}) as cluster:  # fmt: skip
        create(cluster, topic)
        builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 20)
        builder.append(0, TS, b"k", b"v", [("h", b"x")])
        [answer] = produce_raw(cluster, 9, topic, bytes(builder.build())).responses
        assert answer.partition_responses[0].error_code == 0
        wire = Wire(cluster.brokers[0].address)
        try:
            [stored] = wire.fetch(topic, 0, kafka_v2_records=True).batches
        finally:
            wire.close()
        assert stored.records_format == pb.RECORDS_FORMAT_SLUICE and verify_crc(stored)
        assert kafka_read(cluster, topic, "read_committed") == [(0, b"k", b"v", [("h", b"x")], TS)]


def test_produce_versions_and_refusals(kcluster: LocalCluster) -> None:
    topic = "kafka-raw-produce"
    create(kcluster, topic)
    offsets = [partition_answer(produce_raw(kcluster, v, topic, bytes(kafka_v2_batch()))) for v in (3, 7, 9, 11)]
    assert offsets == [(0, 0), (0, 3), (0, 6), (0, 9)]
    # v13 names the topic by id; an id no topic has is UNKNOWN_TOPIC_ID
    tid = topic_id(kcluster, topic)
    assert partition_answer(produce_raw(kcluster, 13, topic, bytes(kafka_v2_batch()), tid=tid)) == (0, 12)
    assert partition_answer(produce_raw(kcluster, 13, topic, bytes(kafka_v2_batch()), tid=uuid.uuid4()))[0] == (
        UNKNOWN_TOPIC_ID
    )
    # a flipped bit in a record: CORRUPT_MESSAGE, nothing appended
    corrupt = kafka_v2_batch()
    corrupt[-1] ^= 0x01
    assert partition_answer(produce_raw(kcluster, 9, topic, bytes(corrupt)))[0] == CORRUPT_MESSAGE
    # magic 1 (Kafka < 0.11): INVALID_RECORD, as Kafka 4 answers; two batches in one partition: INVALID_RECORD
    assert partition_answer(produce_raw(kcluster, 9, topic, kafka_v1_batch()))[0] == INVALID_RECORD
    two = bytes(kafka_v2_batch()) + bytes(kafka_v2_batch())
    assert partition_answer(produce_raw(kcluster, 9, topic, two))[0] == INVALID_RECORD
    # acks=0: no answer at all; the next request on the connection is answered and the record is there
    part = ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=bytes(kafka_v2_batch(1)))
    acks0 = ProduceRequest[9](
        transactional_id=None,
        acks=0,
        timeout_ms=30000,
        topic_data=[ProduceRequest.TopicProduceData(name=topic, partition_data=[part])],
    )
    acks0.with_header(correlation_id=1, client_id="t")
    acks1 = ProduceRequest[9](
        transactional_id=None,
        acks=1,
        timeout_ms=30000,
        topic_data=[ProduceRequest.TopicProduceData(name=topic, partition_data=[part])],
    )
    acks1.with_header(correlation_id=2, client_id="t")
    with connect(kcluster) as sock:
        sock.sendall(bytes(acks0.encode(header=True, framed=True)))
        sock.sendall(bytes(acks1.encode(header=True, framed=True)))
        resp = ProduceResponse[9].decode(read_frame(sock), header=True)
        assert resp.header.correlation_id == 2
        assert partition_answer(resp) == (0, 16)  # after the acks=0 record at 15
        sock.settimeout(1.0)
        with pytest.raises(socket.timeout):
            sock.recv(1)  # nothing else was sent back
    # acks=0 refused (a partition that does not exist): Kafka's only signal, the connection is closed
    bad = ProduceRequest.TopicProduceData.PartitionProduceData(index=5, records=bytes(kafka_v2_batch(1)))
    refused = ProduceRequest[9](
        transactional_id=None,
        acks=0,
        timeout_ms=30000,
        topic_data=[ProduceRequest.TopicProduceData(name=topic, partition_data=[bad])],
    )
    refused.with_header(correlation_id=4, client_id="t")
    with connect(kcluster) as sock:
        sock.sendall(bytes(refused.encode(header=True, framed=True)))
        sock.settimeout(30.0)
        assert sock.recv(1) == b""
    got = kafka_read(kcluster, topic, "read_uncommitted")
    assert [o for o, *_ in got] == list(range(17))
    assert [v for _, _, v, _, _ in got][:3] == [b"raw-0", b"raw-1", b"raw-2"]


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd"])
def test_compressed_batches_from_kafka_clients(kcluster: LocalCluster, codec: str) -> None:
    topic = f"kafka-compressed-{codec}"
    create(kcluster, topic)
    producer = kafka_producer(kcluster, enable_idempotence=True, acks="all", compression_type=codec, linger_ms=20)
    try:
        futures = [
            producer.send(topic, key=b"k%d" % i, value=b"v%d" % i, headers=[("n", b"%d" % i)], timestamp_ms=TS + i)
            for i in range(50)
        ]
        assert [f.get(timeout=60).offset for f in futures] == list(range(50))
    finally:
        producer.close()
    assert kafka_read(kcluster, topic, "read_committed") == expected_rows(50)
    assert grpc_read(kcluster, topic, "read_committed", 50) == expected_rows(50)


def test_a_codec_kafka_does_not_have_is_refused(kcluster: LocalCluster) -> None:
    topic = "kafka-codec-5"
    create(kcluster, topic)
    data = bytearray(kafka_v2_batch())
    data[22] |= 0x05  # attributes (int16 at 21): compression 5, no codec; the CRC must then be recomputed
    data[17:21] = crc32c.crc32c(bytes(data[21:])).to_bytes(4, "big")
    assert partition_answer(produce_raw(kcluster, 9, topic, bytes(data)))[0] == UNSUPPORTED_COMPRESSION_TYPE


def test_records_written_over_grpc_are_read_over_kafka(kcluster: LocalCluster) -> None:
    topic = "kafka-cross-grpc-first"
    create(kcluster, topic)
    producer = Producer(bootstrap_servers=kcluster.bootstrap_servers, linger_ms=0, enable_idempotence=True)
    futures = [
        producer.send(topic, key=b"k%d" % i, value=b"v%d" % i, headers=[("n", b"%d" % i)], partition=0,
                      timestamp_ms=TS + i)
        for i in range(30)
    ]  # fmt: skip
    assert [f.result(timeout=60).offset for f in futures] == list(range(30))
    producer.close()
    assert kafka_read(kcluster, topic, "read_committed") == expected_rows(30)
    assert grpc_read(kcluster, topic, "read_committed", 30) == expected_rows(30)


def test_records_written_over_kafka_are_read_over_grpc(kcluster: LocalCluster) -> None:
    topic = "kafka-cross-kafka-first"
    create(kcluster, topic)
    assert produce_idempotent(kcluster, topic, 30) == list(range(30))
    assert grpc_read(kcluster, topic, "read_committed", 30) == expected_rows(30)
    assert kafka_read(kcluster, topic, "read_committed") == expected_rows(30)


def test_three_brokers_rf3_idempotent_transactional_and_not_leader(tmp_path_factory: pytest.TempPathFactory) -> None:
    with LocalCluster(brokers=3, data_dir=tmp_path_factory.mktemp("kafka-data-3"), kafka_listener=True) as cluster:
        create(cluster, "kafka3-idem", rf=3)
        create(cluster, "kafka3-txn", rf=3)
        assert produce_idempotent(cluster, "kafka3-idem", 100) == list(range(100))
        assert kafka_read(cluster, "kafka3-idem", "read_uncommitted") == expected_rows(100)
        assert grpc_read(cluster, "kafka3-idem", "read_committed", 100) == expected_rows(100)
        transactional_abort_then_commit(cluster, "kafka3-txn", "kafka3-txn-id")
        check_transactional_reads(cluster, "kafka3-txn")
        # a broker that is not the leader answers NOT_LEADER_OR_FOLLOWER, so the client refreshes
        described = Admin(bootstrap_servers=cluster.bootstrap_servers).describe_topic("kafka3-idem").partitions[0]
        leader, epoch = described.leader, described.leader_epoch
        follower = next(i for i in range(3) if i != leader)
        leader_host, leader_port = kafka_address(cluster, leader)
        for version in (9, 10, 12):  # v10+: KIP-951's leader hint comes with the refusal
            data = ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=bytes(kafka_v2_batch()))
            request = ProduceRequest[version](
                transactional_id=None,
                acks=-1,
                timeout_ms=30000,
                topic_data=[ProduceRequest.TopicProduceData(name="kafka3-idem", partition_data=[data])],
            )
            request.with_header(correlation_id=3, client_id="t")
            with socket.create_connection(kafka_address(cluster, follower), timeout=30) as sock:
                sock.sendall(bytes(request.encode(header=True, framed=True)))
                resp = ProduceResponse[version].decode(read_frame(sock), header=True)
            assert partition_answer(resp)[0] == NOT_LEADER_OR_FOLLOWER
            if version >= 10:
                [hinted] = resp.responses[0].partition_responses
                assert (hinted.current_leader.leader_id, hinted.current_leader.leader_epoch) == (leader, epoch)
                assert [(n.node_id, n.host, n.port) for n in resp.node_endpoints] == [
                    (leader, leader_host, leader_port)
                ]
        for version in (11, 12, 16):  # current_leader from v12, node_endpoints from v16
            part = FetchRequest.FetchTopic.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)
            fetch = FetchRequest[version](
                replica_id=-1,
                max_wait_ms=100,
                min_bytes=0,
                max_bytes=1 << 20,
                isolation_level=1,
                session_id=0,
                session_epoch=-1,
                topics=[
                    FetchRequest.FetchTopic(
                        topic="kafka3-idem", topic_id=topic_id(cluster, "kafka3-idem"), partitions=[part]
                    )
                ],
            )
            fetch.with_header(correlation_id=4, client_id="t")
            with socket.create_connection(kafka_address(cluster, follower), timeout=30) as sock:
                sock.sendall(bytes(fetch.encode(header=True, framed=True)))
                fresp = FetchResponse[version].decode(read_frame(sock), header=True)
            [fpart] = fresp.responses[0].partitions
            assert fpart.error_code == NOT_LEADER_OR_FOLLOWER and not batches(fpart.records or b"")
            if version >= 12:
                assert (fpart.current_leader.leader_id, fpart.current_leader.leader_epoch) == (leader, epoch)
            if version >= 16:
                assert [(n.node_id, n.host, n.port) for n in fresp.node_endpoints] == [
                    (leader, leader_host, leader_port)
                ]


def test_list_and_delete_groups_through_kafka_python_admin(kcluster: LocalCluster) -> None:
    from kafka.admin import KafkaAdminClient

    from .test_kafka_listener import commit_offsets

    topic = "kafka-groups"
    create(kcluster, topic)
    assert commit_offsets(kcluster, 8, "kafka-offsets-only", topic, {0: 3}) == [(topic, 0, 0)]
    # a group with a live member (a gRPC consumer: Sluice's KIP-848 protocol)
    member = Consumer(bootstrap_servers=kcluster.bootstrap_servers, group_id="kafka-live-group")
    member.subscribe([topic])
    deadline = time.monotonic() + 60
    while not member.assignment() and time.monotonic() < deadline:
        member.poll(timeout=0.5)
    assert member.assignment()
    admin = KafkaAdminClient(bootstrap_servers=kcluster.kafka_bootstrap_servers, request_timeout_ms=60000)
    try:
        listed = {g["group_id"]: g for g in admin.list_groups()}
        assert listed["kafka-offsets-only"]["group_state"] == "Empty"
        assert listed["kafka-live-group"]["group_state"] == "Stable"
        assert {listed[g]["protocol_type"] for g in ("kafka-offsets-only", "kafka-live-group")} == {"consumer"}
        stable = {g["group_id"] for g in admin.list_groups(states_filter=["Stable"])}
        assert "kafka-live-group" in stable and "kafka-offsets-only" not in stable
        assert admin.list_groups(types_filter=["classic"]) == []
        results = admin.delete_groups(["kafka-offsets-only", "kafka-live-group", "kafka-no-such-group"])
        assert results == {
            "kafka-offsets-only": "OK",
            "kafka-live-group": "NonEmptyGroupError",
            "kafka-no-such-group": "GroupIdNotFoundError",
        }
        remaining = {g["group_id"] for g in admin.list_groups()}
        assert "kafka-offsets-only" not in remaining and "kafka-live-group" in remaining
    finally:
        admin.close()
        member.close()
    # the gRPC Admin sees the same: the deleted group's offsets are gone
    grpc_admin = Admin(bootstrap_servers=kcluster.bootstrap_servers)
    assert "kafka-offsets-only" not in {g.group_id for g in grpc_admin.list_consumer_groups()}
    grpc_admin.close()


def test_describe_producers_shows_idempotent_and_open_transactional_producers(kcluster: LocalCluster) -> None:
    from kafka.protocol.admin import DescribeProducersRequest, DescribeProducersResponse

    topic = "kafka-describe-producers"
    create(kcluster, topic)

    def producers() -> tuple[int, dict[int, tuple[int, int, int]]]:
        request = DescribeProducersRequest[0](
            topics=[DescribeProducersRequest.TopicRequest(name=topic, partition_indexes=[0])]
        )
        [part] = ask(kcluster, request, DescribeProducersResponse[0]).topics[0].partitions
        states = {
            s.producer_id: (s.producer_epoch, s.last_sequence, s.current_txn_start_offset)
            for s in part.active_producers
        }
        return part.error_code, states

    assert producers() == (0, {})
    idempotent = kafka_producer(kcluster, enable_idempotence=True, acks="all")
    for i in range(5):
        idempotent.send(topic, value=b"i%d" % i, partition=0).get(timeout=60)
    idempotent.close()
    [(pid, (epoch, last_seq, txn_start))] = producers()[1].items()
    assert (epoch, last_seq, txn_start) == (0, 4, -1)
    txn = kafka_producer(kcluster, transactional_id="kafka-describe-producers-txn")
    try:
        txn.init_transactions()
        txn.begin_transaction()
        first = txn.send(topic, value=b"open", partition=0).get(timeout=60).offset
        assert first == 5
        states = producers()[1]
        [txn_pid] = set(states) - {pid}
        assert states[txn_pid][2] == first  # the open transaction's first offset on the partition
        txn.commit_transaction()
        assert producers()[1][txn_pid][2] == -1
    finally:
        txn.close()
    # a partition that does not exist
    request = DescribeProducersRequest[0](
        topics=[DescribeProducersRequest.TopicRequest(name=topic, partition_indexes=[7])]
    )
    assert ask(kcluster, request, DescribeProducersResponse[0]).topics[0].partitions[0].error_code == 3
