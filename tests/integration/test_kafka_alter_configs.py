"""IncrementalAlterConfigs (key 44) on the Kafka listener of real broker processes, by three independent clients.

kafka-python's ``KafkaAdminClient.alter_configs`` / ``reset_configs`` and raw requests (its protocol
classes) for the exact codes; librdkafka's ``AdminClient.incremental_alter_configs`` (confluent-kafka)
for APPEND / SUBTRACT; Apache Kafka 4.3.1's ``kafka-configs`` (``kafka.admin.ConfigCommand``, jars
from Maven Central via ``bench.kafka.fetch``). What changed is read back with DescribeConfigs and
from the metadata store's topic document, and a changed ``max.message.bytes`` is shown to be
*applied*: a record the new limit does not admit is refused over Kafka and over gRPC, and admitted
again once the override is deleted, on the topic's leader even when another broker took the change.
Authorization is test_kafka_security.py's.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.kafka.cluster import java_command
from bench.kafka.fetch import ensure_jars
from sluice import errors
from sluice.client import Admin, Producer
from sluice.metadata import keys
from sluice.metadata.documents import TopicDocument, read
from sluice.testing import LocalCluster

kafka = pytest.importorskip("kafka")  # the dev extra installs kafka-python and confluent-kafka
from confluent_kafka import KafkaError, KafkaException  # noqa: E402
from confluent_kafka.admin import AdminClient as RdAdminClient  # noqa: E402
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry  # noqa: E402
from confluent_kafka.admin import ConfigResource as RdConfigResource  # noqa: E402
from kafka import KafkaProducer  # noqa: E402
from kafka.admin import AlterConfigOp, ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic  # noqa: E402
from kafka.errors import MessageSizeTooLargeError  # noqa: E402
from kafka.protocol.admin import IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse  # noqa: E402
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse  # noqa: E402

INVALID_CONFIG, INVALID_REQUEST, UNKNOWN_TOPIC, INVALID_TOPIC = 40, 42, 3, 17
MAX_MESSAGE_DEFAULT = str(1024 * 1024 + 12)
RETENTION_DEFAULT = str(7 * 24 * 3600 * 1000)
TOOL_TIMEOUT_S = 240.0


@pytest.fixture(scope="module")
def kcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(brokers=1, data_dir=tmp_path_factory.mktemp("kafka-alter"), kafka_listener=True) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def kadmin(kcluster: LocalCluster) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(bootstrap_servers=kcluster.kafka_bootstrap_servers, request_timeout_ms=30000)
    yield client
    client.close()


def make_topic(kadmin: KafkaAdminClient, name: str, configs: dict[str, str] | None = None) -> None:
    kadmin.create_topics([NewTopic(name, 1, 1, topic_configs=configs or {})])


def described(kadmin: KafkaAdminClient, topic: str) -> dict[str, tuple[str, str]]:
    """key -> (value, source) as DescribeConfigs answers them."""
    got = kadmin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)], config_filter="all")
    return {k: (v["value"], v["config_source"]) for k, v in got["topic"][topic].items()}


def stored(cluster: LocalCluster, topic: str) -> dict[str, str]:
    """The topic document's overrides, read from the metadata store itself."""
    doc = read(cluster.metadata, keys.topic(topic), TopicDocument)
    assert doc is not None
    return doc.value.config


def kafka_address(cluster: LocalCluster, i: int = 0) -> tuple[str, int]:
    host, _, port = cluster.kafka_bootstrap_servers.split(",")[i].rpartition(":")
    return host, int(port)


def ask(cluster: LocalCluster, request: Any, response_class: Any, broker: int = 0) -> Any:
    with socket.create_connection(kafka_address(cluster, broker), timeout=30) as sock:
        request.with_header(correlation_id=7, client_id="alter-configs-test")
        sock.sendall(bytes(request.encode(header=True, framed=True)))

        def exactly(n: int) -> bytes:
            out = b""
            while len(out) < n:
                chunk = sock.recv(n - len(out))
                if not chunk:
                    raise ConnectionError(f"closed after {len(out)} of {n} bytes")
                out += chunk
            return out

        (size,) = struct.unpack(">i", exactly(4))
        return response_class.decode(exactly(size), header=True)


def alter(
    cluster: LocalCluster,
    resources: list[tuple[int, str, list[tuple[str, int, str | None]]]],
    validate_only: bool = False,
    version: int = 1,
    broker: int = 0,
) -> list[tuple[int, str | None]]:
    """A raw IncrementalAlterConfigs: (error code, message) per resource."""
    r = IncrementalAlterConfigsRequest.AlterConfigsResource
    request = IncrementalAlterConfigsRequest[version](
        resources=[
            r(resource_type=t, resource_name=n,
              configs=[r.AlterableConfig(name=k, config_operation=op, value=v) for k, op, v in configs])
            for t, n, configs in resources
        ],
        validate_only=validate_only,
    )  # fmt: skip
    answered = ask(cluster, request, IncrementalAlterConfigsResponse[version], broker).responses
    assert [(a.resource_type, a.resource_name) for a in answered] == [(t, n) for t, n, _ in resources]
    return [(a.error_code, a.error_message) for a in answered]


def eventually(check: Callable[[], bool], timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return check()


# -- served, advertised ----------------------------------------------------------------------------


def test_api_versions_advertises_incremental_alter_configs_0_to_1(kcluster: LocalCluster) -> None:
    request = ApiVersionsRequest[3](client_software_name="t", client_software_version="1")
    served = {
        k.api_key: (k.min_version, k.max_version) for k in ask(kcluster, request, ApiVersionsResponse[3]).api_keys
    }
    assert served[44] == (0, 1)


@pytest.mark.parametrize("version", [0, 1])
def test_both_versions_set_an_override(kcluster: LocalCluster, version: int) -> None:
    topic = f"alter-v{version}"
    Admin(bootstrap_servers=kcluster.bootstrap_servers).create_topic(topic, partitions=1, replication_factor=1)
    assert alter(kcluster, [(2, topic, [("retention.ms", 0, "3600000")])], version=version) == [(0, None)]
    assert stored(kcluster, topic) == {"retention.ms": "3600000"}


# -- kafka-python's admin client -------------------------------------------------------------------


def test_set_then_delete_with_kafka_python(kcluster: LocalCluster, kadmin: KafkaAdminClient) -> None:
    topic = "alter-set-delete"
    make_topic(kadmin, topic, {"cleanup.policy": "compact"})
    resource = ConfigResource(
        ConfigResourceType.TOPIC, topic, configs={"retention.ms": "3600000", "max.message.bytes": "2048"}
    )
    assert kadmin.alter_configs([resource], incremental=True) == {"topic": {topic: "OK"}}
    configs = described(kadmin, topic)
    assert configs["retention.ms"] == ("3600000", "DYNAMIC_TOPIC_CONFIG")
    assert configs["max.message.bytes"] == ("2048", "DYNAMIC_TOPIC_CONFIG")
    assert configs["cleanup.policy"] == ("compact", "DYNAMIC_TOPIC_CONFIG")  # an override not named is kept
    assert stored(kcluster, topic) == {
        "cleanup.policy": "compact",
        "retention.ms": "3600000",
        "max.message.bytes": "2048",
    }
    # DELETE (reset_configs): back to the broker's value
    reset = ConfigResource(ConfigResourceType.TOPIC, topic, configs={"retention.ms": None})
    assert kadmin.reset_configs([reset]) == {"topic": {topic: "OK"}}
    configs = described(kadmin, topic)
    assert configs["retention.ms"] == (RETENTION_DEFAULT, "DEFAULT_CONFIG")
    assert configs["max.message.bytes"] == ("2048", "DYNAMIC_TOPIC_CONFIG")
    assert stored(kcluster, topic) == {"cleanup.policy": "compact", "max.message.bytes": "2048"}


def test_validate_only_changes_nothing(kcluster: LocalCluster, kadmin: KafkaAdminClient) -> None:
    topic = "alter-validate-only"
    make_topic(kadmin, topic, {"retention.ms": "60000"})
    changes = {"retention.ms": (AlterConfigOp.SET, "1000"), "max.message.bytes": (AlterConfigOp.SET, "4096")}
    resource = ConfigResource(ConfigResourceType.TOPIC, topic, configs=changes)
    assert kadmin.alter_configs([resource], validate_only=True, incremental=True) == {"topic": {topic: "OK"}}
    assert stored(kcluster, topic) == {"retention.ms": "60000"}
    assert described(kadmin, topic)["max.message.bytes"] == (MAX_MESSAGE_DEFAULT, "DEFAULT_CONFIG")
    # validate_only still refuses what a real alteration would
    bad = [(2, topic, [("retention.ms", 0, "soon")])]
    assert alter(kcluster, bad, validate_only=True)[0][0] == INVALID_CONFIG


def test_refusals_change_nothing_and_name_the_key(kcluster: LocalCluster, kadmin: KafkaAdminClient) -> None:
    topic = "alter-refused"
    make_topic(kadmin, topic, {"retention.ms": "60000"})
    ok = ("max.message.bytes", 0, "4096")  # valid, in the same resource: all or nothing

    def refused(*change: tuple[str, int, str | None]) -> tuple[int, str]:
        [(code, message)] = alter(kcluster, [(2, topic, [ok, *change])])
        assert message is not None
        return code, message

    code, message = refused(("no.such.key", 0, "1"))
    assert code == INVALID_CONFIG and "no.such.key" in message
    code, message = refused(("retention.ms", 0, "soon"))
    assert code == INVALID_CONFIG and "retention.ms" in message
    code, message = refused(("segment.bytes", 0, "1048576"))  # a Kafka key with no meaning here
    assert code == INVALID_CONFIG and "segment.bytes" in message and "no segments" in message
    code, message = refused(("retention.ms", 2, "1000"))  # APPEND to a key that is no list
    assert code == INVALID_CONFIG and "retention.ms" in message and "not a list" in message
    code, message = refused(("cleanup.policy", 3, "delete"))  # SUBTRACT down to no policy
    assert code == INVALID_CONFIG and "cleanup.policy" in message
    code, message = refused(("retention.ms", 0, "1"), ("retention.ms", 1, None))
    assert code == INVALID_REQUEST and "more than once" in message
    assert stored(kcluster, topic) == {"retention.ms": "60000"}
    assert described(kadmin, topic)["max.message.bytes"] == (MAX_MESSAGE_DEFAULT, "DEFAULT_CONFIG")
    # what kafka-python raises to its user for it
    bad = ConfigResource(ConfigResourceType.TOPIC, topic, configs={"retention.ms": "soon"})
    result = kadmin.alter_configs([bad], raise_on_unknown=False, incremental=True)["topic"][topic]
    assert result.startswith("[Error 40] InvalidConfigurationError")


def test_unknown_topic_internal_topic_brokers_and_other_types(kcluster: LocalCluster, kadmin: KafkaAdminClient) -> None:
    topic = "alter-mixed"
    make_topic(kadmin, topic)
    answers = alter(
        kcluster,
        [
            (2, "no-such-topic", [("retention.ms", 0, "1000")]),
            (2, "__consumer_offsets", [("cleanup.policy", 0, "delete")]),
            (4, "0", [("log.retention.check.interval.ms", 0, "1000")]),
            (4, "", [("num.partitions", 0, "3")]),
            (8, "0", [("kafka.server", 0, "DEBUG")]),
            (2, topic, [("retention.ms", 0, "1000")]),  # the others refused, this one served
        ],
    )
    assert [code for code, _ in answers] == [UNKNOWN_TOPIC, INVALID_TOPIC, INVALID_REQUEST, INVALID_REQUEST,
                                             INVALID_REQUEST, 0]  # fmt: skip
    assert "no dynamic broker configuration" in str(answers[2][1])
    assert stored(kcluster, topic) == {"retention.ms": "1000"}
    assert stored(kcluster, "__consumer_offsets") == {"cleanup.policy": "compact", "retention.ms": "-1"}
    # a resource named twice: both occurrences refused, nothing applied
    twice = [(2, topic, [("retention.ms", 0, "2000")]), (2, topic, [("max.message.bytes", 0, "2000")])]
    assert [code for code, _ in alter(kcluster, twice)] == [INVALID_REQUEST, INVALID_REQUEST]
    assert stored(kcluster, topic) == {"retention.ms": "1000"}


# -- the broker applies it -------------------------------------------------------------------------


def produce_kafka(cluster: LocalCluster, topic: str, size: int) -> int:
    producer = KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap_servers, acks="all", retries=0)
    try:
        return int(producer.send(topic, b"x" * size).get(timeout=30).offset)
    finally:
        producer.close()


def produce_grpc(cluster: LocalCluster, topic: str, size: int) -> None:
    producer = Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all")
    try:
        producer.send(topic, value=b"y" * size).get(timeout=30)
    finally:
        producer.close()


def test_a_changed_max_message_bytes_is_applied_without_a_restart(
    kcluster: LocalCluster, kadmin: KafkaAdminClient
) -> None:
    topic = "alter-applied"
    make_topic(kadmin, topic)
    assert produce_kafka(kcluster, topic, 4000) == 0
    resource = ConfigResource(ConfigResourceType.TOPIC, topic, configs={"max.message.bytes": "2048"})
    assert kadmin.alter_configs([resource], incremental=True) == {"topic": {topic: "OK"}}
    with pytest.raises(MessageSizeTooLargeError):
        produce_kafka(kcluster, topic, 4000)
    with pytest.raises(errors.MessageTooLargeError):
        produce_grpc(kcluster, topic, 4000)
    assert produce_kafka(kcluster, topic, 1000) == 1  # under the new limit
    assert kadmin.reset_configs([ConfigResource(ConfigResourceType.TOPIC, topic, configs=["max.message.bytes"])])
    assert produce_kafka(kcluster, topic, 4000) == 2


def test_the_leader_applies_a_change_made_through_another_broker(tmp_path: Path) -> None:
    """Brokers follow the topic document: the change goes to broker 0, the partition's leader is broker 1."""
    with LocalCluster(brokers=2, data_dir=tmp_path, kafka_listener=True) as cluster:
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        try:
            admin.create_topic("alter-two-brokers", partitions=2, replication_factor=1)
            leaders = {p.partition: p.leader for p in admin.describe_topic("alter-two-brokers").partitions}
        finally:
            admin.close()
        on_one = [p for p, leader in leaders.items() if leader == 1]
        assert on_one, f"no partition led by broker 1: {leaders}"
        producer = KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap_servers, acks="all", retries=0)
        try:
            assert producer.send("alter-two-brokers", b"x" * 4000, partition=on_one[0]).get(timeout=30).offset == 0
            change = [(2, "alter-two-brokers", [("max.message.bytes", 0, "2048")])]
            assert alter(cluster, change, broker=0) == [(0, None)]

            def refused() -> bool:
                try:
                    producer.send("alter-two-brokers", b"x" * 4000, partition=on_one[0]).get(timeout=30)
                except MessageSizeTooLargeError:
                    return True
                return False

            assert eventually(refused)  # broker 1 learns of it at its next metadata poll (100 ms)
        finally:
            producer.close()


# -- librdkafka (confluent-kafka) ------------------------------------------------------------------


def test_append_and_subtract_with_librdkafka(kcluster: LocalCluster, kadmin: KafkaAdminClient) -> None:
    topic = "alter-librdkafka"
    make_topic(kadmin, topic)
    rd = RdAdminClient({"bootstrap.servers": kcluster.kafka_bootstrap_servers})

    def incremental(*entries: ConfigEntry) -> None:
        resource = RdConfigResource(RdConfigResource.Type.TOPIC, topic, incremental_configs=list(entries))
        for future in rd.incremental_alter_configs([resource]).values():
            future.result(timeout=30)

    incremental(ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND))
    assert described(kadmin, topic)["cleanup.policy"] == ("delete,compact", "DYNAMIC_TOPIC_CONFIG")
    incremental(
        ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SUBTRACT),
        ConfigEntry("retention.ms", "120000", incremental_operation=AlterConfigOpType.SET),
    )
    assert stored(kcluster, topic) == {"cleanup.policy": "compact", "retention.ms": "120000"}
    incremental(ConfigEntry("cleanup.policy", None, incremental_operation=AlterConfigOpType.DELETE))
    assert described(kadmin, topic)["cleanup.policy"] == ("delete", "DEFAULT_CONFIG")
    # a refusal reaches librdkafka's user as Kafka's INVALID_CONFIG, and nothing changed
    resource = RdConfigResource(
        RdConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.APPEND)],
    )
    [future] = rd.incremental_alter_configs([resource]).values()
    with pytest.raises(KafkaException) as refused:
        future.result(timeout=30)
    assert refused.value.args[0].code() == KafkaError.INVALID_CONFIG and "retention.ms" in refused.value.args[0].str()
    assert stored(kcluster, topic) == {"retention.ms": "120000"}


# -- Apache Kafka's kafka-configs ------------------------------------------------------------------


def config_command(cluster: LocalCluster, *args: str) -> str:
    args = ("--bootstrap-server", cluster.kafka_bootstrap_servers, *args)
    cmd = java_command(ensure_jars(), "kafka.admin.ConfigCommand", list(args), heap="256m", tool=True)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False)
    assert done.returncode == 0, f"kafka-configs {args} failed ({done.returncode}): {done.stderr[-2000:]}"
    return done.stdout


def test_kafka_configs_alter_and_describe(kcluster: LocalCluster, kadmin: KafkaAdminClient) -> None:
    topic = "alter-java-tool"
    make_topic(kadmin, topic)
    entity = ["--entity-type", "topics", "--entity-name", topic]
    out = config_command(kcluster, "--alter", *entity, "--add-config", "retention.ms=3600000,max.message.bytes=4096")
    assert f"Completed updating config for topic {topic}." in out
    assert stored(kcluster, topic) == {"retention.ms": "3600000", "max.message.bytes": "4096"}
    shown = config_command(kcluster, "--describe", *entity)
    assert "retention.ms=3600000" in shown and "max.message.bytes=4096" in shown
    config_command(kcluster, "--alter", *entity, "--delete-config", "retention.ms")
    assert stored(kcluster, topic) == {"max.message.bytes": "4096"}
    shown = config_command(kcluster, "--describe", *entity)
    assert "retention.ms" not in shown and "max.message.bytes=4096" in shown
