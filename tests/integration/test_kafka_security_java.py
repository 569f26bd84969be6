"""Apache Kafka 4.3.1's own Java tools over SSL with client certificates against a secure cluster.

The Java client's TLS (hostname verification of the broker's certificate included) with PEM
stores (``ssl.keystore.type=PEM``: ``LocalCluster.kafka_client_properties``). VerifiableProducer
(idempotent, acks=all) as a principal with Write on the topic: every record acknowledged, at the
offsets the gRPC consumer reads; ConsoleConsumer as a principal with Read: everything back. The
same producer as a principal without the ACL: every send refused with Kafka's authorization error,
nothing appended.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.kafka.cluster import java_command
from bench.kafka.fetch import ensure_jars
from sluice.acls import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType
from sluice.client import Admin, TopicPartition
from sluice.testing import LocalCluster

TOOL_TIMEOUT_S = 240.0
TOPIC = "java-secure"


@pytest.fixture(scope="module")
def jars() -> Path:
    return ensure_jars()


@pytest.fixture(scope="module")
def scluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(brokers=1, data_dir=tmp_path_factory.mktemp("kafka-java-secure"), secure=True,
                      kafka_listener=True) as c:  # fmt: skip
        admin = Admin(**c.client_config("admin"))
        admin.create_topic(TOPIC, partitions=1, replication_factor=1)
        admin.create_acls([
            AclBinding(ResourceType.TOPIC, TOPIC, ResourcePatternType.LITERAL, "User:java-writer", "*",
                       AclOperation.WRITE, AclPermissionType.ALLOW),
            AclBinding(ResourceType.TOPIC, TOPIC, ResourcePatternType.LITERAL, "User:java-reader", "*",
                       AclOperation.READ, AclPermissionType.ALLOW),
        ])  # fmt: skip
        admin.close()
        yield c


def properties(cluster: LocalCluster, name: str, path: Path, extra: dict[str, str] | None = None) -> Path:
    props = {**cluster.kafka_client_properties(name), **(extra or {})}
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    return path


def run_tool(jars: Path, main: str, args: list[str]) -> subprocess.CompletedProcess[str]:
    cmd = java_command(jars, main, args, heap="256m", tool=True)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False)


def events(out: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_verifiable_producer_then_console_consumer_over_ssl(jars: Path, scluster: LocalCluster, tmp_path: Path) -> None:
    config = properties(scluster, "java-writer", tmp_path / "producer.properties",
                        {"enable.idempotence": "true", "acks": "all", "retries": "2147483647"})  # fmt: skip
    done = run_tool(jars, "org.apache.kafka.tools.VerifiableProducer",
                    ["--bootstrap-server", scluster.kafka_bootstrap_servers, "--topic", TOPIC,
                     "--max-messages", "500", "--acks", "-1", "--command-config", str(config)])  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    acked = [e for e in events(done.stdout) if e.get("name") == "producer_send_success"]
    assert len(acked) == 500 and sorted(int(str(e["offset"])) for e in acked) == list(range(500))
    consumer_config = properties(scluster, "java-reader", tmp_path / "consumer.properties")
    consumed = run_tool(jars, "org.apache.kafka.tools.consumer.ConsoleConsumer",
                        ["--bootstrap-server", scluster.kafka_bootstrap_servers, "--topic", TOPIC, "--partition", "0",
                         "--offset", "earliest", "--max-messages", "500", "--timeout-ms", "60000",
                         "--command-config", str(consumer_config)])  # fmt: skip
    assert consumed.returncode == 0, consumed.stderr[-2000:]
    assert consumed.stdout.split() == [str(i) for i in range(500)]  # VerifiableProducer's values, in order


def test_a_producer_without_the_acl_is_refused_and_appends_nothing(
    jars: Path, scluster: LocalCluster, tmp_path: Path
) -> None:
    admin = Admin(**scluster.client_config("admin"))
    before = admin.list_offsets({TopicPartition(TOPIC, 0): Admin.LATEST})[TopicPartition(TOPIC, 0)].offset
    config = properties(scluster, "java-stranger", tmp_path / "stranger.properties",
                        {"enable.idempotence": "false", "acks": "all", "retries": "0"})  # fmt: skip
    done = run_tool(jars, "org.apache.kafka.tools.VerifiableProducer",
                    ["--bootstrap-server", scluster.kafka_bootstrap_servers, "--topic", TOPIC,
                     "--max-messages", "5", "--acks", "-1", "--command-config", str(config)])  # fmt: skip
    found = events(done.stdout)
    assert not [e for e in found if e.get("name") == "producer_send_success"]
    failed = [e for e in found if e.get("name") == "producer_send_error"]
    assert len(failed) == 5 and all("TopicAuthorizationException" in str(e.get("exception")) for e in failed)
    after = admin.list_offsets({TopicPartition(TOPIC, 0): Admin.LATEST})[TopicPartition(TOPIC, 0)].offset
    admin.close()
    assert after == before
