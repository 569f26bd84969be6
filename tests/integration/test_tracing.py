"""OpenTelemetry spans, off unless configured (issue 14, item 5).

Client side: spans recorded by the SDK's in-memory exporter while a real broker serves a
transactional produce and a consume. Broker side: a broker process started with tracing
(``SLUICE_TRACING=file:PATH``, the ``--tracing`` flag's variable) writes its spans as JSON, which
the test reads back. Names and attributes are those of the messaging semantic conventions.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from sluice import errors
from sluice.client import Admin, Consumer, Producer, TopicPartition, tracing
from sluice.testing import LocalCluster
from tests.support.waiting import wait_for


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider)
    try:
        yield exporter
    finally:
        tracing.disable()
        provider.shutdown()


def test_client_spans(cluster: LocalCluster, unique_topic: str, spans: InMemorySpanExporter) -> None:
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    admin.create_topic(unique_topic, partitions=1, replication_factor=1)
    admin.close()
    txn_id = f"{unique_topic}-tx"
    producer = Producer(bootstrap_servers=cluster.bootstrap_servers, transactional_id=txn_id, linger_ms=0)
    producer.init_transactions()
    producer.begin_transaction()
    for i in range(3):
        producer.send(unique_topic, value=str(i).encode())
    producer.commit_transaction()
    consumer = Consumer(bootstrap_servers=cluster.bootstrap_servers, group_id=None)
    consumer.assign([TopicPartition(unique_topic, 0)])
    consumer.seek_to_beginning()
    read: list[Any] = []
    deadline = time.monotonic() + 30
    while len(read) < 3 and time.monotonic() < deadline:
        read.extend(consumer.poll(timeout=0.5))
    assert len(read) == 3

    finished = spans.get_finished_spans()
    sends = [s for s in finished if s.name == f"send {unique_topic}"]
    assert len(sends) == 3
    for s in sends:
        assert s.kind is SpanKind.PRODUCER and s.attributes is not None
        assert s.attributes["messaging.system"] == "kafka"
        assert s.attributes["messaging.operation.type"] == "send"
        assert s.attributes["messaging.destination.name"] == unique_topic
        assert s.attributes["messaging.destination.partition.id"] == "0"
    assert sorted(s.attributes["messaging.kafka.offset"] for s in sends if s.attributes) == [0, 1, 2]
    (commit,) = [s for s in finished if s.name == "commit"]
    assert commit.kind is SpanKind.CLIENT and commit.attributes is not None
    assert commit.attributes["messaging.operation.type"] == "settle"
    assert commit.attributes["sluice.transactional_id"] == txn_id
    # end to end: the commit span covers the acknowledgement of every record of the transaction
    assert commit.end_time is not None and all(s.end_time is not None and s.end_time <= commit.end_time for s in sends)
    polls = [s for s in finished if s.name == f"poll {unique_topic}"]
    assert sum(s.attributes["messaging.batch.message_count"] for s in polls if s.attributes) == 3
    assert all(s.kind is SpanKind.CLIENT for s in polls)

    # an aborted transaction is an "abort" span
    producer.begin_transaction()
    producer.send(unique_topic, value=b"x").result(timeout=30)
    producer.abort_transaction()
    (abort,) = [s for s in spans.get_finished_spans() if s.name == "abort"]
    assert abort.attributes is not None and abort.attributes["sluice.transactional_id"] == txn_id

    # a record whose delivery fails ends its span with an error
    future: Future[Any] = Future()
    tracing.sent(unique_topic, 0, future)
    future.set_exception(errors.NotEnoughReplicasError("not enough in-sync replicas"))
    (failed,) = [s for s in spans.get_finished_spans() if s.name == f"send {unique_topic}" and not s.status.is_ok]
    assert failed.status.status_code is StatusCode.ERROR and "not enough" in (failed.status.description or "")

    # off: no span at all
    tracing.disable()
    before = len(spans.get_finished_spans())
    producer.begin_transaction()
    producer.send(unique_topic, value=b"y").result(timeout=30)
    producer.commit_transaction()
    assert consumer.poll(timeout=2.0)
    assert len(spans.get_finished_spans()) == before
    consumer.close()
    producer.close()


def read_spans(path: Path) -> list[dict[str, Any]]:
    """The JSON spans ConsoleSpanExporter wrote, one object after the other."""
    text = path.read_text() if path.exists() else ""
    decoder, pos, out = json.JSONDecoder(), 0, []
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            return out
        obj, pos = decoder.raw_decode(text, pos)
        out.append(obj)


def test_broker_spans(fresh_cluster: Callable[..., LocalCluster], unique_topic: str, tmp_path: Path) -> None:
    trace_file = tmp_path / "broker-spans.json"
    cluster = fresh_cluster(brokers=1, env={"SLUICE_TRACING": f"file:{trace_file}"})
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    admin.create_topic(unique_topic, partitions=1, replication_factor=1)
    admin.close()
    txn_id = f"{unique_topic}-tx"
    producer = Producer(bootstrap_servers=cluster.bootstrap_servers, transactional_id=txn_id, linger_ms=50)
    producer.init_transactions()
    producer.begin_transaction()
    for i in range(5):
        producer.send(unique_topic, value=str(i).encode())
    producer.commit_transaction()
    producer.close()
    consumer = Consumer(bootstrap_servers=cluster.bootstrap_servers, group_id=None)
    consumer.assign([TopicPartition(unique_topic, 0)])
    consumer.seek_to_beginning()
    deadline, read = time.monotonic() + 30, 0
    while read < 5 and time.monotonic() < deadline:
        read += len(consumer.poll(timeout=0.5))
    consumer.close()
    assert read == 5

    def found() -> bool:  # the batch processor exports every few seconds
        names = {s["name"] for s in read_spans(trace_file)}
        return {f"send {unique_topic}", "commit", f"receive {unique_topic}"} <= names

    wait_for(found, timeout=30, what="the broker's spans in its trace file")
    spans_ = read_spans(trace_file)
    sends = [s for s in spans_ if s["name"] == f"send {unique_topic}"]
    assert all(s["kind"] == "SpanKind.SERVER" for s in sends)
    assert sum(s["attributes"]["messaging.batch.message_count"] for s in sends) == 5
    assert all(s["attributes"]["messaging.system"] == "kafka" for s in sends)
    assert all(s["attributes"]["sluice.transactional_id"] == txn_id for s in sends)
    assert all(s["attributes"]["messaging.destination.partition.id"] == "0" for s in sends)
    (commit,) = [s for s in spans_ if s["name"] == "commit" and s["attributes"]["sluice.transactional_id"] == txn_id]
    assert commit["attributes"]["messaging.operation.type"] == "settle"
    assert commit["status"]["status_code"] == "UNSET"
    receive = [s for s in spans_ if s["name"] == f"receive {unique_topic}"]
    assert receive and receive[0]["attributes"]["messaging.operation.type"] == "receive"
    assert spans_[0]["resource"]["attributes"]["service.name"] == "sluice-broker"


def test_a_bad_tracing_exporter_stops_the_broker_with_a_message(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sluice.broker", "--id", "0", "--listen", "127.0.0.1:1", "--data", str(tmp_path),
         "--tracing", "jaeger"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--tracing must be otlp, console or file:PATH, not 'jaeger'" in result.stderr
