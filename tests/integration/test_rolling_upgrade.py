"""A rolling upgrade of a 3-broker cluster from d37a648 loses nothing (issue 26).

d37a648 is the last commit before Kafka clients' batches were stored as sent
(``records_format`` KAFKA_V2): its brokers read only Sluice's record encoding. A follower of that
version refuses a v2 batch (its CRC is Kafka's, not Sluice's: "fails its CRC-32C check"), so a
partition led by an upgraded broker stopped replicating and every acks=all produce to it timed out
until the last old broker was gone. The gate (``ClusterView.kafka_v2_writable``) keeps Kafka clients'
batches in Sluice's encoding while a replica of the partition registered with older code.

The old code is tests/data/sluice-d37a648-src.tgz (made by tests/data/make_old_source.sh: d37a648's
``sluice``, ``sluice.broker`` laid out as the installed package, no network or git history needed),
put first on PYTHONPATH of the old brokers: its dependencies are this environment's. The local
controller (the operator's stand-in) runs this code throughout: what is upgraded here is the brokers.

The cluster starts all old (RF3, min.insync.replicas=2). An acks=all idempotent Kafka producer (gzip:
the converted batches keep it, as every version reads it) and Sluice's gRPC producer write to three
partitions while each broker in turn is stopped with SIGTERM and started with the new code on the
same data directory. After each step every partition must take new acknowledged writes; at the end
every acknowledged record is read back exactly once, at its offset and in send order, by a Kafka
consumer and by Sluice's consumer, and the replicas are compared batch by batch.
"""

from __future__ import annotations

import os
import tarfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sluice.api.v1 import records_pb2 as pb
from sluice.client import Admin, Consumer, Producer, TopicPartition
from sluice.metadata import keys
from sluice.testing import LocalCluster

from .helpers import read_topic
from .test_kafka_produce_fetch import kafka_read
from .wire import Wire

kafka = pytest.importorskip("kafka")  # the dev extra installs kafka-python

OLD_SOURCE = Path(__file__).resolve().parent.parent / "data" / "sluice-d37a648-src.tgz"
TOPIC = "upgrade"
PARTITIONS = 3
STEP_PROGRESS = 10  # new acknowledged records per partition and producer after each step ...
STEP_PROGRESS_S = 60.0  # ... within this long
PRODUCE_LIMIT_S = 400.0  # a producer thread stops by then whatever happens
PRODUCE_MAX = 20_000  # ... or after this many records
IN_FLIGHT_MAX = 300  # unresolved sends a producer thread allows itself
VALUE_BYTES = 200

pytestmark = pytest.mark.timeout(600)


class Sender(threading.Thread):
    """Sends ``<name>-<n>`` to the partitions in turn until stopped (bounded in count and time).

    ``sent`` holds (partition, value, done, outcome) per record: ``done()`` tells whether the send
    resolved, ``outcome()`` the offset it was acknowledged at (or the exception)."""

    def __init__(self, name: str, send: Callable[[int, bytes], tuple[Callable[[], bool], Callable[[], Any]]]) -> None:
        super().__init__(name=f"sender-{name}", daemon=True)
        self.label = name
        self._send = send
        self.sent: list[tuple[int, bytes, Callable[[], bool], Callable[[], Any]]] = []
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        deadline = time.monotonic() + PRODUCE_LIMIT_S
        n = 0
        try:
            while not self.stopping.is_set() and time.monotonic() < deadline and n < PRODUCE_MAX:
                unresolved = sum(1 for _p, _v, done, _o in self.sent[-IN_FLIGHT_MAX * 2 :] if not done())
                if unresolved >= IN_FLIGHT_MAX:
                    time.sleep(0.05)
                    continue
                partition = n % PARTITIONS
                # padded: kafka-python sends a batch uncompressed when gzip does not shrink it (one short record)
                value = f"{self.label}-{n}".encode().ljust(VALUE_BYTES, b".")
                done, outcome = self._send(partition, value)
                self.sent.append((partition, value, done, outcome))
                n += 1
                if partition == PARTITIONS - 1:
                    time.sleep(0.03)
        except BaseException as exc:  # reported by the test
            self.error = exc

    def acked(self) -> dict[int, int]:
        """Acknowledged records per partition so far."""
        out = dict.fromkeys(range(PARTITIONS), 0)
        for partition, _v, done, outcome in list(self.sent):
            if done() and isinstance(outcome(), int):
                out[partition] += 1
        return out

    def acknowledged(self) -> list[tuple[int, int, bytes]]:
        """(partition, offset, value) of every acknowledged record, in send order."""
        return [(p, o, v) for p, v, done, outcome in self.sent if done() and isinstance(o := outcome(), int)]


def kafka_sender(producer: Any) -> Callable[[int, bytes], tuple[Callable[[], bool], Callable[[], Any]]]:
    def send(partition: int, value: bytes) -> tuple[Callable[[], bool], Callable[[], Any]]:
        future = producer.send(TOPIC, key=b"k", value=value, partition=partition)

        def outcome() -> Any:
            return future.value.offset if future.succeeded() else future.exception

        return (lambda: future.is_done), outcome

    return send


def grpc_sender(producer: Producer) -> Callable[[int, bytes], tuple[Callable[[], bool], Callable[[], Any]]]:
    def send(partition: int, value: bytes) -> tuple[Callable[[], bool], Callable[[], Any]]:
        future = producer.send(TOPIC, key=b"k", value=value, partition=partition)

        def outcome() -> Any:
            exc = future.exception()
            return exc if exc is not None else future.result().offset

        return future.done, outcome

    return send


def wait_for_progress(senders: list[Sender], what: str) -> None:
    """Every sender gets STEP_PROGRESS more acknowledged records on every partition, or the test fails."""
    before = {s.label: s.acked() for s in senders}
    deadline = time.monotonic() + STEP_PROGRESS_S
    while time.monotonic() < deadline:
        now = {s.label: s.acked() for s in senders}
        if all(now[s][p] - before[s][p] >= STEP_PROGRESS for s in now for p in range(PARTITIONS)):
            return
        for s in senders:
            assert s.error is None, f"{s.label} failed: {s.error!r}"
        time.sleep(0.2)
    now = {s.label: s.acked() for s in senders}
    stalled = {s: {p: now[s][p] - before[s][p] for p in range(PARTITIONS)} for s in now}
    pytest.fail(f"{what}: in {STEP_PROGRESS_S:.0f} s, new acknowledged records per producer and partition: {stalled}")


def stored_batches(cluster: LocalCluster, partition: int) -> list[pb.RecordBatch]:
    """Every batch of a partition as its leader stores it (Kafka's encoding left as it is)."""
    wire = Wire(cluster.brokers[cluster.leader(TOPIC, partition)].address)
    out: list[pb.RecordBatch] = []
    try:
        offset = 0
        for _ in range(10_000):
            batches = list(wire.fetch(TOPIC, partition, offset, read_committed=False, kafka_v2_records=True).batches)
            if not batches:
                break
            out += batches
            offset = batches[-1].base_offset + batches[-1].record_count
    finally:
        wire.close()
    return out


def test_a_rolling_upgrade_from_d37a648_loses_nothing(tmp_path: Path) -> None:
    old_tree = tmp_path / "old-code"
    with tarfile.open(OLD_SOURCE) as tar:
        tar.extractall(old_tree, filter="data")
    new_env = dict(os.environ, PYTHONUNBUFFERED="1")
    # PYTHONSAFEPATH: `python -m` puts the working directory (this checkout, with today's sluice/) first otherwise
    old_path = os.pathsep.join(p for p in (str(old_tree), os.environ.get("PYTHONPATH")) if p)
    old_env = dict(new_env, PYTHONPATH=old_path, PYTHONSAFEPATH="1")
    cluster = LocalCluster(brokers=3, data_dir=tmp_path / "cluster", kafka_listener=True, env=old_env)
    cluster.controller.env = new_env
    with cluster:
        for i in range(3):  # the old code is what runs: its registrations do not advertise Kafka's encoding
            assert "records_formats" not in cluster.metadata.get(keys.broker(i)).value
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        try:
            admin.create_topic(TOPIC, PARTITIONS, 3)
        finally:
            admin.close()
        for p in range(PARTITIONS):
            cluster.wait_for_partition(TOPIC, p, lambda s: len(s["isr"]) == 3 and s["leader"] >= 0, timeout=60)
        kproducer = kafka.KafkaProducer(
            bootstrap_servers=cluster.kafka_bootstrap_servers,
            acks="all",
            enable_idempotence=True,
            request_timeout_ms=30_000,
            linger_ms=5,
            compression_type="gzip",  # kept through the conversion: brokers of every version read gzip
        )
        gproducer = Producer(cluster.bootstrap_servers, acks="all", enable_idempotence=True, linger_ms=5)
        senders = [Sender("kafka", kafka_sender(kproducer)), Sender("grpc", grpc_sender(gproducer))]
        old_until: dict[int, int] = {}
        try:
            for s in senders:
                s.start()
            wait_for_progress(senders, "all brokers old")
            for i in range(3):
                if i == 2:  # what was written before the last old broker stops: Sluice's encoding only
                    ends = Consumer(bootstrap_servers=cluster.bootstrap_servers, group_id=None)
                    try:
                        tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
                        old_until = {tp.partition: o for tp, o in ends.end_offsets(tps).items()}
                    finally:
                        ends.close()
                assert cluster.stop(i) == 0, cluster.log_tail(i)  # SIGTERM: a controlled shutdown
                cluster.broker(i).env = new_env
                cluster.restart(i)
                for p in range(PARTITIONS):  # back in sync, and leading what it led before (preferred leader)
                    cluster.wait_for_partition(
                        TOPIC, p, lambda s: len(s["isr"]) == 3 and s["leader"] == s["replicas"][0], timeout=90
                    )
                wait_for_progress(senders, f"broker {i} upgraded, {2 - i} old")
        finally:
            for s in senders:
                s.stopping.set()
            for s in senders:
                s.join(timeout=30)
            kproducer.flush(timeout=120)
            gproducer.flush(timeout=120)
        for s in senders:
            assert s.error is None, f"{s.label} failed: {s.error!r}"
            assert not s.is_alive()
        # After the upgrade Kafka clients' batches are stored as sent again.
        last = [kproducer.send(TOPIC, key=b"k", value=b"last", partition=p).get(timeout=60).offset for p in range(3)]
        kproducer.close(timeout=30)
        gproducer.close()

        for p in range(PARTITIONS):
            batches = stored_batches(cluster, p)
            by_offset = {b.base_offset: b for b in batches}
            assert by_offset[last[p]].records_format == pb.RECORDS_FORMAT_KAFKA_V2
            early = [b for b in batches if b.base_offset < old_until[p]]
            v2_early = [(b.base_offset, b.producer_id, b.partition_leader_epoch) for b in early if b.records_format]
            assert early and not v2_early, f"partition {p}: Kafka's encoding before offset {old_until[p]}: {v2_early}"
            # The Kafka producer's gzip survived the conversion (the gRPC producer sends uncompressed).
            codecs = {b.compression for b in early}
            assert codecs == {pb.COMPRESSION_GZIP, pb.COMPRESSION_NONE}, f"partition {p}: codecs {codecs}"

        grpc_rows = read_topic(cluster.bootstrap_servers, TOPIC, limit_s=120)
        for p in range(PARTITIONS):
            kafka_rows = [(o, v) for o, _k, v, _h, _t in kafka_read(cluster, TOPIC, "read_committed", partition=p)]
            grpc_part = [(o, v) for q, o, _k, v in grpc_rows if q == p]
            assert kafka_rows == grpc_part, f"partition {p}: the two clients read different records"
            values = [v for _o, v in kafka_rows]
            assert len(values) == len(set(values)), f"partition {p}: a record was stored twice"
            at = dict(kafka_rows)
            for s in senders:
                mine = [(o, v) for q, o, v in s.acknowledged() if q == p]
                assert len(mine) >= STEP_PROGRESS * 4
                missing = [(o, v) for o, v in mine if at.get(o) != v]
                assert not missing, f"partition {p}: {s.label}'s acknowledged records not read back: {missing[:5]}"
                offsets = [o for o, _v in mine]
                assert offsets == sorted(offsets), f"partition {p}: {s.label}'s records out of send order"
        assert cluster.check_replica_consistency(timeout=90) > 0
