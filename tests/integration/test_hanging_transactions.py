"""Hanging transactions: found with ``sluice transactions find-hanging``, ended with ``abort --start-offset``.

A hanging transaction is data its coordinator does not know of, so no marker will ever end it,
and it holds the partition's last stable offset back for every read_committed consumer.
KIP-890's verification keeps Sluice's own brokers from making one, so the test switches it off
with the ``produce.skip_verification`` hook (a broker before KIP-890 did the same) and writes a
transactional batch for a transactional id that no coordinator has. Real broker, CLI in-process.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice import errors
from sluice.api.v1 import records_pb2 as pb
from sluice.client import Admin, Producer, TopicPartition
from sluice.testing import LocalCluster
from tests.support.waiting import wait_for

from .helpers import checked, cli
from .wire import Wire, batch_of

MAX_TIMEOUT_MS = 2000  # transaction.max.timeout.ms: a transaction idle longer than this is hanging
CONFIG = {"sluice.test.hooks": "produce.skip_verification", "transaction.max.timeout.ms": MAX_TIMEOUT_MS}
TP = TopicPartition("orders", 0)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with checked(LocalCluster(brokers=1, data_dir=tmp_path, config=CONFIG)) as c:
        yield c


def lso(admin: Admin) -> int:
    return admin.list_offsets({TP: Admin.LATEST}, isolation_level="read_committed")[TP].offset


def test_a_hanging_transaction_is_found_and_aborted(cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    boot = ["--bootstrap-server", cluster.bootstrap_servers]
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    admin.create_topic(TP.topic, partitions=1, replication_factor=1)
    wire = Wire(cluster.broker(0).address)
    pid, epoch = wire.init_producer_id()  # a producer id no transactional id owns
    skip = cluster.data_dir / "broker-0" / "skip-verification"
    skip.touch()
    hanging = batch_of([b"hanging"], producer_id=pid, producer_epoch=epoch, base_sequence=0, transactional=True)
    assert wire.produce(TP.topic, TP.partition, hanging, transactional_id="ghost").error_code == pb.NONE
    skip.unlink()
    producer = Producer(bootstrap_servers=cluster.bootstrap_servers, linger_ms=0)
    producer.send(TP.topic, value=b"after", partition=0).result(timeout=30)
    producer.close()
    assert lso(admin) == 0  # read_committed consumers wait at the hanging transaction

    # Young, it may still be live: the broker refuses to abort it, and find-hanging does not list it.
    producers = {p.producer_id: p for p in admin.describe_producers([TP])[TP]}
    assert len(producers) == 2  # the hanging one, and the idempotent producer of "after" (nothing open)
    state = producers[pid]
    assert state.current_transaction_start_offset == 0
    assert [p.current_transaction_start_offset for q, p in producers.items() if q != pid] == [-1]
    with pytest.raises(errors.InvalidTxnStateError, match=r"transaction\.max\.timeout\.ms"):
        admin.abort_transaction(TP, pid, state.producer_epoch, state.coordinator_epoch)
    code, out, _err = cli(capsys, "transactions", "find-hanging", *boot, "--topic", TP.topic, "--json")
    assert code == 0 and json.loads(out) == []  # within the default 15 minutes

    time.sleep(MAX_TIMEOUT_MS / 1000 + 0.5)
    code, out, err = cli(capsys, "transactions", "find-hanging", *boot, "--max-transaction-timeout", "0", "--json")
    assert code == 0, err
    (found,) = json.loads(out)
    assert (found["topic"], found["partition"], found["producer_id"], found["start_offset"]) == (TP.topic, 0, pid, 0)

    code, out, err = cli(
        capsys, "transactions", "abort", *boot, "--topic", TP.topic, "--partition", "0", "--start-offset", "5"
    )
    assert code == 1 and "starts at offset 5" in err  # no such transaction: nothing written
    code, out, err = cli(
        capsys, "transactions", "abort", *boot, "--topic", TP.topic, "--partition", "0", "--start-offset", "0"
    )
    assert code == 0, err
    assert "ABORT marker at offset 2" in out
    wait_for(lambda: lso(admin) == 3, 10, "the LSO past the aborted transaction")
    assert [v for _o, v in wire.read_all(TP.topic, 0)] == [b"after"]  # the hanging record never becomes visible
    code, out, _err = cli(capsys, "transactions", "find-hanging", *boot, "--max-transaction-timeout", "0")
    assert code == 0 and "no hanging transactions found" in out
    # nothing open any more: a second abort is refused, the log unchanged
    with pytest.raises(errors.InvalidTxnStateError, match="nothing to abort"):
        admin.abort_transaction(TP, pid, state.producer_epoch, state.coordinator_epoch)
    assert admin.list_offsets({TP: Admin.LATEST})[TP].offset == 3
    admin.close()
    wire.close()


def test_abort_names_what_it_needs(cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    boot = ["--bootstrap-server", cluster.bootstrap_servers]
    code, _out, err = cli(capsys, "transactions", "abort", *boot)
    assert code == 1 and "ID, --producer-id, --producer-epoch" in err
    code, _out, err = cli(capsys, "transactions", "abort", *boot, "--topic", "orders")
    assert code == 1 and "--partition" in err
    code, _out, err = cli(capsys, "transactions", "find-hanging", *boot, "--partition", "0")
    assert code == 1 and "--partition goes with --topic" in err


def test_kafka_s_own_tool_finds_and_aborts_it_on_the_kafka_listener(tmp_path: Path) -> None:
    """kafka-transactions.sh (Kafka 4.3.1's TransactionsCommand) unchanged: find-hanging reads
    DescribeProducers, ListTransactions and DescribeTransactions; abort sends WriteTxnMarkers."""
    from bench.kafka.fetch import ensure_jars

    from .test_kafka_java_tools import run_tool

    jars = ensure_jars()
    with checked(LocalCluster(brokers=1, data_dir=tmp_path, config=CONFIG, kafka_listener=True)) as cluster:
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        admin.create_topic(TP.topic, partitions=1, replication_factor=1)
        wire = Wire(cluster.broker(0).address)
        pid, epoch = wire.init_producer_id()
        skip = cluster.data_dir / "broker-0" / "skip-verification"
        skip.touch()
        hanging = batch_of([b"hanging"], producer_id=pid, producer_epoch=epoch, base_sequence=0, transactional=True)
        assert wire.produce(TP.topic, TP.partition, hanging, transactional_id="ghost").error_code == pb.NONE
        skip.unlink()
        time.sleep(MAX_TIMEOUT_MS / 1000 + 0.5)
        main_class = "org.apache.kafka.tools.TransactionsCommand"
        boot = ["--bootstrap-server", cluster.kafka_bootstrap_servers]
        found = run_tool(
            jars, main_class, [*boot, "find-hanging", "--topic", TP.topic, "--max-transaction-timeout", "0"]
        )
        rows = [line.split() for line in found.splitlines() if line.strip()]
        assert rows[0][:3] == ["Topic", "Partition", "ProducerId"], found
        assert [(r[0], r[1], r[2], r[5]) for r in rows[1:]] == [(TP.topic, "0", str(pid), "0")], found
        run_tool(jars, main_class, [*boot, "abort", "--topic", TP.topic, "--partition", "0", "--start-offset", "0"])
        wait_for(lambda: lso(admin) == 2, 10, "the LSO past the aborted transaction")  # the record and its marker
        assert wire.read_all(TP.topic, 0) == []
        admin.close()
        wire.close()
