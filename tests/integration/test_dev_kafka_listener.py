"""``sluice dev up --kafka-listener``: a background cluster that Kafka's own clients reach too.

librdkafka (confluent-kafka) produces to the Kafka addresses ``dev up`` printed and ``dev status``
shows; ``sluice consume`` (gRPC) reads the same records back. The refusals are usage errors.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
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
        assert f"Kafka listeners (bootstrap.servers for Kafka clients): {kafka_servers}" in err
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


def test_dev_up_kafka_refusals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    data = str(tmp_path / "dev")
    code, _, err = run(capsys, "dev", "up", "--kafka-port", "19092", "--data", data)
    assert code == 2 and "--kafka-port needs --kafka-listener" in err
    code, _, err = run(capsys, "dev", "up", "--kafka-listener", "--secure", "--data", data)
    assert code == 2 and "--kafka-listener cannot be combined with --secure" in err
    assert not (tmp_path / "dev" / "dev-cluster.json").exists()  # nothing was started


def test_broker_help_documents_the_kafka_listener() -> None:
    done = subprocess.run([sys.executable, "-m", "sluice", "broker", "--help"], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0
    assert "--kafka-listen" in done.stdout and "--kafka-advertise" in done.stdout
