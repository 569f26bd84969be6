"""bench/kafka/cluster.py's node settings and bench/scale.py's failure detector mapping (pure parts)."""

from __future__ import annotations

from pathlib import Path

from bench.kafka.cluster import InterBrokerTls, node_properties
from bench.scale import kafka_failure_detector


def props(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def test_three_nodes_mirror_localcluster_replication_defaults() -> None:
    p = props(node_properties(2, 3, [9001, 9002, 9003], [9101, 9102, 9103], Path("/d/node-2"), "127.0.0.1"))
    assert p["node.id"] == "2" and p["process.roles"] == "broker,controller"
    assert p["controller.quorum.voters"] == "1@127.0.0.1:9101,2@127.0.0.1:9102,3@127.0.0.1:9103"
    assert p["listeners"] == "PLAINTEXT://127.0.0.1:9002,CONTROLLER://127.0.0.1:9102"
    assert p["default.replication.factor"] == "3" and p["min.insync.replicas"] == "2"
    assert p["transaction.state.log.replication.factor"] == "3" and p["transaction.state.log.min.isr"] == "2"
    assert p["num.partitions"] == "3" and p["auto.create.topics.enable"] == "false"
    assert p["log.flush.interval.messages"] == str(2**63 - 1)  # no fsync per write, as Sluice


def test_one_node_has_replication_factor_one_and_extra_settings_win() -> None:
    p = props(node_properties(1, 1, [9001], [9101], Path("/d/node-1"), "127.0.0.1", {"num.partitions": "7"}))
    assert p["default.replication.factor"] == "1" and p["min.insync.replicas"] == "1"
    assert p["offsets.topic.replication.factor"] == "1"
    assert p["num.partitions"] == "7"


def test_inter_broker_tls_is_a_mutual_tls_listener_of_its_own(tmp_path: Path) -> None:
    tls = InterBrokerTls(3, "127.0.0.1", tmp_path)
    p = props(node_properties(2, 3, [9001, 9002, 9003], [9101, 9102, 9103], Path("/d/node-2"), "127.0.0.1",
                              replication=tls))  # fmt: skip
    port = tls.ports[1]
    assert p["listeners"] == f"PLAINTEXT://127.0.0.1:9002,CONTROLLER://127.0.0.1:9102,REPLICATION://127.0.0.1:{port}"
    assert p["advertised.listeners"] == f"PLAINTEXT://127.0.0.1:9002,REPLICATION://127.0.0.1:{port}"
    assert p["inter.broker.listener.name"] == "REPLICATION"
    assert p["listener.security.protocol.map"] == "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,REPLICATION:SSL"
    assert p["listener.name.replication.ssl.client.auth"] == "required"
    store = Path(p["listener.name.replication.ssl.keystore.location"]).read_bytes()
    # Kafka's PEM key store: an unencrypted PKCS#8 key, then the certificate
    assert store.startswith(b"-----BEGIN PRIVATE KEY-----") and b"-----BEGIN CERTIFICATE-----" in store
    assert Path(p["listener.name.replication.ssl.truststore.location"]).read_bytes().startswith(b"-----BEGIN CERT")


def test_failure_detector_heartbeats_faster_than_the_session_timeout() -> None:
    for ms in (200, 1000, 5000, 9000, 30000):
        s = kafka_failure_detector(ms)
        assert s["broker.session.timeout.ms"] == str(ms)
        assert int(s["broker.heartbeat.interval.ms"]) < ms
