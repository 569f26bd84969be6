"""``sluice dev up``: a background cluster that Kafka's own clients reach too (the Kafka listener is on by default).

librdkafka (confluent-kafka) produces to the Kafka addresses ``dev up`` printed and ``dev status``
shows; ``sluice consume`` (gRPC) reads the same records back. The refusals are usage errors.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import Producer as KafkaProducer

from sluice import cli
from sluice.cli.engines.dev_cluster import KAFKA_PORT_OFFSET, default_kafka_port
from sluice.testing import free_port


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        code = cli.main(list(argv))
    except SystemExit as exc:  # argparse's usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_default_kafka_port_follows_the_grpc_port() -> None:
    assert default_kafka_port(9092) == 9092 + KAFKA_PORT_OFFSET == 19092
    assert default_kafka_port(0) == 0  # free gRPC ports: free Kafka ports


def test_dev_up_kafka_listener(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    data = tmp_path / "dev"
    kafka_port = free_port("127.0.0.1")
    code, out, err = run(capsys, "dev", "up", "--port", "0", "--kafka-listener", "--kafka-port", str(kafka_port),
                         "--data", str(data), "--timeout", "120")  # fmt: skip
    assert code == 0, err
    try:
        servers = out.strip()
        kafka_servers = f"127.0.0.1:{kafka_port}"
        assert f"Kafka clients:  {kafka_servers}  (bootstrap.servers" in err and f"Sluice clients: {servers}" in err
        code, out, _ = run(capsys, "dev", "status", "--data", str(data), "--json")
        assert code == 0
        status = json.loads(out)
        assert status["kafka_bootstrap_servers"] == kafka_servers
        assert [b["kafka_address"] for b in status["brokers"]] == [kafka_servers]
        code, out, _ = run(capsys, "dev", "status", "--data", str(data))
        assert code == 0 and f"Kafka bootstrap servers: {kafka_servers}" in out and "KAFKA" in out

        # a second `up` finds the running cluster and prints its Kafka listeners again
        code, out, err = run(capsys, "dev", "up", "--kafka-listener", "--data", str(data))
        assert code == 0 and out.strip() == servers and kafka_servers in err

        assert run(capsys, "topics", "create", "dev-kafka", "--partitions", "1", "--bootstrap-server", servers)[0] == 0
        producer = KafkaProducer({"bootstrap.servers": kafka_servers, "enable.idempotence": True, "acks": "all"})
        for i in range(5):
            producer.produce("dev-kafka", key=b"k%d" % i, value=b"from-librdkafka-%d" % i)
        assert producer.flush(60) == 0
        code, out, err = run(capsys, "consume", "dev-kafka", "--from-beginning", "--max-messages", "5", "--print-key",
                             "--timeout", "30", "--bootstrap-server", servers)  # fmt: skip
        assert code == 0, err
        assert out.splitlines() == [f"k{i}\tfrom-librdkafka-{i}" for i in range(5)]
    finally:
        assert run(capsys, "dev", "down", "--data", str(data))[0] == 0


def test_dev_up_opens_the_kafka_listener_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No option: both addresses printed, and the README's confluent-kafka lines work on the Kafka one."""
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    data = tmp_path / "dev"
    code, out, err = run(capsys, "dev", "up", "--port", "0", "--data", str(data), "--timeout", "120")
    assert code == 0, err
    try:
        servers = out.strip()
        status = json.loads(run(capsys, "dev", "status", "--data", str(data), "--json")[1])
        kafka_servers = status["kafka_bootstrap_servers"]
        assert kafka_servers and kafka_servers != servers
        assert f"Sluice clients: {servers}" in err and f"Kafka clients:  {kafka_servers}" in err
        # a plaintext cluster has no principals to make certificates for
        code, _, err = run(capsys, "dev", "user", "bob", "--data", str(data))
        assert code == 1 and "this dev cluster is plaintext" in err and "--secure" in err
        # the Kafka address given to the sluice CLI: one line naming the gRPC one to use
        code, _, err = run(capsys, "topics", "list", "--bootstrap-server", kafka_servers)
        assert code == 1 and "speaks Kafka's protocol" in err and f"the dev cluster's is {servers}" in err, err
        # `up` again: with no option (or the same ones) it finds this cluster; with other ones it refuses
        code, out, err = run(capsys, "dev", "up", "--data", str(data))
        assert code == 0 and out.strip() == servers and "already running" in err
        assert run(capsys, "dev", "up", "--brokers", "1", "--kafka-listener", "--data", str(data))[0] == 0
        for other, says in (
            (["--secure"], "--secure, it is plaintext"),
            (["--brokers", "3"], "--brokers 3, it has 1"),
            (["--no-kafka-listener"], "--no-kafka-listener, it has one"),
            (["--config", "num.partitions=3"], "--config num.partitions=3, it runs with no --config"),
        ):
            code, out, err = run(capsys, "dev", "up", *other, "--data", str(data))
            assert code == 1 and out == "", err
            assert "a dev cluster with other options is already running" in err and says in err, err
            assert "sluice dev down" in err and len(err.strip().splitlines()) == 1
        assert run(capsys, "topics", "create", "orders", "--partitions", "3", "--bootstrap-server", servers)[0] == 0
        producer = KafkaProducer({"bootstrap.servers": kafka_servers, "enable.idempotence": True})
        producer.produce("orders", key=b"k3", value=b"from librdkafka")
        assert producer.flush(30) == 0
        consumer = KafkaConsumer({"bootstrap.servers": kafka_servers, "group.id": "kafka-users",
                                  "auto.offset.reset": "earliest"})  # fmt: skip
        try:
            consumer.subscribe(["orders"])
            msg = consumer.poll(30)
            assert msg is not None and msg.error() is None and msg.value() == b"from librdkafka"
        finally:
            consumer.close()
    finally:
        assert run(capsys, "dev", "down", "--data", str(data))[0] == 0


def test_dev_up_kafka_refusals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    data = str(tmp_path / "dev")
    code, _, err = run(capsys, "dev", "up", "--no-kafka-listener", "--kafka-port", "19092", "--data", data)
    assert code == 2 and "do not combine it with --no-kafka-listener" in err
    assert not (tmp_path / "dev" / "dev-cluster.json").exists()  # nothing was started


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ("no.such.key=1", "--config: unknown broker config 'no.such.key'"),
        ("num.partitions=many", "num.partitions"),
        ("offsets.retention.minutes=60", "committed offsets do not expire"),
    ],
)
def test_dev_up_validates_config_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, config: str, says: str
) -> None:
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    code, out, err = run(capsys, "dev", "up", "--port", "0", "--config", config, "--data", str(tmp_path / "dev"))
    assert code == 2 and out == "" and says in err
    assert len(err.strip().splitlines()) == 1, err  # the one line that matters
    assert not (tmp_path / "dev").exists()  # no process started, nothing written


def properties(path: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in Path(path).read_text().splitlines() if "=" in line)


def test_dev_up_secure_kafka_listener(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--secure --kafka-listener``: the Kafka listener takes the same TLS and ACLs as gRPC."""
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    data = tmp_path / "dev"
    kafka_port = free_port("127.0.0.1")
    code, out, err = run(capsys, "dev", "up", "--port", "0", "--secure", "--kafka-listener", "--kafka-port",
                         str(kafka_port), "--data", str(data), "--timeout", "120")  # fmt: skip
    assert code == 0, err
    try:
        servers, kafka_servers = out.strip(), f"127.0.0.1:{kafka_port}"
        status = json.loads(run(capsys, "dev", "status", "--data", str(data), "--json")[1])
        admin_kafka = status["admin_kafka_config"]
        assert admin_kafka in err and (Path(admin_kafka).stat().st_mode & 0o777) == 0o600
        java = properties(admin_kafka)  # what kafka-topics.sh --command-config reads
        assert java["bootstrap.servers"] == kafka_servers and java["security.protocol"] == "SSL"
        admin = properties(status["admin_config"])
        assert run(capsys, "topics", "create", "dev-secure", "--partitions", "1", "--bootstrap-server", servers,
                   "--command-config", status["admin_config"])[0] == 0  # fmt: skip
        # librdkafka with the super user's settings file (kcat -F's, confluent-kafka's names) produces over TLS ...
        tls_config = properties(status["admin_librdkafka_config"])
        assert status["admin_librdkafka_config"] in err
        assert tls_config["ssl.certificate.location"] == admin["ssl.certfile"]
        producer = KafkaProducer({**tls_config, "enable.idempotence": True, "acks": "all"})
        for i in range(3):
            producer.produce("dev-secure", value=b"over-tls-%d" % i)
        assert producer.flush(60) == 0
        # ... a plaintext client gets nothing through (the listener speaks TLS only)
        outcome: list[object] = []
        plain = KafkaProducer({"bootstrap.servers": kafka_servers, "message.timeout.ms": 5000})
        plain.produce("dev-secure", value=b"plaintext", on_delivery=lambda e, _m: outcome.append(e))
        plain.flush(30)
        assert len(outcome) == 1 and outcome[0] is not None  # timed out undelivered
        code, out, err = run(capsys, "consume", "dev-secure", "--from-beginning", "--max-messages", "3",
                             "--timeout", "30", "--bootstrap-server", servers,
                             "--command-config", status["admin_config"])  # fmt: skip
        assert code == 0, err
        assert out.splitlines() == [f"over-tls-{i}" for i in range(3)]

        # another principal: `dev user alice` writes her settings for all three kinds of client
        code, out, err = run(capsys, "dev", "user", "alice", "--data", str(data))
        assert code == 0, err
        files = [line.rsplit(" ", 1)[1] for line in out.splitlines()]
        assert len(files) == 3 and all((Path(f).stat().st_mode & 0o777) == 0o600 for f in files)
        assert "User:alice can do nothing until ACLs allow it" in err
        alice_sluice, alice_java, alice_rdkafka = (properties(f) for f in files)
        assert alice_java["bootstrap.servers"] == kafka_servers and alice_java["ssl.keystore.type"] == "PEM"
        assert alice_sluice["ssl.certfile"] == alice_rdkafka["ssl.certificate.location"] != admin["ssl.certfile"]

        def alice_produces(value: bytes) -> object:
            outcome: list[object] = []
            p = KafkaProducer({**alice_rdkafka, "message.timeout.ms": 10000})
            p.produce("dev-secure", value=value, on_delivery=lambda e, _m: outcome.append(e))
            p.flush(30)
            return outcome[0] if outcome else "undelivered"

        refused = alice_produces(b"before-acl")
        assert refused is not None and "authoriz" in str(refused).lower(), refused  # User:alice, no ACL
        assert run(capsys, "acls", "add", "--allow-principal", "User:alice", "--operation", "write", "--operation",
                   "describe", "--topic", "dev-secure", "--bootstrap-server", servers,
                   "--command-config", status["admin_config"])[0] == 0  # fmt: skip
        assert alice_produces(b"from-alice") is None
        assert run(capsys, "dev", "user", "bob", "--data", str(tmp_path / "no-such"))[0] == 1  # no cluster there
    finally:
        assert run(capsys, "dev", "down", "--data", str(data))[0] == 0


def test_broker_help_documents_the_kafka_listener() -> None:
    done = subprocess.run([sys.executable, "-m", "sluice", "broker", "--help"], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0
    assert "--kafka-listen" in done.stdout and "--kafka-advertise" in done.stdout
