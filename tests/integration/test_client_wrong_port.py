"""The Python client's first contact: refused arguments and a wrong port fail at once, saying why.

``Admin.create_topic(partitions=0)`` used to create a topic of ``num.partitions`` partitions (0
is "the default" on the wire); the CLI refuses 0, so does the client now. A client pointed at a
port that accepts connections but is not a Sluice gRPC port (a Sluice broker's own Kafka port
above all) used to retry for 30 s and say "Socket closed"; it now fails in about a second,
naming the Kafka port as such. A missing topic is said at once too: send() waits for it as
Kafka's producer does (max_block_ms) but logs why, and a subscription to it logs that it does not
exist instead of polling empty without a word.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from sluice import errors
from sluice.client import Admin, Consumer, Producer
from sluice.testing import LocalCluster

FAST_S = 3.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(brokers=1, data_dir=tmp_path_factory.mktemp("wrong-port"), kafka_listener=True) as c:
        yield c


def test_create_topic_refuses_zero_partitions_and_replicas(cluster: LocalCluster) -> None:
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    try:
        with pytest.raises(errors.InvalidPartitionsError, match="at least 1, not 0"):
            admin.create_topic("zero-partitions", partitions=0)
        with pytest.raises(errors.InvalidReplicationFactorError, match="at least 1, not 0"):
            admin.create_topic("zero-replicas", replication_factor=0)
        with pytest.raises(errors.InvalidPartitionsError):
            admin.create_topic("negative", partitions=-3)
        assert not {"zero-partitions", "zero-replicas", "negative"} & set(admin.list_topics())
        admin.create_topic("defaults")  # None: the broker's num.partitions, as before
        assert len(admin.describe_topic("defaults").partitions) == 1
    finally:
        admin.close()


def test_admin_at_the_kafka_port_says_so_at_once(cluster: LocalCluster) -> None:
    admin = Admin(bootstrap_servers=cluster.kafka_bootstrap_servers)
    started = time.monotonic()
    try:
        with pytest.raises(errors.NoBrokersAvailableError, match="speaks Kafka's protocol, not Sluice's gRPC") as exc:
            admin.list_topics()
    finally:
        admin.close()
    assert time.monotonic() - started < FAST_S
    assert cluster.kafka_bootstrap_servers in str(exc.value) and "gRPC address" in str(exc.value)


def test_producer_at_the_kafka_port_says_so_at_once(cluster: LocalCluster) -> None:
    producer = Producer(bootstrap_servers=cluster.kafka_bootstrap_servers)
    started = time.monotonic()
    try:
        with pytest.raises(errors.NoBrokersAvailableError, match="Kafka's protocol"):
            producer.send("anything", b"x").get(timeout=10)
    finally:
        producer.close()
    assert time.monotonic() - started < FAST_S


def test_a_port_that_speaks_neither(cluster: LocalCluster) -> None:
    """An HTTP/1 server: "does not speak gRPC", with what it answered."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(1024)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    admin = Admin(bootstrap_servers=f"127.0.0.1:{server.getsockname()[1]}")
    started = time.monotonic()
    try:
        with pytest.raises(errors.NoBrokersAvailableError, match=r"speaks gRPC \(.*HTTP/1\.1 400"):
            admin.list_topics()
        assert time.monotonic() - started < FAST_S
    finally:
        admin.close()
        stop.set()
        thread.join()
        server.close()


def test_the_grpc_port_still_works_and_the_cli_names_the_kafka_port(cluster: LocalCluster) -> None:
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    try:
        admin.list_topics()
    finally:
        admin.close()
    done = subprocess.run(
        [sys.executable, "-m", "sluice", "topics", "list", "--bootstrap-server", cluster.kafka_bootstrap_servers],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert "speaks Kafka's protocol" in done.stderr and "gRPC" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_send_to_a_missing_topic_says_why_it_waits(cluster: LocalCluster, caplog: pytest.LogCaptureFixture) -> None:
    """As Kafka's producer, send() waits max_block_ms for the topic; it now says so at once, and why."""
    producer = Producer(bootstrap_servers=cluster.bootstrap_servers, max_block_ms=2500)
    try:
        with (
            caplog.at_level(logging.WARNING, logger="sluice.client"),
            pytest.raises(errors.UnknownTopicOrPartitionError, match="sluice topics create no-such"),
        ):
            producer.send("no-such", b"x").get(timeout=10)
    finally:
        producer.close()
    warnings = [r.getMessage() for r in caplog.records if "no-such" in r.getMessage()]
    assert len(warnings) == 1 and "does not exist" in warnings[0] and "waiting up to 2 s" in warnings[0], warnings


def test_subscribing_to_a_missing_topic_is_said_once(cluster: LocalCluster, caplog: pytest.LogCaptureFixture) -> None:
    consumer = Consumer(bootstrap_servers=cluster.bootstrap_servers, group_id="missing-topic-group")
    try:
        consumer.subscribe(["not-there", "defaults"])
        with caplog.at_level(logging.WARNING, logger="sluice.client.consumer"):
            deadline = time.monotonic() + 6
            while time.monotonic() < deadline:
                consumer.poll(0.5)
    finally:
        consumer.close()
    warnings = [r.getMessage() for r in caplog.records if "do not exist" in r.getMessage()]
    assert len(warnings) == 1 and "'not-there'" in warnings[0] and "'defaults'" not in warnings[0], warnings
