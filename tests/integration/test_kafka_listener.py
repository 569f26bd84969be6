"""The Kafka-protocol listener against real broker processes, with kafka-python as the client.

kafka-python (3.x) is a client no one here wrote: its own codecs (generated from its own copy of
Kafka's JSON) encode the requests and decode the answers. The bad-input tests speak raw bytes so
they can send what no client would, and then check that the broker still answers, logged one
line per closed connection, and still serves its data over gRPC.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluice.broker.cluster import coordinator_partition
from sluice.broker.kafka_wire import codec
from sluice.broker.kafka_wire.messages.metadata_response import MetadataResponse as KMetadataResponse
from sluice.client import Admin, Producer
from sluice.testing import LocalCluster
from sluice.testing._net import free_port

kafka = pytest.importorskip("kafka")  # the dev extra installs kafka-python
from kafka import KafkaConsumer  # noqa: E402
from kafka.admin import (  # noqa: E402
    ConfigResource,
    ConfigResourceType,
    KafkaAdminClient,
    NewPartitions,
    NewTopic,
)
from kafka.protocol.admin import (  # noqa: E402
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
    ListTransactionsRequest,
    ListTransactionsResponse,
)
from kafka.protocol.consumer import (  # noqa: E402
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
)
from kafka.protocol.metadata import (  # noqa: E402
    ApiVersionsRequest,
    ApiVersionsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import (  # noqa: E402
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
)

MAX_REQUEST = 64 * 1024  # socket.request.max.bytes of the test cluster
CLOSE_LINE = "kafka listener: closing the connection from"


@pytest.fixture(scope="module")
def kcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(
        brokers=1,
        data_dir=tmp_path_factory.mktemp("kafka-listener"),
        config={"socket.request.max.bytes": MAX_REQUEST},
        kafka_listener=True,
    ) as cluster:
        yield cluster


def kafka_address(cluster: LocalCluster, i: int = 0) -> tuple[str, int]:
    host, _, port = cluster.kafka_bootstrap_servers.split(",")[i].rpartition(":")
    return host, int(port)


def connect(cluster: LocalCluster) -> socket.socket:
    return socket.create_connection(kafka_address(cluster), timeout=20)


def read_frame(sock: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError(f"closed after {len(out)} of {n} bytes")
            out += chunk
        return out

    (size,) = struct.unpack(">i", exactly(4))
    return exactly(size)


def closed_by_peer(sock: socket.socket, timeout: float = 20.0) -> bool:
    """True when the broker closes the connection within ``timeout`` (it sends nothing first)."""
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def close_lines(cluster: LocalCluster) -> int:
    return cluster.brokers[0].log_path.read_text(errors="replace").count(CLOSE_LINE)


def test_api_versions_at_every_version(kcluster: LocalCluster) -> None:
    with connect(kcluster) as sock:
        for version in range(5):
            kwargs = {"client_software_name": "t", "client_software_version": "1"} if version >= 3 else {}
            request = ApiVersionsRequest[version](**kwargs)
            request.with_header(correlation_id=100 + version, client_id="sluice-test")
            sock.sendall(bytes(request.encode(header=True, framed=True)))
            response = ApiVersionsResponse[version].decode(read_frame(sock), header=True)
            assert response.header.correlation_id == 100 + version
            assert response.error_code == 0
            served = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
            assert served[18] == (0, 4)  # ApiVersions
            assert served[3] == (0, 13)  # Metadata
            if version >= 3:
                assert response.finalized_features == []  # no transaction.version: TV2 is not served here


def test_api_versions_above_ours_is_answered_at_v0_with_unsupported_version(kcluster: LocalCluster) -> None:
    """KIP-511: a client newer than the broker learns the supported range from a v0 answer."""
    with connect(kcluster) as sock:
        # ApiVersions v9 (no such version yet): header v2, a body we cannot know
        header = struct.pack(">hhi", 18, 9, 4242) + struct.pack(">h", 4) + b"next" + b"\x00"
        body = b"\x05future\x02\x00\x00"
        sock.sendall(struct.pack(">i", len(header) + len(body)) + header + body)
        response = ApiVersionsResponse[0].decode(read_frame(sock), header=True)
        assert response.header.correlation_id == 4242
        assert response.error_code == 35  # UNSUPPORTED_VERSION
        assert {k.api_key for k in response.api_keys} >= {3, 18}
        # the connection stays usable: the client retries at a version we serve
        request = ApiVersionsRequest[3](client_software_name="t", client_software_version="1")
        request.with_header(correlation_id=4243, client_id="x")
        sock.sendall(bytes(request.encode(header=True, framed=True)))
        assert ApiVersionsResponse[3].decode(read_frame(sock), header=True).error_code == 0


def test_metadata_through_kafka_python(kcluster: LocalCluster) -> None:
    topic = "kafka-listener-metadata"
    Admin(bootstrap_servers=kcluster.bootstrap_servers).create_topic(topic, partitions=3, replication_factor=1)
    consumer = KafkaConsumer(bootstrap_servers=kcluster.kafka_bootstrap_servers, request_timeout_ms=30000)
    try:
        assert topic in consumer.topics()
        assert consumer.partitions_for_topic(topic) == {0, 1, 2}
        brokers = consumer._client.cluster.brokers()
        assert [(b.node_id, b.host, b.port) for b in brokers] == [(0, *kafka_address(kcluster))]
        for p in range(3):
            assert consumer._client.cluster.leader_for_partition(kafka.TopicPartition(topic, p)) == 0
    finally:
        consumer.close()


def test_metadata_at_every_version_names_topics_ids_and_unknowns(kcluster: LocalCluster) -> None:
    topic = "kafka-listener-metadata-versions"
    admin = Admin(bootstrap_servers=kcluster.bootstrap_servers)
    admin.create_topic(topic, partitions=2, replication_factor=1)
    with connect(kcluster) as sock:
        for version in range(14):
            topics: list[object] = [
                MetadataRequest.MetadataRequestTopic(name=name) for name in (topic, "no-such-topic")
            ]
            request = MetadataRequest[version](topics=topics, allow_auto_topic_creation=False)
            request.with_header(correlation_id=version, client_id="t")
            sock.sendall(bytes(request.encode(header=True, framed=True)))
            response = MetadataResponse[version].decode(read_frame(sock), header=True)
            assert response.header.correlation_id == version
            by_name = {t.name: t for t in response.topics}
            assert by_name["no-such-topic"].error_code == 3  # UNKNOWN_TOPIC_OR_PARTITION
            found = by_name[topic]
            assert found.error_code == 0
            assert sorted(p.partition_index for p in found.partitions) == [0, 1]
            assert all(p.leader_id == 0 and p.isr_nodes == [0] for p in found.partitions)
            if version >= 7:
                assert all(p.leader_epoch >= 0 for p in found.partitions)
            if version >= 10:
                assert found.topic_id.int != 0
    # v10+: a topic asked for by id only
    with connect(kcluster) as sock:
        request = MetadataRequest[12](topics=None, allow_auto_topic_creation=False)
        request.with_header(correlation_id=1, client_id="t")
        sock.sendall(bytes(request.encode(header=True, framed=True)))
        everything = MetadataResponse[12].decode(read_frame(sock), header=True)
        topic_id = next(t.topic_id for t in everything.topics if t.name == topic)
        assert {"__consumer_offsets", "__transaction_state"} <= {t.name for t in everything.topics}
        by_id = MetadataRequest[12](topics=[MetadataRequest.MetadataRequestTopic(name=None, topic_id=topic_id)])
        by_id.with_header(correlation_id=2, client_id="t")
        sock.sendall(bytes(by_id.encode(header=True, framed=True)))
        answer = MetadataResponse[12].decode(read_frame(sock), header=True)
        assert [(t.name, t.error_code) for t in answer.topics] == [(topic, 0)]


def _api_versions_frame(correlation_id: int) -> bytes:
    request = ApiVersionsRequest[3](client_software_name="t", client_software_version="1")
    request.with_header(correlation_id=correlation_id, client_id="x")
    return bytes(request.encode(header=True, framed=True))


BAD_INPUT = {
    "garbage": b"\xde\xad\xbe\xef" * 8,
    "size above socket.request.max.bytes": struct.pack(">i", MAX_REQUEST + 1) + b"\x00" * 16,
    "negative size": struct.pack(">i", -5),
    "size too small for a header": struct.pack(">i", 3) + b"abc",
    "unknown API key": struct.pack(">i", 10) + struct.pack(">hhih", 999, 0, 1, -1),
    "API not served yet (CreateAcls)": struct.pack(">i", 10) + struct.pack(">hhih", 30, 1, 1, -1),
    "Metadata at a version not served": struct.pack(">i", 11) + struct.pack(">hhih", 3, 99, 1, -1) + b"\x00",
    "undecodable Metadata body": struct.pack(">i", 14) + struct.pack(">hhih", 3, 1, 1, -1) + struct.pack(">i", 5),
    "truncated header": struct.pack(">i", 10) + struct.pack(">hhi", 3, 1, 1) + b"\x00\x09ab",
}


@pytest.mark.parametrize("payload", list(BAD_INPUT.values()), ids=list(BAD_INPUT))
def test_bad_input_closes_the_connection_with_one_log_line(kcluster: LocalCluster, payload: bytes) -> None:
    before = close_lines(kcluster)
    with connect(kcluster) as sock:
        sock.sendall(payload)
        assert closed_by_peer(sock)
    deadline = time.monotonic() + 20
    while close_lines(kcluster) == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert close_lines(kcluster) == before + 1
    # the broker is up and answers the next connection
    with connect(kcluster) as sock:
        sock.sendall(_api_versions_frame(5))
        assert ApiVersionsResponse[3].decode(read_frame(sock), header=True).error_code == 0


# librdkafka 2.16's all-topics Metadata v13, byte for byte (client id "rdkafka"): its topics count is left as
# the 4-byte int32 placeholder 00 00 00 00, where a compact null is the 1 byte 00.
LIBRDKAFKA_ALL_TOPICS_V13 = bytes.fromhex("0003000d00000003000772646b61666b6100" + "00000000010000")


def test_bytes_after_a_request_body_are_ignored_as_kafka_does(kcluster: LocalCluster) -> None:
    """Kafka's broker never checks a request was read whole; librdkafka 2.16's all-topics Metadata relies on it."""
    Admin(bootstrap_servers=kcluster.bootstrap_servers).create_topic("left-over-bytes", partitions=2)
    before = close_lines(kcluster)
    with connect(kcluster) as sock:
        sock.sendall(struct.pack(">i", len(LIBRDKAFKA_ALL_TOPICS_V13)) + LIBRDKAFKA_ALL_TOPICS_V13)
        frame = read_frame(sock)
        assert struct.unpack(">i", frame[:4])[0] == 3  # correlation id; then header v1's empty tag section
        answer = codec.decode(KMetadataResponse, frame[5:], 13)
        topic = {t.name: t for t in answer.topics}["left-over-bytes"]  # null topics: every topic
        assert (topic.error_code, len(topic.partitions)) == (0, 2)
        # v1 (int32 counts) with an empty topic list and one byte more: brokers only, answered too
        sock.sendall(struct.pack(">i", 15) + struct.pack(">hhih", 3, 1, 4, -1) + b"\x00\x00\x00\x00!")
        assert MetadataResponse[1].decode(read_frame(sock), header=True).topics == []
    assert close_lines(kcluster) == before


def test_frame_cut_short_then_closed_by_the_client(kcluster: LocalCluster) -> None:
    before = close_lines(kcluster)
    with connect(kcluster) as sock:
        frame = _api_versions_frame(1)
        sock.sendall(frame[: len(frame) // 2])
    deadline = time.monotonic() + 20
    while close_lines(kcluster) == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert close_lines(kcluster) == before + 1
    with connect(kcluster) as sock:
        sock.sendall(_api_versions_frame(2))
        assert ApiVersionsResponse[3].decode(read_frame(sock), header=True).error_code == 0


def test_pipelined_requests_are_answered_in_order(kcluster: LocalCluster) -> None:
    with connect(kcluster) as sock:
        sock.sendall(b"".join(_api_versions_frame(i) for i in range(50)))
        ids = [ApiVersionsResponse[3].decode(read_frame(sock), header=True).header.correlation_id for _ in range(50)]
        assert ids == list(range(50))


def test_listener_is_off_unless_configured(tmp_path_factory: pytest.TempPathFactory) -> None:
    with LocalCluster(brokers=1, data_dir=tmp_path_factory.mktemp("no-kafka")) as cluster:
        with pytest.raises(Exception, match="kafka_listener=True"):
            _ = cluster.kafka_bootstrap_servers
        log = cluster.brokers[0].log_path.read_text()
        assert "serves the Kafka protocol" not in log


def test_three_brokers_each_advertise_their_own_address(tmp_path_factory: pytest.TempPathFactory) -> None:
    topic = "kafka-listener-rf3"
    with LocalCluster(brokers=3, data_dir=tmp_path_factory.mktemp("kafka-3"), kafka_listener=True) as cluster:
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        admin.create_topic(topic, partitions=3, replication_factor=3)
        expected = {i: kafka_address(cluster, i) for i in range(3)}
        # every broker answers Metadata with all three Kafka addresses and the same leaders
        leaders: list[dict[int, int]] = []
        for i in range(3):
            consumer = KafkaConsumer(bootstrap_servers=":".join(map(str, expected[i])), request_timeout_ms=30000)
            try:
                assert consumer.partitions_for_topic(topic) == {0, 1, 2}
                cluster_md = consumer._client.cluster
                assert {b.node_id: (b.host, b.port) for b in cluster_md.brokers()} == expected
                leaders.append({p: cluster_md.leader_for_partition(kafka.TopicPartition(topic, p)) for p in range(3)})
            finally:
                consumer.close()
        assert leaders[0] == leaders[1] == leaders[2]
        assert set(leaders[0].values()) <= {0, 1, 2}
        # FindCoordinator on any broker names the leader of the key's coordinator partition
        described = {
            t: Admin(bootstrap_servers=cluster.bootstrap_servers).describe_topic(t)
            for t in ("__consumer_offsets", "__transaction_state")
        }
        keys = [f"key-{n}" for n in range(12)]
        for i in range(3):
            for key_type, internal in ((0, "__consumer_offsets"), (1, "__transaction_state")):
                partitions = described[internal].partitions
                want = []
                for key in keys:
                    leader = partitions[coordinator_partition(key, len(partitions))].leader
                    want.append((key, 0, leader, *expected[leader]))
                assert find_coordinators(expected[i], keys, key_type) == want


def test_topic_admin_through_kafka_python_is_what_grpc_sees(kcluster: LocalCluster) -> None:
    name = "kafka-admin-topic"
    admin = KafkaAdminClient(bootstrap_servers=kcluster.kafka_bootstrap_servers, request_timeout_ms=30000)
    grpc_admin = Admin(bootstrap_servers=kcluster.bootstrap_servers)
    try:
        created = admin.create_topics([NewTopic(name, 3, 1, topic_configs={"retention.ms": "60000"})])
        [result] = created["topics"]
        assert (result["error_code"], result["num_partitions"], result["replication_factor"]) == (0, 3, 1)
        described = grpc_admin.describe_topic(name)
        assert len(described.partitions) == 3
        assert str(result["topic_id"]).replace("-", "") == described.topic_id
        # refusals carry Kafka's codes, per topic, from the same rules as gRPC's
        for bad, error in (
            (NewTopic(name, 3, 1), kafka.errors.TopicAlreadyExistsError),
            (NewTopic("bad name!", 1, 1), kafka.errors.InvalidTopicError),
            (
                NewTopic("kafka-admin-seg", 1, 1, topic_configs={"segment.bytes": "1"}),
                kafka.errors.InvalidConfigurationError,
            ),
        ):
            with pytest.raises(error):
                admin.create_topics([bad])
        assert admin.create_partitions({name: NewPartitions(5)}).results[0].error_code == 0
        assert len(grpc_admin.describe_topic(name).partitions) == 5
        cluster_info = admin.describe_cluster()
        assert [(b["broker_id"], b["host"], b["port"]) for b in cluster_info["brokers"]] == [
            (0, *kafka_address(kcluster))
        ]
        # -1 partitions and replication factor: the broker's defaults (num.partitions, default.replication.factor)
        [defaulted] = admin.create_topics([NewTopic(f"{name}-defaults", -1, -1)])["topics"]
        assert (defaulted["error_code"], defaulted["num_partitions"], defaulted["replication_factor"]) == (0, 1, 1)
        assert admin.delete_topics([name])["topics"][0]["error_code"] == 0
        assert name not in admin.list_topics()
        with pytest.raises(kafka.errors.UnknownTopicOrPartitionError):
            admin.delete_topics([name])
    finally:
        admin.close()
        grpc_admin.close()


def find_coordinators(address: tuple[str, int], keys: list[str], key_type: int) -> list[tuple[str, int, int, str, int]]:
    """(key, error, node, host, port) from FindCoordinator v4 (batched), and v3 for the first key."""
    with socket.create_connection(address, timeout=20) as sock:
        request = FindCoordinatorRequest[4](key_type=key_type, coordinator_keys=keys)
        request.with_header(correlation_id=1, client_id="t")
        sock.sendall(bytes(request.encode(header=True, framed=True)))
        response = FindCoordinatorResponse[4].decode(read_frame(sock), header=True)
        out = [(c.key, c.error_code, c.node_id, c.host, c.port) for c in response.coordinators]
        single = FindCoordinatorRequest[3](key=keys[0], key_type=key_type)
        single.with_header(correlation_id=2, client_id="t")
        sock.sendall(bytes(single.encode(header=True, framed=True)))
        one = FindCoordinatorResponse[3].decode(read_frame(sock), header=True)
        assert (keys[0], one.error_code, one.node_id, one.host, one.port) == out[0]
    return out


def test_find_coordinator_for_groups_and_transactional_ids(kcluster: LocalCluster) -> None:
    address = kafka_address(kcluster)
    for key_type in (0, 1):
        answers = find_coordinators(address, ["group-a", "txn-b", "c"], key_type)
        assert answers == [(key, 0, 0, *address) for key in ("group-a", "txn-b", "c")]
    # an empty key and an unknown key type (2: share groups) are INVALID_REQUEST per key
    assert find_coordinators(address, [""], 0)[0][1] == 42
    assert find_coordinators(address, ["x"], 2)[0][1] == 42


def ask(cluster: LocalCluster, request: Any, response_class: Any) -> Any:
    with connect(cluster) as sock:
        request.with_header(correlation_id=9, client_id="t")
        sock.sendall(bytes(request.encode(header=True, framed=True)))
        return response_class.decode(read_frame(sock), header=True)


def list_offsets(cluster: LocalCluster, topic: str, version: int, specs: list[tuple[int, int, int]]) -> list[Any]:
    """(partition, error, offset, timestamp, leader_epoch) for (partition, spec, current_leader_epoch)."""
    parts = [
        ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
            partition_index=p, timestamp=spec, current_leader_epoch=epoch
        )
        for p, spec, epoch in specs
    ]
    topics = [ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=parts)]
    request = ListOffsetsRequest[version](replica_id=-1, isolation_level=0, topics=topics)
    [answered] = ask(cluster, request, ListOffsetsResponse[version]).topics
    return [(p.partition_index, p.error_code, p.offset, p.timestamp, p.leader_epoch) for p in answered.partitions]


def test_list_offsets_of_records_written_over_grpc(kcluster: LocalCluster) -> None:
    topic = "kafka-list-offsets"
    Admin(bootstrap_servers=kcluster.bootstrap_servers).create_topic(topic, partitions=1, replication_factor=1)
    producer = Producer(bootstrap_servers=kcluster.bootstrap_servers, linger_ms=0)
    for i in range(10):
        producer.send(topic, value=b"v", partition=0, timestamp_ms=1_000_000 + i * 1000).result(timeout=60)
    producer.close()
    epoch = Admin(bootstrap_servers=kcluster.bootstrap_servers).describe_topic(topic).partitions[0].leader_epoch
    for version in (1, 4, 7, 8, 11):
        got = list_offsets(kcluster, topic, version, [(0, -1, -1), (0, -2, -1), (0, 1_004_500, -1)])
        assert [(e, o) for _, e, o, _, _ in got] == [(0, 10), (0, 0), (0, 5)]
        assert got[2][3] == 1_005_000  # the timestamp of the record found
        if version >= 4:
            assert {le for *_, le in got} == {epoch}
    got = list_offsets(kcluster, topic, 8, [(0, -3, -1), (0, -4, -1), (0, -5, -1)])
    assert [(e, o) for _, e, o, _, _ in got] == [(0, 9), (0, 0), (42, -1)]  # max timestamp, earliest local, tiered
    # a stale or future leader epoch: the client must refresh its metadata
    if epoch > 0:
        assert list_offsets(kcluster, topic, 8, [(0, -1, epoch - 1)])[0][1] == 74  # FENCED_LEADER_EPOCH
    assert list_offsets(kcluster, topic, 8, [(0, -1, epoch + 1)])[0][1] == 75  # UNKNOWN_LEADER_EPOCH
    assert list_offsets(kcluster, topic, 8, [(3, -1, -1)])[0][1] == 3  # UNKNOWN_TOPIC_OR_PARTITION


def init_producer_id(cluster: LocalCluster, version: int, txn_id: str | None, timeout_ms: int = 60000) -> Any:
    kwargs: dict[str, Any] = {"transactional_id": txn_id, "transaction_timeout_ms": timeout_ms}
    if version >= 3:
        kwargs.update(producer_id=-1, producer_epoch=-1)
    return ask(cluster, InitProducerIdRequest[version](**kwargs), InitProducerIdResponse[version])


def test_init_producer_id_idempotent_and_transactional(kcluster: LocalCluster) -> None:
    idempotent = init_producer_id(kcluster, 3, None)
    assert idempotent.error_code == 0 and idempotent.producer_id > 0 and idempotent.producer_epoch == 0
    first = init_producer_id(kcluster, 0, "kafka-txn-a")
    second = init_producer_id(kcluster, 5, "kafka-txn-a")
    assert first.error_code == second.error_code == 0
    assert second.producer_id == first.producer_id
    assert second.producer_epoch == first.producer_epoch + 1  # the first producer is fenced
    assert init_producer_id(kcluster, 4, "kafka-txn-b", 10**9).error_code == 50  # INVALID_TRANSACTION_TIMEOUT


def add_partitions(cluster: LocalCluster, version: int, txn: str, pid: int, epoch: int, topic: str) -> list[Any]:
    topics = [AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name=topic, partitions=[0, 1])]
    request = AddPartitionsToTxnRequest[version](
        v3_and_below_transactional_id=txn,
        v3_and_below_producer_id=pid,
        v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=topics,
    )
    response = ask(cluster, request, AddPartitionsToTxnResponse[version])
    return [
        (t.name, p.partition_index, p.partition_error_code)
        for t in response.results_by_topic_v3_and_below
        for p in t.results_by_partition
    ]


def end_txn(cluster: LocalCluster, version: int, txn: str, pid: int, epoch: int, commit: bool) -> int:
    request = EndTxnRequest[version](transactional_id=txn, producer_id=pid, producer_epoch=epoch, committed=commit)
    return int(ask(cluster, request, EndTxnResponse[version]).error_code)


def test_a_transaction_driven_over_the_kafka_protocol(kcluster: LocalCluster) -> None:
    """librdkafka's versions (AddPartitionsToTxn/AddOffsetsToTxn v0, EndTxn v0-1) and the flexible ones."""
    topic = "kafka-txn-topic"
    grpc_admin = Admin(bootstrap_servers=kcluster.bootstrap_servers)
    grpc_admin.create_topic(topic, partitions=2, replication_factor=1)
    txn = "kafka-txn-flow"
    init = init_producer_id(kcluster, 1, txn)
    pid, epoch = init.producer_id, init.producer_epoch
    assert add_partitions(kcluster, 0, txn, pid, epoch, topic) == [(topic, 0, 0), (topic, 1, 0)]
    offsets = AddOffsetsToTxnRequest[0](transactional_id=txn, producer_id=pid, producer_epoch=epoch, group_id="g")
    assert ask(kcluster, offsets, AddOffsetsToTxnResponse[0]).error_code == 0
    [described] = grpc_admin.describe_transactions([txn])
    assert described.state == "Ongoing" and {tp.partition for tp in described.partitions if tp.topic == topic} == {0, 1}
    assert end_txn(kcluster, 1, txn, pid, epoch, commit=True) == 0
    deadline = time.monotonic() + 30
    while grpc_admin.describe_transactions([txn])[0].state != "CompleteCommit" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert grpc_admin.describe_transactions([txn])[0].state == "CompleteCommit"
    # what kafka-transactions.sh describe/list would show
    described_k = ask(kcluster, DescribeTransactionsRequest[0](transactional_ids=[txn, "no-such-txn"]),
                      DescribeTransactionsResponse[0]).transaction_states  # fmt: skip
    assert [(d.transactional_id, d.error_code) for d in described_k] == [(txn, 0), ("no-such-txn", 105)]
    assert (described_k[0].transaction_state, described_k[0].producer_id) == ("CompleteCommit", pid)

    def listed(states: list[str]) -> tuple[list[str], set[str]]:
        request = ListTransactionsRequest[0](state_filters=states, producer_id_filters=[])
        response = ask(kcluster, request, ListTransactionsResponse[0])
        assert response.error_code == 0
        return response.unknown_state_filters, {t.transactional_id for t in response.transaction_states}

    assert txn in listed([])[1] and txn in listed(["CompleteCommit"])[1]
    assert txn not in listed(["Ongoing"])[1]
    assert listed(["Bogus"]) == (["Bogus"], set())

    # a second round with the flexible versions, then the old producer is fenced
    assert add_partitions(kcluster, 3, txn, pid, epoch, topic) == [(topic, 0, 0), (topic, 1, 0)]
    assert end_txn(kcluster, 3, txn, pid, epoch, commit=False) == 0
    # While the abort's markers are written the coordinator holds the id (up to 5 s) and may then
    # answer CONCURRENT_TRANSACTIONS (51), retriable: a Kafka client retries, so does this one.
    deadline = time.monotonic() + 30
    newer = init_producer_id(kcluster, 4, txn)
    while newer.error_code == 51 and time.monotonic() < deadline:
        time.sleep(0.1)
        newer = init_producer_id(kcluster, 4, txn)
    assert newer.error_code == 0
    assert (newer.producer_id, newer.producer_epoch) == (pid, epoch + 1)
    assert end_txn(kcluster, 3, txn, pid, epoch, commit=True) == 90  # PRODUCER_FENCED
    assert end_txn(kcluster, 1, txn, pid, epoch, commit=True) == 47  # INVALID_PRODUCER_EPOCH before v2 (KIP-588)
    assert add_partitions(kcluster, 0, txn, pid, epoch, topic) == [(topic, 0, 47), (topic, 1, 47)]
    assert add_partitions(kcluster, 2, txn, pid, epoch, topic) == [(topic, 0, 90), (topic, 1, 90)]
    grpc_admin.close()


def commit_offsets(cluster: LocalCluster, version: int, group: str, topic: str, offsets: dict[int, int]) -> list[Any]:
    partition = OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition
    parts = [partition(partition_index=p, committed_offset=o, committed_metadata="m") for p, o in offsets.items()]
    topics = [OffsetCommitRequest.OffsetCommitRequestTopic(name=topic, partitions=parts)]
    request = OffsetCommitRequest[version](
        group_id=group, generation_id_or_member_epoch=-1, member_id="", retention_time_ms=-1, topics=topics
    )
    response = ask(cluster, request, OffsetCommitResponse[version])
    return sorted((t.name, p.partition_index, p.error_code) for t in response.topics for p in t.partitions)


def fetch_offsets(cluster: LocalCluster, version: int, group: str, topic: str, stable: bool = False) -> list[Any]:
    """(partition, offset, error) of partitions 0 and 1, and the group-level error."""
    if version < 8:
        topics = [OffsetFetchRequest.OffsetFetchRequestTopic(name=topic, partition_indexes=[0, 1])]
        request = OffsetFetchRequest[version](group_id=group, topics=topics, require_stable=stable)
        response = ask(cluster, request, OffsetFetchResponse[version])
        found = [(p.partition_index, p.committed_offset, p.error_code) for t in response.topics for p in t.partitions]
        return [sorted(found), response.error_code if version >= 2 else 0]
    wanted = [OffsetFetchRequest.OffsetFetchRequestGroup.OffsetFetchRequestTopics(name=topic, partition_indexes=[0, 1])]
    groups = [
        OffsetFetchRequest.OffsetFetchRequestGroup(group_id=group, member_id=None, member_epoch=-1, topics=wanted)
    ]
    response = ask(
        cluster, OffsetFetchRequest[version](groups=groups, require_stable=stable), OffsetFetchResponse[version]
    )
    [g] = response.groups
    found = [(p.partition_index, p.committed_offset, p.error_code) for t in g.topics for p in t.partitions]
    return [sorted(found), g.error_code]


def test_offsets_committed_over_kafka_are_the_groups_offsets(kcluster: LocalCluster) -> None:
    topic, group = "kafka-offsets", "kafka-offsets-group"
    grpc_admin = Admin(bootstrap_servers=kcluster.bootstrap_servers)
    grpc_admin.create_topic(topic, partitions=2, replication_factor=1)
    assert commit_offsets(kcluster, 2, group, topic, {0: 5, 1: 7}) == [(topic, 0, 0), (topic, 1, 0)]
    for version in (1, 2, 5, 7, 8, 9):
        assert fetch_offsets(kcluster, version, group, topic) == [[(0, 5, 0), (1, 7, 0)], 0]
    assert commit_offsets(kcluster, 9, group, topic, {1: 11}) == [(topic, 1, 0)]
    committed = grpc_admin.list_consumer_group_offsets(group)
    assert {(tp.partition, o) for tp, o in committed.items()} == {(0, 5), (1, 11)}
    grpc_admin.close()


def test_send_offsets_to_transaction_over_kafka(kcluster: LocalCluster) -> None:
    topic, group, txn = "kafka-txn-offsets", "kafka-txn-offsets-group", "kafka-txn-offsets-id"
    Admin(bootstrap_servers=kcluster.bootstrap_servers).create_topic(topic, partitions=2, replication_factor=1)
    init = init_producer_id(kcluster, 1, txn)
    pid, epoch = init.producer_id, init.producer_epoch
    offsets = AddOffsetsToTxnRequest[0](transactional_id=txn, producer_id=pid, producer_epoch=epoch, group_id=group)
    assert ask(kcluster, offsets, AddOffsetsToTxnResponse[0]).error_code == 0
    partition = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic.TxnOffsetCommitRequestPartition
    topics = [TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic(
        name=topic, partitions=[partition(partition_index=0, committed_offset=42, committed_metadata=None)]
    )]  # fmt: skip
    request = TxnOffsetCommitRequest[0](
        transactional_id=txn, group_id=group, producer_id=pid, producer_epoch=epoch, topics=topics
    )
    response = ask(kcluster, request, TxnOffsetCommitResponse[0])
    assert [(t.name, p.partition_index, p.error_code) for t in response.topics for p in t.partitions] == [(topic, 0, 0)]
    # pending until the commit: require_stable reads UNSTABLE_OFFSET_COMMIT, the default read sees none yet
    assert fetch_offsets(kcluster, 7, group, topic, stable=True)[0][0] == (0, -1, 88)
    assert fetch_offsets(kcluster, 7, group, topic)[0][0] == (0, -1, 0)
    assert end_txn(kcluster, 1, txn, pid, epoch, commit=True) == 0
    deadline = time.monotonic() + 30
    while fetch_offsets(kcluster, 8, group, topic)[0][0] != (0, 42, 0) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert fetch_offsets(kcluster, 8, group, topic)[0][0] == (0, 42, 0)


def test_offset_for_leader_epoch_validates_positions(kcluster: LocalCluster) -> None:
    topic = "kafka-leader-epoch"
    admin = Admin(bootstrap_servers=kcluster.bootstrap_servers)
    admin.create_topic(topic, partitions=1, replication_factor=1)
    producer = Producer(bootstrap_servers=kcluster.bootstrap_servers, linger_ms=0)
    for _ in range(6):
        producer.send(topic, value=b"v", partition=0).result(timeout=60)
    producer.close()
    epoch = admin.describe_topic(topic).partitions[0].leader_epoch
    admin.close()

    def ask_epoch(version: int, current: int, wanted: int) -> tuple[int, int, int]:
        partition = OffsetForLeaderEpochRequest.OffsetForLeaderTopic.OffsetForLeaderPartition
        topics = [OffsetForLeaderEpochRequest.OffsetForLeaderTopic(
            topic=topic, partitions=[partition(partition=0, current_leader_epoch=current, leader_epoch=wanted)]
        )]  # fmt: skip
        request = OffsetForLeaderEpochRequest[version](replica_id=-1, topics=topics)
        [result] = ask(kcluster, request, OffsetForLeaderEpochResponse[version]).topics
        [p] = result.partitions
        return p.error_code, p.leader_epoch, p.end_offset

    for version in (2, 3, 4):
        assert ask_epoch(version, epoch, epoch) == (0, epoch, 6)  # the current epoch ends at the log end
        assert ask_epoch(version, -1, epoch) == (0, epoch, 6)
        assert ask_epoch(version, epoch + 1, epoch)[0] == 75  # UNKNOWN_LEADER_EPOCH: the client is ahead


def test_describe_configs_of_topics_and_the_broker(kcluster: LocalCluster) -> None:
    topic = "kafka-describe-configs"
    admin = KafkaAdminClient(bootstrap_servers=kcluster.kafka_bootstrap_servers, request_timeout_ms=30000)
    try:
        admin.create_topics([NewTopic(topic, 1, 1, topic_configs={"retention.ms": "60000"})])
        resources = [ConfigResource(ConfigResourceType.TOPIC, topic), ConfigResource(ConfigResourceType.BROKER, "0")]
        described = admin.describe_configs(resources, include_synonyms=True, config_filter="all")
        topic_configs = described["topic"][topic]
        assert topic_configs["retention.ms"]["value"] == "60000"
        assert topic_configs["retention.ms"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
        assert [s["source"] for s in topic_configs["retention.ms"]["synonyms"]] == [
            "DYNAMIC_TOPIC_CONFIG",
            "DEFAULT_CONFIG",
        ]
        assert topic_configs["cleanup.policy"]["value"] == "delete"
        assert topic_configs["cleanup.policy"]["config_source"] == "DEFAULT_CONFIG"
        broker_configs = described["broker"]["0"]
        assert broker_configs["socket.request.max.bytes"]["value"] == str(MAX_REQUEST)
        assert broker_configs["socket.request.max.bytes"]["config_source"] == "STATIC_BROKER_CONFIG"
        assert broker_configs["socket.request.max.bytes"]["read_only"] is True
        assert "sluice.test.hooks" not in broker_configs
    finally:
        admin.close()
    # refusals per resource: an unknown topic, another broker, a resource type not served
    resource = DescribeConfigsRequest.DescribeConfigsResource
    request = DescribeConfigsRequest[4](
        resources=[
            resource(resource_type=2, resource_name="no-such-topic", configuration_keys=None),
            resource(resource_type=4, resource_name="7", configuration_keys=None),
            resource(resource_type=8, resource_name="x", configuration_keys=None),
            resource(resource_type=2, resource_name=topic, configuration_keys=["retention.ms", "no.such.key"]),
        ],
        include_synonyms=False,
        include_documentation=False,
    )
    results = ask(kcluster, request, DescribeConfigsResponse[4]).results
    assert [r.error_code for r in results] == [3, 42, 42, 0]
    assert [(c.name, c.value) for c in results[3].configs] == [("retention.ms", "60000")]


def test_kafka_advertise_is_the_address_clients_are_given(tmp_path: Path) -> None:
    """``--kafka-advertise``: behind a Service or NAT the broker names an address other than its socket's."""
    grpc_port, kafka_port = free_port(), free_port()
    log_path = tmp_path / "broker.log"
    with open(log_path, "wb") as log_file:
        broker = subprocess.Popen(
            [sys.executable, "-m", "sluice.broker", "--id", "0", "--listen", f"127.0.0.1:{grpc_port}",
             "--data", str(tmp_path / "data"), "--kafka-listen", f"127.0.0.1:{kafka_port}",
             "--kafka-advertise", "kafka-0.example.test:19093"],
            stdout=log_file, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                sock = socket.create_connection(("127.0.0.1", kafka_port), timeout=5)
                break
            except OSError:
                assert broker.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, "the Kafka listener did not open within 60 s"
                time.sleep(0.2)
        with sock:
            request = MetadataRequest[12](topics=None, allow_auto_topic_creation=False)
            request.with_header(correlation_id=1, client_id="t")
            sock.sendall(bytes(request.encode(header=True, framed=True)))
            response = MetadataResponse[12].decode(read_frame(sock), header=True)
        assert [(b.node_id, b.host, b.port) for b in response.brokers] == [(0, "kafka-0.example.test", 19093)]
    finally:
        broker.terminate()
        try:
            broker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            broker.kill()
            broker.wait(timeout=10)


def test_idle_and_stalled_connections_are_closed(tmp_path: Path) -> None:
    idle_ms = 1500
    with LocalCluster(
        brokers=1, data_dir=tmp_path / "c", config={"connections.max.idle.ms": idle_ms}, kafka_listener=True
    ) as cluster:
        with (
            socket.create_connection(kafka_address(cluster), timeout=20) as idle,
            socket.create_connection(kafka_address(cluster), timeout=20) as stalled,
        ):
            stalled.sendall(_api_versions_frame(1)[:7])  # a frame begun, never finished
            started = time.monotonic()
            assert closed_by_peer(idle) and closed_by_peer(stalled)
            assert time.monotonic() - started >= idle_ms / 1000 * 0.5
        # a connection that keeps asking is not idle
        with socket.create_connection(kafka_address(cluster), timeout=20) as busy:
            for i in range(6):
                busy.sendall(_api_versions_frame(i))
                assert ApiVersionsResponse[3].decode(read_frame(busy), header=True).error_code == 0
                time.sleep(idle_ms / 1000 / 3)
        log = cluster.brokers[0].log_path.read_text()
        assert log.count("no complete request within connections.max.idle.ms") == 2
