"""TLS, client certificates and ACLs on the Kafka listener, against real broker processes.

One secure cluster (``LocalCluster(secure=True, kafka_listener=True)``: mutual TLS on both client
ports, the authorizer on, deny by default, ``User:admin`` the super user). Every ACL is created
over gRPC by the super user's ``Admin``; kafka-python (an independent client: its own codecs and
TLS settings) then speaks the Kafka protocol with a certificate per principal. For each group of
APIs a request is refused without the ACL, with Kafka's error and nothing changed (no record
appended, no offset committed, no transaction state moved, no topic created or deleted), then
served with it. Raw requests (kafka-python's protocol classes over an ``ssl`` socket) check the
exact codes, per topic and partition, that clients turn into exceptions.
"""

from __future__ import annotations

import importlib
import socket
import ssl
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaTopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient
from kafka.errors import KafkaTimeoutError
from kafka.errors import TransactionalIdAuthorizationFailedError as KafkaTxnIdAuthorizationFailed
from kafka.protocol.admin import (
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteGroupsRequest,
    DeleteTopicsRequest,
    DescribeConfigsRequest,
    DescribeProducersRequest,
    DescribeTransactionsRequest,
    IncrementalAlterConfigsRequest,
    ListGroupsRequest,
    ListTransactionsRequest,
)
from kafka.protocol.consumer import (
    FetchRequest,
    ListOffsetsRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    OffsetForLeaderEpochRequest,
)
from kafka.protocol.metadata import ApiVersionsRequest, FindCoordinatorRequest, MetadataRequest
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
    ProduceRequest,
    TxnOffsetCommitRequest,
)
from kafka.record.default_records import DefaultRecordBatchBuilder

from sluice import errors, tls
from sluice.acls import AclBinding, AclBindingFilter, AclOperation, AclPermissionType, ResourcePatternType, ResourceType
from sluice.client import Admin, Producer, TopicPartition
from sluice.metadata import keys
from sluice.metadata.documents import TransactionalIdDocument, update_document
from sluice.testing import LocalCluster

TOPIC_AUTH, GROUP_AUTH, CLUSTER_AUTH, TXN_AUTH = 29, 30, 31, 53
INVALID_TOPIC, OPERATION_NOT_ATTEMPTED, UNKNOWN_TOPIC, INVALID_REQUEST = 17, 55, 3, 42
TS = 1_700_000_000_000
OP, RT = AclOperation, ResourceType


# -- the cluster and its principals ------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(
        brokers=1, data_dir=tmp_path_factory.mktemp("kafka-secure"), secure=True, kafka_listener=True
    ) as c:
        yield c


@pytest.fixture(scope="module")
def admin(cluster: LocalCluster) -> Iterator[Admin]:
    a = Admin(**cluster.client_config("admin"))
    yield a
    a.close()


def allow(admin: Admin, principal: str, rtype: ResourceType, name: str, *ops: AclOperation,
          pattern: ResourcePatternType = ResourcePatternType.LITERAL,
          permission: AclPermissionType = AclPermissionType.ALLOW) -> None:  # fmt: skip
    """ACLs created over gRPC by the super user; the broker applies its own write at once."""
    admin.create_acls(AclBinding(rtype, name, pattern, principal, "*", op, permission) for op in ops)


def kafka_address(cluster: LocalCluster) -> tuple[str, int]:
    host, _, port = cluster.kafka_bootstrap_servers.split(",")[0].rpartition(":")
    return host, int(port)


def tls_context(cluster: LocalCluster, name: str | None) -> ssl.SSLContext:
    """A client's TLS: the cluster CA to verify the broker, and ``name``'s certificate (None: none)."""
    files = cluster.kafka_client_config(name or "admin")
    context = ssl.create_default_context(cafile=files["ssl_cafile"])
    if name is not None:
        context.load_cert_chain(files["ssl_certfile"], files["ssl_keyfile"])
    return context


def tls_connect(cluster: LocalCluster, context: ssl.SSLContext) -> ssl.SSLSocket:
    host, port = kafka_address(cluster)
    return context.wrap_socket(socket.create_connection((host, port), timeout=30), server_hostname=host)


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


def send(sock: socket.socket, request: Any, correlation_id: int = 9) -> None:
    request.with_header(correlation_id=correlation_id, client_id="security-test")
    sock.sendall(bytes(request.encode(header=True, framed=True)))


def response_class(request: Any) -> Any:
    """kafka-python's response class of ``request``'s API and version (same module, Response for Request)."""
    module = importlib.import_module(type(request).__module__)
    return getattr(module, type(request).__name__.replace("Request", "Response"))[request.version]


def ask(cluster: LocalCluster, name: str, request: Any) -> Any:
    """One request over TLS as ``User:<name>``; the decoded response."""
    with tls_connect(cluster, tls_context(cluster, name)) as sock:
        send(sock, request)
        return response_class(request).decode(read_frame(sock), header=True)


def end_offset(admin: Admin, topic: str, partition: int = 0) -> int:
    return admin.list_offsets({TopicPartition(topic, partition): Admin.LATEST})[TopicPartition(topic, partition)].offset


def v2_batch(n: int = 3, pid: int = -1, epoch: int = -1, seq: int = -1, transactional: bool = False) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, 1 if transactional else 0, pid, epoch, seq, 1 << 20)
    for i in range(n):
        builder.append(i, TS + i, None, b"v-%d" % i, [])
    return bytes(builder.build())


def produce_request(topic: str, records: bytes, txn: str | None = None, version: int = 9) -> Any:
    part = ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=records)
    data = ProduceRequest.TopicProduceData(name=topic, partition_data=[part])
    return ProduceRequest[version](transactional_id=txn, acks=-1, timeout_ms=30000, topic_data=[data])


def produce_codes(resp: Any) -> list[int]:
    return [p.error_code for t in resp.responses for p in t.partition_responses]


def fetch_request(topic: str, version: int = 12, offset: int = 0) -> Any:
    part = FetchRequest.FetchTopic.FetchPartition(partition=0, fetch_offset=offset, partition_max_bytes=1 << 20)
    return FetchRequest[version](
        replica_id=-1, max_wait_ms=100, min_bytes=0, max_bytes=1 << 22, isolation_level=0, session_id=0,
        session_epoch=-1, topics=[FetchRequest.FetchTopic(topic=topic, partitions=[part])],
    )  # fmt: skip


def log_text(cluster: LocalCluster) -> str:
    return cluster.brokers[0].log_path.read_text(errors="replace")


def eventually(check: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    for _ in range(300):
        if check():
            return True
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return check()


# -- the door: TLS and client certificates ---------------------------------------------------------


def api_versions_frame() -> bytes:
    request = ApiVersionsRequest[3](client_software_name="t", client_software_version="1")
    request.with_header(correlation_id=1, client_id="x")
    return bytes(request.encode(header=True, framed=True))


def answered(sock: socket.socket) -> bytes:
    """What comes back for an ApiVersions request before the broker closes (bounded)."""
    got = b""
    try:
        sock.sendall(api_versions_frame())
        for _ in range(100):
            chunk = sock.recv(4096)
            if not chunk:
                break
            got += chunk
    except (ssl.SSLError, ConnectionError):
        pass
    return got


def test_plaintext_no_certificate_and_a_foreign_ca_are_refused_at_the_handshake(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    handshake_lines = log_text(cluster).count("TLS handshake with")
    # a plaintext Kafka client on the TLS listener: no Kafka answer (at most a TLS alert record), closed
    with socket.create_connection(kafka_address(cluster), timeout=30) as sock:
        got = answered(sock)
    assert got[:1] in (b"", b"\x15"), got[:16]
    # TLS without a client certificate
    with pytest.raises((ssl.SSLError, ConnectionError)), tls_connect(cluster, tls_context(cluster, None)) as sock:
        send(sock, ApiVersionsRequest[3](client_software_name="t", client_software_version="1"))
        read_frame(sock)
    # a certificate from another CA, with a name the cluster knows
    other_ca = tls.generate_ca("another-ca")
    forged = tls.issue(other_ca, "admin")
    tls.write_dir(tmp_path / "forged", other_ca.cert_pem, forged)
    context = tls_context(cluster, None)
    context.load_cert_chain(tmp_path / "forged" / tls.CERT_FILE, tmp_path / "forged" / tls.KEY_FILE)
    with pytest.raises((ssl.SSLError, ConnectionError)), tls_connect(cluster, context) as sock:
        send(sock, ApiVersionsRequest[3](client_software_name="t", client_software_version="1"))
        read_frame(sock)
    # one log line each, saying why
    assert eventually(lambda: log_text(cluster).count("TLS handshake with") >= handshake_lines + 3)
    text = log_text(cluster)
    assert "not a TLS handshake" in text
    assert "no client certificate" in text or "certificate required" in text.lower()
    assert "the client certificate was refused" in text
    # and the door opens for a certificate of the clients CA
    resp = ask(cluster, "alice", ApiVersionsRequest[3](client_software_name="t", client_software_version="1"))
    assert resp.error_code == 0 and {k.api_key for k in resp.api_keys} >= {0, 1, 3}


def test_kafka_python_without_tls_cannot_bootstrap(cluster: LocalCluster) -> None:
    """kafka-python in PLAINTEXT: every connection is closed at the handshake, so it finds no broker."""
    with pytest.raises(KafkaTimeoutError, match="Unable to bootstrap"):
        KafkaProducer(
            bootstrap_servers=cluster.kafka_bootstrap_servers, security_protocol="PLAINTEXT",
            request_timeout_ms=5000, max_block_ms=5000, bootstrap_timeout_ms=5000,
        )  # fmt: skip


def test_one_principal_on_both_protocols(cluster: LocalCluster, admin: Admin) -> None:
    """An ACL created over gRPC governs the same certificate's Kafka client, ALLOW and DENY alike."""
    topic = "both-protocols"
    admin.create_topic(topic, partitions=1, replication_factor=1)
    allow(admin, "User:alice", RT.TOPIC, topic, OP.WRITE)
    with Producer(**cluster.client_config("alice")) as grpc_producer:
        grpc_producer.send(topic, b"over grpc", partition=0).result(timeout=60)
    kafka_producer = KafkaProducer(**cluster.kafka_client_config("alice"), acks="all", enable_idempotence=True)
    kafka_producer.send(topic, b"over kafka", partition=0).get(timeout=60)
    kafka_producer.close()
    assert end_offset(admin, topic) == 2
    # bob's certificate is another principal: refused on the Kafka listener
    bob = ask(cluster, "bob", produce_request(topic, v2_batch()))
    assert produce_codes(bob) == [TOPIC_AUTH]
    # a DENY for User:alice (over gRPC) now refuses both of alice's clients
    allow(admin, "User:alice", RT.TOPIC, topic, OP.WRITE, permission=AclPermissionType.DENY)
    with (
        Producer(**cluster.client_config("alice")) as grpc_producer,
        pytest.raises(errors.TopicAuthorizationFailedError),
    ):
        grpc_producer.send(topic, b"refused", partition=0).result(timeout=60)
    assert produce_codes(ask(cluster, "alice", produce_request(topic, v2_batch()))) == [TOPIC_AUTH]
    assert end_offset(admin, topic) == 2


# -- the data path ------------------------------------------------------------------------------


def test_produce_needs_write_and_fetch_needs_read(cluster: LocalCluster, admin: Admin) -> None:
    topic = "sec-data"
    admin.create_topic(topic, partitions=1, replication_factor=1)
    assert produce_codes(ask(cluster, "bob", produce_request(topic, v2_batch()))) == [TOPIC_AUTH]
    assert end_offset(admin, topic) == 0  # nothing appended
    allow(admin, "User:bob", RT.TOPIC, topic, OP.WRITE)
    ok = ask(cluster, "bob", produce_request(topic, v2_batch()))
    assert [(p.error_code, p.base_offset) for t in ok.responses for p in t.partition_responses] == [(0, 0)]
    # Fetch: Read on the topic (Write implies Describe, not Read)
    [p] = ask(cluster, "bob", fetch_request(topic)).responses[0].partitions
    assert (p.error_code, p.high_watermark, p.records or b"") == (TOPIC_AUTH, -1, b"")
    allow(admin, "User:bob", RT.TOPIC, topic, OP.READ)
    [p] = ask(cluster, "bob", fetch_request(topic)).responses[0].partitions
    assert (p.error_code, p.high_watermark) == (0, 3) and len(p.records) > 0
    # kafka-python's consumer reads them with bob's certificate
    consumer = KafkaConsumer(**cluster.kafka_client_config("bob"), auto_offset_reset="earliest",
                             consumer_timeout_ms=5000, enable_auto_commit=False)  # fmt: skip
    consumer.assign([KafkaTopicPartition(topic, 0)])
    assert [m.value for m in consumer] == [b"v-0", b"v-1", b"v-2"]
    consumer.close()


def test_internal_topics_are_never_writable(cluster: LocalCluster, admin: Admin) -> None:
    records = v2_batch()
    assert produce_codes(ask(cluster, "admin", produce_request("__consumer_offsets", records))) == [INVALID_TOPIC]
    assert produce_codes(ask(cluster, "bob", produce_request("__transaction_state", records))) == [TOPIC_AUTH]


def test_metadata_hides_what_cannot_be_described(cluster: LocalCluster, admin: Admin) -> None:
    for t in ("meta-visible", "meta-hidden"):
        admin.create_topic(t, partitions=1, replication_factor=1)
    allow(admin, "User:carol", RT.TOPIC, "meta-visible", OP.DESCRIBE)
    listing = ask(
        cluster,
        "carol",
        MetadataRequest[12](topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=True),
    )
    assert [(t.name, t.error_code) for t in listing.topics] == [("meta-visible", 0)]
    # kafka-python decodes Kafka's bit field into the set of operation codes
    assert listing.topics[0].authorized_operations == {int(OP.DESCRIBE)}
    wanted = [MetadataRequest.MetadataRequestTopic(name=n) for n in ("meta-visible", "meta-hidden", "no-such-topic")]
    named = ask(cluster, "carol", MetadataRequest[12](topics=wanted, allow_auto_topic_creation=False))
    # a refused name is TOPIC_AUTHORIZATION_FAILED whether it exists or not, with no topic id
    assert [(t.name, t.error_code) for t in named.topics] == [
        ("meta-visible", 0), ("meta-hidden", TOPIC_AUTH), ("no-such-topic", TOPIC_AUTH)
    ]  # fmt: skip
    assert named.topics[1].topic_id in (None, uuid.UUID(int=0)) and named.topics[1].partitions == []  # None: zero
    # the super user sees both, and may do everything on the cluster; carol may not Describe it: 0
    everything = ask(cluster, "admin", MetadataRequest[10](topics=None, include_cluster_authorized_operations=True))
    assert {"meta-visible", "meta-hidden"} <= {t.name for t in everything.topics}
    assert everything.authorized_operations == {int(op) for op in (OP.CREATE, OP.CLUSTER_ACTION, OP.DESCRIBE_CONFIGS,
                                                                  OP.ALTER_CONFIGS, OP.IDEMPOTENT_WRITE, OP.ALTER,
                                                                  OP.DESCRIBE)}  # fmt: skip
    refused = ask(cluster, "carol", MetadataRequest[10](topics=[], include_cluster_authorized_operations=True))
    assert refused.authorized_operations == set()


def test_list_offsets_epochs_and_producers_need_describe_and_read(cluster: LocalCluster, admin: Admin) -> None:
    topic = "sec-offsets"
    admin.create_topic(topic, partitions=1, replication_factor=1)
    with Producer(**cluster.client_config("admin")) as p:
        p.send(topic, b"x", partition=0).result(timeout=60)
    spec = ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
        partition_index=0, timestamp=-1, current_leader_epoch=-1
    )
    list_req = ListOffsetsRequest[7](
        replica_id=-1, isolation_level=0, topics=[ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[spec])]
    )
    epoch_part = OffsetForLeaderEpochRequest.OffsetForLeaderTopic.OffsetForLeaderPartition(
        partition=0, current_leader_epoch=-1, leader_epoch=0
    )
    epoch_req = OffsetForLeaderEpochRequest[4](
        replica_id=-1, topics=[OffsetForLeaderEpochRequest.OffsetForLeaderTopic(topic=topic, partitions=[epoch_part])]
    )
    producers_req = DescribeProducersRequest[0](
        topics=[DescribeProducersRequest.TopicRequest(name=topic, partition_indexes=[0])]
    )

    def codes(who: str) -> tuple[int, int, int]:
        lo = ask(cluster, who, list_req).topics[0].partitions[0]
        ep = ask(cluster, who, epoch_req).topics[0].partitions[0]
        pr = ask(cluster, who, producers_req).topics[0].partitions[0]
        return lo.error_code, ep.error_code, pr.error_code

    assert codes("dave") == (TOPIC_AUTH, TOPIC_AUTH, TOPIC_AUTH)
    allow(admin, "User:dave", RT.TOPIC, topic, OP.DESCRIBE)
    assert codes("dave") == (0, 0, TOPIC_AUTH)  # DescribeProducers needs Read
    allow(admin, "User:dave", RT.TOPIC, topic, OP.READ)
    assert codes("dave") == (0, 0, 0)
    assert ask(cluster, "dave", list_req).topics[0].partitions[0].offset == 1


# -- topic administration and configs ---------------------------------------------------------------


def test_topic_admin_needs_create_delete_alter(cluster: LocalCluster, admin: Admin) -> None:
    create = CreateTopicsRequest[5](
        topics=[CreateTopicsRequest.CreatableTopic(name="erin-made", num_partitions=1, replication_factor=1,
                                                   assignments=[], configs=[])],
        timeout_ms=30000, validate_only=False,
    )  # fmt: skip
    [refused] = ask(cluster, "erin", create).topics
    assert (refused.error_code, refused.topic_config_error_code) == (TOPIC_AUTH, TOPIC_AUTH)
    assert "erin-made" not in admin.list_topics()
    allow(admin, "User:erin", RT.TOPIC, "erin-", OP.CREATE, pattern=ResourcePatternType.PREFIXED)
    [made] = ask(cluster, "erin", create).topics
    assert (made.error_code, made.num_partitions) == (0, 1)
    assert "erin-made" in admin.list_topics()
    grow = CreatePartitionsRequest[3](
        topics=[CreatePartitionsRequest.CreatePartitionsTopic(name="erin-made", count=3, assignments=None)],
        timeout_ms=30000, validate_only=False,
    )  # fmt: skip
    assert ask(cluster, "erin", grow).results[0].error_code == TOPIC_AUTH
    assert len(admin.describe_topic("erin-made").partitions) == 1
    allow(admin, "User:erin", RT.TOPIC, "erin-made", OP.ALTER)
    assert ask(cluster, "erin", grow).results[0].error_code == 0
    assert len(admin.describe_topic("erin-made").partitions) == 3
    delete = DeleteTopicsRequest[6](
        topics=[DeleteTopicsRequest.DeleteTopicState(name="erin-made", topic_id=uuid.UUID(int=0))], timeout_ms=30000
    )
    assert ask(cluster, "erin", delete).responses[0].error_code == TOPIC_AUTH
    assert "erin-made" in admin.list_topics()
    allow(admin, "User:erin", RT.TOPIC, "erin-made", OP.DELETE)
    assert ask(cluster, "erin", delete).responses[0].error_code == 0
    assert eventually(lambda: "erin-made" not in admin.list_topics())


def test_describe_configs_needs_describe_configs(cluster: LocalCluster, admin: Admin) -> None:
    topic = "sec-configs"
    admin.create_topic(topic, partitions=1, replication_factor=1)
    resources = [
        DescribeConfigsRequest.DescribeConfigsResource(resource_type=2, resource_name=topic, configuration_keys=None),
        DescribeConfigsRequest.DescribeConfigsResource(resource_type=4, resource_name="0", configuration_keys=None),
    ]
    request = DescribeConfigsRequest[4](resources=resources, include_synonyms=False, include_documentation=False)

    def answer(who: str) -> list[tuple[int, int]]:
        return [(r.error_code, len(r.configs)) for r in ask(cluster, who, request).results]

    assert answer("frank") == [(TOPIC_AUTH, 0), (CLUSTER_AUTH, 0)]
    allow(admin, "User:frank", RT.TOPIC, topic, OP.ALTER_CONFIGS)  # implies DescribeConfigs
    allow(admin, "User:frank", RT.CLUSTER, "kafka-cluster", OP.DESCRIBE_CONFIGS)
    got = answer("frank")
    assert [code for code, _ in got] == [0, 0] and all(n > 0 for _, n in got)


def test_incremental_alter_configs_needs_alter_configs(cluster: LocalCluster, admin: Admin) -> None:
    topic = "sec-alter-configs"
    admin.create_topic(topic, partitions=1, replication_factor=1, config={"retention.ms": "60000"})
    r = IncrementalAlterConfigsRequest.AlterConfigsResource
    resources = [
        r(resource_type=2, resource_name=topic,
          configs=[r.AlterableConfig(name="retention.ms", config_operation=0, value="1000")]),
        r(resource_type=2, resource_name="sec-no-such-topic",  # refused whether it exists or not
          configs=[r.AlterableConfig(name="retention.ms", config_operation=0, value="1000")]),
        r(resource_type=4, resource_name="0",
          configs=[r.AlterableConfig(name="num.partitions", config_operation=0, value="3")]),
    ]  # fmt: skip
    request = IncrementalAlterConfigsRequest[1](resources=resources, validate_only=False)

    def answer(who: str) -> list[int]:
        return [resp.error_code for resp in ask(cluster, who, request).responses]

    assert answer("grace") == [TOPIC_AUTH, TOPIC_AUTH, CLUSTER_AUTH]
    assert admin.describe_topic(topic).config == {"retention.ms": "60000"}
    # kafka-python's admin client over TLS as grace: refused, then (below) served
    kafka_admin = KafkaAdminClient(**cluster.kafka_client_config("grace"), request_timeout_ms=30000)

    def kafka_python_alter(value: str) -> str:
        resource = ConfigResource(ConfigResourceType.TOPIC, topic, configs={"max.message.bytes": value})
        return str(kafka_admin.alter_configs([resource], raise_on_unknown=False, incremental=True)["topic"][topic])

    try:
        assert kafka_python_alter("4096").startswith("[Error 29] TopicAuthorizationFailedError")
        assert admin.describe_topic(topic).config == {"retention.ms": "60000"}
        allow(admin, "User:grace", RT.TOPIC, topic, OP.ALTER_CONFIGS)
        assert kafka_python_alter("4096") == "OK"
        assert admin.describe_topic(topic).config == {"retention.ms": "60000", "max.message.bytes": "4096"}
    finally:
        kafka_admin.close()
    # ALTER_CONFIGS on another topic does not cover this one
    assert len(admin.delete_acls([AclBindingFilter(RT.TOPIC, topic, principal="User:grace")])) == 1
    allow(admin, "User:grace", RT.TOPIC, "sec-other-topic", OP.ALTER_CONFIGS)
    allow(admin, "User:grace", RT.TOPIC, topic, OP.DESCRIBE_CONFIGS)  # describing is not altering
    assert answer("grace") == [TOPIC_AUTH, TOPIC_AUTH, CLUSTER_AUTH]
    assert admin.describe_topic(topic).config == {"retention.ms": "60000", "max.message.bytes": "4096"}
    allow(admin, "User:grace", RT.TOPIC, topic, OP.ALTER_CONFIGS)
    allow(admin, "User:grace", RT.CLUSTER, "kafka-cluster", OP.ALTER_CONFIGS)
    # the topic altered; the broker resource authorized, then refused: Sluice has no dynamic broker config
    assert answer("grace") == [0, TOPIC_AUTH, INVALID_REQUEST]
    assert admin.describe_topic(topic).config == {"retention.ms": "1000", "max.message.bytes": "4096"}
    # nobody alters an internal topic, the super user included
    internal = IncrementalAlterConfigsRequest[1](
        resources=[r(resource_type=2, resource_name="__transaction_state",
                     configs=[r.AlterableConfig(name="cleanup.policy", config_operation=0, value="delete")])],
        validate_only=False,
    )  # fmt: skip
    assert [resp.error_code for resp in ask(cluster, "admin", internal).responses] == [INVALID_TOPIC]


# -- transactions --------------------------------------------------------------------------------


def init_pid(cluster: LocalCluster, who: str, txn: str | None, version: int = 4) -> Any:
    request = InitProducerIdRequest[version](
        transactional_id=txn, transaction_timeout_ms=60000, producer_id=-1, producer_epoch=-1
    )
    return ask(cluster, who, request)


def find_coordinator(cluster: LocalCluster, who: str, key: str, key_type: int) -> tuple[int, int]:
    resp = ask(cluster, who, FindCoordinatorRequest[4](key_type=key_type, coordinator_keys=[key]))
    [c] = resp.coordinators
    return c.error_code, c.node_id


def add_partitions(cluster: LocalCluster, who: str, txn: str, pid: int, epoch: int, topics: list[str]) -> list[Any]:
    request = AddPartitionsToTxnRequest[3](
        v3_and_below_transactional_id=txn, v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=[AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name=t, partitions=[0])
                             for t in topics],
    )  # fmt: skip
    resp = ask(cluster, who, request)
    return sorted(
        (t.name, p.partition_error_code) for t in resp.results_by_topic_v3_and_below for p in t.results_by_partition
    )


def test_transactions_need_write_on_the_transactional_id_and_topics(cluster: LocalCluster, admin: Admin) -> None:
    topic, other, txn, group = "sec-txn-out", "sec-txn-other", "gina-txn", "gina-group"
    for t in (topic, other):
        admin.create_topic(t, partitions=1, replication_factor=1)
    allow(admin, "User:gina", RT.TOPIC, topic, OP.WRITE)
    # the transactional id: FindCoordinator needs Describe, InitProducerId Write
    assert find_coordinator(cluster, "gina", txn, 1) == (TXN_AUTH, -1)
    assert init_pid(cluster, "gina", txn).error_code == TXN_AUTH
    assert init_pid(cluster, "gina", txn, version=0).error_code == TXN_AUTH
    kafka_producer = KafkaProducer(**cluster.kafka_client_config("gina"), transactional_id=txn)
    with pytest.raises(KafkaTxnIdAuthorizationFailed):
        kafka_producer.init_transactions()
    kafka_producer.close(timeout=5)
    with pytest.raises(errors.TransactionalIdNotFoundError):
        admin.describe_transactions([txn])  # no state was created
    allow(admin, "User:gina", RT.TRANSACTIONAL_ID, txn, OP.WRITE)
    assert find_coordinator(cluster, "gina", txn, 1)[0] == 0
    init = init_pid(cluster, "gina", txn)
    assert init.error_code == 0
    pid, epoch = init.producer_id, init.producer_epoch
    # AddPartitionsToTxn: the refused topic TOPIC_AUTHORIZATION_FAILED, the other not attempted; none added
    assert add_partitions(cluster, "gina", txn, pid, epoch, [topic, other]) == [
        (other, TOPIC_AUTH), (topic, OPERATION_NOT_ATTEMPTED)
    ]  # fmt: skip
    [state] = admin.describe_transactions([txn])
    assert state.state != "Ongoing" and state.partitions == []
    # a transactional Produce by someone without Write on the id: every partition refused, nothing appended
    allow(admin, "User:hank", RT.TOPIC, topic, OP.WRITE)
    forged = v2_batch(pid=pid, epoch=epoch, seq=0, transactional=True)
    assert produce_codes(ask(cluster, "hank", produce_request(topic, forged, txn=txn))) == [TXN_AUTH]
    assert produce_codes(ask(cluster, "hank", produce_request(topic, forged, txn=None))) == [TXN_AUTH]
    assert end_offset(admin, topic) == 0
    # with the ACLs, the transaction goes through; AddOffsetsToTxn needs Read on the group
    assert add_partitions(cluster, "gina", txn, pid, epoch, [topic]) == [(topic, 0)]
    offsets = AddOffsetsToTxnRequest[3](transactional_id=txn, producer_id=pid, producer_epoch=epoch, group_id=group)
    assert ask(cluster, "gina", offsets).error_code == GROUP_AUTH
    # EndTxn by another principal: refused, the transaction stays open
    end = EndTxnRequest[3](transactional_id=txn, producer_id=pid, producer_epoch=epoch, committed=True)
    assert ask(cluster, "hank", end).error_code == TXN_AUTH
    assert admin.describe_transactions([txn])[0].state == "Ongoing"
    assert ask(cluster, "gina", end).error_code == 0
    assert eventually(lambda: admin.describe_transactions([txn])[0].state == "CompleteCommit")


def test_kafka_python_transactions_with_the_acls(cluster: LocalCluster, admin: Admin) -> None:
    topic, txn, group = "sec-txn-client", "ivan-txn", "ivan-group"
    admin.create_topic(topic, partitions=1, replication_factor=1)
    allow(admin, "User:ivan", RT.TOPIC, topic, OP.WRITE, OP.READ)
    allow(admin, "User:ivan", RT.TRANSACTIONAL_ID, txn, OP.WRITE)
    allow(admin, "User:ivan", RT.GROUP, group, OP.READ)
    producer = KafkaProducer(**cluster.kafka_client_config("ivan"), transactional_id=txn)
    producer.init_transactions()
    producer.begin_transaction()
    for i in range(3):
        producer.send(topic, b"t-%d" % i, partition=0)
    producer.send_offsets_to_transaction({KafkaTopicPartition(topic, 0): _offset(0)}, group)
    producer.commit_transaction()
    producer.close()
    consumer = KafkaConsumer(
        **cluster.kafka_client_config("ivan"),
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        consumer_timeout_ms=5000,
        enable_auto_commit=False,
    )
    consumer.assign([KafkaTopicPartition(topic, 0)])
    assert [m.value for m in consumer] == [b"t-0", b"t-1", b"t-2"]
    consumer.close()
    assert admin.list_consumer_group_offsets(group) == {TopicPartition(topic, 0): 0}


def _offset(offset: int) -> Any:
    from kafka.structs import OffsetAndMetadata

    return OffsetAndMetadata(offset, "", -1)


def test_transactional_id_allowed_users_govern_the_kafka_listener(cluster: LocalCluster, admin: Admin) -> None:
    """A TransactionalId resource's allowedUsers: listed principals without an ACL, nobody else even with one."""
    txn = "declared-txn"
    update_document(
        cluster.metadata, keys.transactional_id(txn), TransactionalIdDocument,
        lambda _: TransactionalIdDocument(txn, "test/declared", ["User:judy"]),
    )  # fmt: skip
    allow(admin, "User:kim", RT.TRANSACTIONAL_ID, txn, OP.WRITE)
    assert eventually(lambda: init_pid(cluster, "judy", txn).error_code == 0)
    assert init_pid(cluster, "kim", txn).error_code == TXN_AUTH
    assert find_coordinator(cluster, "kim", txn, 1)[0] == TXN_AUTH


def test_describe_and_list_transactions_show_only_what_may_be_described(cluster: LocalCluster, admin: Admin) -> None:
    topic, txn = "sec-txn-listed", "liz-txn"
    admin.create_topic(topic, partitions=1, replication_factor=1)
    allow(admin, "User:liz", RT.TRANSACTIONAL_ID, txn, OP.WRITE)
    allow(admin, "User:liz", RT.TOPIC, topic, OP.WRITE)
    init = init_pid(cluster, "liz", txn)
    assert add_partitions(cluster, "liz", txn, init.producer_id, init.producer_epoch, [topic]) == [(topic, 0)]
    describe = DescribeTransactionsRequest[0](transactional_ids=[txn])
    listing = ListTransactionsRequest[0](state_filters=[], producer_id_filters=[])
    [seen] = ask(cluster, "mo", describe).transaction_states
    assert (seen.error_code, seen.topics) == (TXN_AUTH, [])
    assert txn not in {t.transactional_id for t in ask(cluster, "mo", listing).transaction_states}
    allow(admin, "User:mo", RT.TRANSACTIONAL_ID, txn, OP.DESCRIBE)
    [seen] = ask(cluster, "mo", describe).transaction_states
    assert (seen.error_code, seen.transaction_state, seen.topics) == (0, "Ongoing", [])  # topic not describable
    assert txn in {t.transactional_id for t in ask(cluster, "mo", listing).transaction_states}
    allow(admin, "User:mo", RT.TOPIC, topic, OP.DESCRIBE)
    [seen] = ask(cluster, "mo", describe).transaction_states
    assert [(t.topic, t.partitions) for t in seen.topics] == [(topic, [0])]
    ask(cluster, "liz", EndTxnRequest[3](transactional_id=txn, producer_id=init.producer_id,
                                         producer_epoch=init.producer_epoch, committed=False))  # fmt: skip


# -- consumer groups: offsets and administration --------------------------------------------------


def commit(cluster: LocalCluster, who: str, group: str, topic: str, offset: int) -> list[int]:
    part = OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
        partition_index=0, committed_offset=offset, committed_metadata=""
    )
    request = OffsetCommitRequest[8](
        group_id=group, generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
        topics=[OffsetCommitRequest.OffsetCommitRequestTopic(name=topic, partitions=[part])],
    )  # fmt: skip
    return [p.error_code for t in ask(cluster, who, request).topics for p in t.partitions]


def fetch_committed(cluster: LocalCluster, who: str, group: str, topics: list[str] | None) -> tuple[int, list[Any]]:
    wanted = None
    if topics is not None:
        wanted = [OffsetFetchRequest.OffsetFetchRequestGroup.OffsetFetchRequestTopics(name=t, partition_indexes=[0])
                  for t in topics]  # fmt: skip
    group_req = OffsetFetchRequest.OffsetFetchRequestGroup(group_id=group, member_id=None, member_epoch=-1,
                                                           topics=wanted)  # fmt: skip
    [g] = ask(cluster, who, OffsetFetchRequest[9](groups=[group_req], require_stable=False)).groups
    return g.error_code, sorted((t.name, p.committed_offset, p.error_code) for t in g.topics for p in t.partitions)


def test_offsets_need_read_on_the_group_and_the_topic(cluster: LocalCluster, admin: Admin) -> None:
    topic, hidden, group = "sec-commit", "sec-commit-hidden", "nina-group"
    for t in (topic, hidden):
        admin.create_topic(t, partitions=1, replication_factor=1)
    assert commit(cluster, "nina", group, topic, 5) == [GROUP_AUTH]
    allow(admin, "User:nina", RT.GROUP, group, OP.READ)
    assert commit(cluster, "nina", group, topic, 5) == [TOPIC_AUTH]
    assert admin.list_consumer_group_offsets(group) == {}  # nothing committed
    allow(admin, "User:nina", RT.TOPIC, topic, OP.READ)
    assert commit(cluster, "nina", group, topic, 5) == [0]
    assert admin.list_consumer_group_offsets(group) == {TopicPartition(topic, 0): 5}
    assert commit(cluster, "admin", group, hidden, 9) == [0]  # the super user commits a topic nina may not see
    # OffsetFetch: Describe on the group (Read implies it); a named refused topic answers per partition,
    # the all-topics answer leaves it out
    assert fetch_committed(cluster, "oscar", group, [topic])[0] == GROUP_AUTH
    assert fetch_committed(cluster, "nina", group, [topic, hidden]) == (
        0, [(topic, 5, 0), (hidden, -1, TOPIC_AUTH)]
    )  # fmt: skip
    assert fetch_committed(cluster, "nina", group, None) == (0, [(topic, 5, 0)])
    assert fetch_committed(cluster, "admin", group, None) == (0, [(topic, 5, 0), (hidden, 9, 0)])


def test_txn_offset_commit_needs_the_transactional_id_group_and_topic(cluster: LocalCluster, admin: Admin) -> None:
    topic, txn, group = "sec-txn-commit", "pat-txn", "pat-group"
    admin.create_topic(topic, partitions=1, replication_factor=1)
    allow(admin, "User:pat", RT.TRANSACTIONAL_ID, txn, OP.WRITE)
    allow(admin, "User:pat", RT.GROUP, group, OP.READ)
    init = init_pid(cluster, "pat", txn)
    pid, epoch = init.producer_id, init.producer_epoch
    add = AddOffsetsToTxnRequest[3](transactional_id=txn, producer_id=pid, producer_epoch=epoch, group_id=group)
    assert ask(cluster, "pat", add).error_code == 0
    part = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic.TxnOffsetCommitRequestPartition(
        partition_index=0, committed_offset=3, committed_leader_epoch=-1, committed_metadata=""
    )

    def txn_commit(who: str) -> list[int]:
        request = TxnOffsetCommitRequest[3](
            transactional_id=txn, group_id=group, producer_id=pid, producer_epoch=epoch, generation_id=-1,
            member_id="", group_instance_id=None,
            topics=[TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic(name=topic, partitions=[part])],
        )  # fmt: skip
        return [p.error_code for t in ask(cluster, who, request).topics for p in t.partitions]

    assert txn_commit("quinn") == [TXN_AUTH]
    assert txn_commit("pat") == [TOPIC_AUTH]  # no Read on the topic
    allow(admin, "User:pat", RT.TOPIC, topic, OP.READ)
    assert txn_commit("pat") == [0]
    end = EndTxnRequest[3](transactional_id=txn, producer_id=pid, producer_epoch=epoch, committed=True)
    assert ask(cluster, "pat", end).error_code == 0
    assert eventually(lambda: admin.list_consumer_group_offsets(group) == {TopicPartition(topic, 0): 3})


def test_find_coordinator_list_and_delete_groups(cluster: LocalCluster, admin: Admin) -> None:
    topic, group = "sec-groups", "rita-group"
    admin.create_topic(topic, partitions=1, replication_factor=1)
    assert commit(cluster, "admin", group, topic, 1) == [0]
    assert find_coordinator(cluster, "rita", group, 0) == (GROUP_AUTH, -1)
    listing = ListGroupsRequest[4](states_filter=[])
    assert group not in {g.group_id for g in ask(cluster, "rita", listing).groups}
    allow(admin, "User:rita", RT.GROUP, group, OP.DESCRIBE)
    assert find_coordinator(cluster, "rita", group, 0) == (0, 0)
    assert {g.group_id for g in ask(cluster, "rita", listing).groups} == {group}
    delete = DeleteGroupsRequest[2](groups_names=[group])
    assert [r.error_code for r in ask(cluster, "rita", delete).results] == [GROUP_AUTH]
    assert group in {g.group_id for g in ask(cluster, "admin", listing).groups}
    assert admin.list_consumer_group_offsets(group) == {TopicPartition(topic, 0): 1}
    allow(admin, "User:rita", RT.GROUP, group, OP.DELETE)
    assert [r.error_code for r in ask(cluster, "rita", delete).results] == [0]
    assert admin.list_consumer_group_offsets(group) == {}


def test_partition_reassignments_need_alter_and_describe_on_the_cluster(cluster: LocalCluster, admin: Admin) -> None:
    """AlterPartitionReassignments: Alter on the cluster; ListPartitionReassignments and DescribeLogDirs:
    Describe on it (Kafka's). Refused whole with CLUSTER_AUTHORIZATION_FAILED, nothing changed."""
    from kafka.protocol.admin import (
        AlterPartitionReassignmentsRequest,
        DescribeLogDirsRequest,
        ListPartitionReassignmentsRequest,
    )

    topic = "sec-reassign"
    admin.create_topic(topic, partitions=1, replication_factor=1)
    part = AlterPartitionReassignmentsRequest.ReassignableTopic.ReassignablePartition(partition_index=0, replicas=[0])
    alter = AlterPartitionReassignmentsRequest[0](
        timeout_ms=30000, topics=[AlterPartitionReassignmentsRequest.ReassignableTopic(name=topic, partitions=[part])]
    )
    listing = ListPartitionReassignmentsRequest[0](timeout_ms=30000, topics=None)
    dirs = DescribeLogDirsRequest[4](topics=None)

    refused = ask(cluster, "heidi", alter)
    assert refused.error_code == CLUSTER_AUTH
    assert [p.error_code for t in refused.responses for p in t.partitions] == [CLUSTER_AUTH]
    assert ask(cluster, "heidi", listing).error_code == CLUSTER_AUTH
    assert ask(cluster, "heidi", dirs).error_code == CLUSTER_AUTH

    allow(admin, "User:heidi", RT.CLUSTER, "kafka-cluster", OP.DESCRIBE)
    assert ask(cluster, "heidi", alter).error_code == CLUSTER_AUTH  # Describe is not Alter
    listed = ask(cluster, "heidi", listing)
    assert (listed.error_code, listed.topics) == (0, [])
    [held] = ask(cluster, "heidi", dirs).results
    assert held.error_code == 0 and topic in [t.name for t in held.topics]

    allow(admin, "User:heidi", RT.CLUSTER, "kafka-cluster", OP.ALTER)
    served = ask(cluster, "heidi", alter)  # to the replicas it has: nothing to move, no error
    assert served.error_code == 0
    assert [p.error_code for t in served.responses for p in t.partitions] == [0]
    assert admin.list_partition_reassignments() == {}
