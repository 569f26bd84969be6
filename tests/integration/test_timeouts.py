"""Transaction timeouts: the coordinator aborts what a producer left open, and fences it."""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest

from sluice import errors
from sluice.client import Admin, Consumer, Producer, TopicPartition
from sluice.testing import LocalCluster
from tests.support.waiting import wait_for

from .helpers import read_topic, values

# A first write must land before the timeout, on a loaded machine too; the abort follows soon after.
SHORT_TIMEOUT_MS = 3000
FAST_ABORT = {
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "200",
    "transaction.max.timeout.ms": "60000",
}


def test_transaction_past_its_timeout_is_aborted_and_the_producer_fenced(tmp_path: Path) -> None:
    with LocalCluster(brokers=1, data_dir=tmp_path, config=FAST_ABORT) as cluster:
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        admin.create_topic("slow", partitions=1, replication_factor=1)
        p = Producer(
            bootstrap_servers=cluster.bootstrap_servers,
            transactional_id="slow-tx",
            transaction_timeout_ms=1000,
            linger_ms=0,
        )
        p.init_transactions()
        p.begin_transaction()
        p.send("slow", value=b"never-committed").result(timeout=30)

        def aborted() -> bool:
            (state,) = admin.describe_transactions(["slow-tx"])
            return state.state in ("CompleteAbort", "PrepareAbort")

        wait_for(aborted, timeout=20, what="the coordinator to abort the timed-out transaction")
        with pytest.raises((errors.ProducerFencedError, errors.InvalidProducerEpochError)):
            p.commit_transaction()
        p.close()
        assert read_topic(cluster.bootstrap_servers, "slow") == []
        assert len(read_topic(cluster.bootstrap_servers, "slow", "read_uncommitted")) == 1
        admin.close()


def test_timeout_above_the_maximum_is_refused_at_init(tmp_path: Path) -> None:
    with LocalCluster(brokers=1, data_dir=tmp_path, config={"transaction.max.timeout.ms": "5000"}) as cluster:
        p = Producer(
            bootstrap_servers=cluster.bootstrap_servers, transactional_id="too-long", transaction_timeout_ms=6000
        )
        with pytest.raises(errors.InvalidTransactionTimeoutError):
            p.init_transactions()
        p.close()


def test_producer_whose_transaction_timed_out_aborts_and_goes_on(tmp_path: Path) -> None:
    """Transaction protocol v2 (KIP-890 part 2): a timeout is abortable, not a fence.

    The coordinator aborts the transaction with the epoch bumped and remembers
    the old handle: the producer's next call gets the abortable
    InvalidProducerEpochError, abort_transaction() succeeds, and the same
    producer object commits its next transaction at the bumped epoch.
    """
    with LocalCluster(brokers=1, data_dir=tmp_path, config=FAST_ABORT) as cluster:
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        admin.create_topic("resumed", partitions=2, replication_factor=1)
        p = Producer(
            bootstrap_servers=cluster.bootstrap_servers,
            transactional_id="resumed-tx",
            transaction_timeout_ms=SHORT_TIMEOUT_MS,
            linger_ms=0,
        )
        p.init_transactions()
        (pid, epoch) = p._txn.producer_id_and_epoch()
        p.begin_transaction()
        p.send("resumed", value=b"timed-out", partition=0).result(timeout=30)

        def aborted() -> bool:
            (state,) = admin.describe_transactions(["resumed-tx"])
            return state.state == "CompleteAbort"

        wait_for(aborted, timeout=30, what="the coordinator to abort the timed-out transaction")
        (state,) = admin.describe_transactions(["resumed-tx"])
        assert (state.producer_id, state.producer_epoch) == (pid, epoch + 1)  # bumped, not fenced

        # The next write is refused with the abortable error, not PRODUCER_FENCED ...
        with pytest.raises(errors.InvalidProducerEpochError) as refused:
            p.send("resumed", value=b"late", partition=1).result(timeout=30)
        assert refused.value.category is errors.Category.ABORTABLE
        assert p.transaction_state.value == "ABORTABLE_ERROR"
        with pytest.raises(errors.InvalidProducerEpochError):
            p.commit_transaction()
        # ... the abort goes through, and the same producer goes on at the bumped epoch.
        p.abort_transaction()
        assert p._txn.producer_id_and_epoch() == (pid, epoch + 1)
        p.begin_transaction()
        p.send("resumed", value=b"after-the-timeout", partition=0)
        p.send("resumed", value=b"after-the-timeout-1", partition=1)
        p.commit_transaction()
        assert p._txn.producer_id_and_epoch() == (pid, epoch + 2)  # every end bumps (TV2)
        p.begin_transaction()
        p.send("resumed", value=b"third", partition=0)
        p.commit_transaction()
        p.close()

        got = sorted(v for v in values(read_topic(cluster.bootstrap_servers, "resumed")) if v is not None)
        assert got == [b"after-the-timeout", b"after-the-timeout-1", b"third"]
        admin.close()


def test_commit_right_after_a_timeout_is_abortable_and_the_producer_goes_on(tmp_path: Path) -> None:
    """The first call after the timeout is commit_transaction() itself: abortable, then abort works."""
    with LocalCluster(brokers=1, data_dir=tmp_path, config=FAST_ABORT) as cluster:
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        admin.create_topic("resumed2", partitions=1, replication_factor=1)
        p = Producer(
            bootstrap_servers=cluster.bootstrap_servers,
            transactional_id="resumed2-tx",
            transaction_timeout_ms=SHORT_TIMEOUT_MS,
            linger_ms=0,
        )
        p.init_transactions()
        p.begin_transaction()
        p.send("resumed2", value=b"timed-out").result(timeout=30)

        def aborted() -> bool:
            (state,) = admin.describe_transactions(["resumed2-tx"])
            return state.state == "CompleteAbort"

        wait_for(aborted, timeout=30, what="the coordinator to abort the timed-out transaction")
        with pytest.raises(errors.InvalidProducerEpochError) as refused:
            p.commit_transaction()
        assert "timed out" in str(refused.value)
        p.abort_transaction()
        p.begin_transaction()
        p.send("resumed2", value=b"next")
        p.commit_transaction()
        p.close()
        assert values(read_topic(cluster.bootstrap_servers, "resumed2")) == [b"next"]
        admin.close()


def test_a_new_instance_after_a_timeout_fences_the_old_producer_for_good(tmp_path: Path) -> None:
    """The timeout leaves the old producer free to abort, until another instance initializes the id."""
    with LocalCluster(brokers=1, data_dir=tmp_path, config=FAST_ABORT) as cluster:
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        admin.create_topic("taken-over", partitions=1, replication_factor=1)
        old = Producer(
            bootstrap_servers=cluster.bootstrap_servers,
            transactional_id="taken-over-tx",
            transaction_timeout_ms=SHORT_TIMEOUT_MS,
            linger_ms=0,
        )
        old.init_transactions()
        old.begin_transaction()
        old.send("taken-over", value=b"old").result(timeout=30)

        def aborted() -> bool:
            (state,) = admin.describe_transactions(["taken-over-tx"])
            return state.state == "CompleteAbort"

        wait_for(aborted, timeout=30, what="the coordinator to abort the timed-out transaction")
        new = Producer(bootstrap_servers=cluster.bootstrap_servers, transactional_id="taken-over-tx", linger_ms=0)
        new.init_transactions()
        with pytest.raises(errors.ProducerFencedError):
            old.send("taken-over", value=b"late").result(timeout=30)
        with pytest.raises(errors.ProducerFencedError):
            old.abort_transaction()
        assert old.transaction_state.value == "FATAL_ERROR"
        old.close()
        new.begin_transaction()
        new.send("taken-over", value=b"new")
        new.commit_transaction()
        new.close()
        assert values(read_topic(cluster.bootstrap_servers, "taken-over")) == [b"new"]
        admin.close()


def test_a_timed_out_producer_writing_to_another_brokers_partition_is_told_abortable(tmp_path: Path) -> None:
    """The partition leader is not the coordinator: its KIP-890 verification asks the coordinator."""
    config = {**FAST_ABORT, "transaction.state.log.num.partitions": "3"}
    tid = "remote-verify-tx"
    with LocalCluster(brokers=3, data_dir=tmp_path, config=config) as cluster:
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        admin.create_topic("spread", partitions=3, replication_factor=3)
        coordinator = cluster.leader("__transaction_state", zlib.crc32(tid.encode()) % 3)
        elsewhere = [p for p in range(3) if cluster.leader("spread", p) not in (coordinator, -1)]
        assert elsewhere, "every partition of the topic is led by the coordinator"
        partition = elsewhere[0]
        p = Producer(
            bootstrap_servers=cluster.bootstrap_servers,
            transactional_id=tid,
            transaction_timeout_ms=SHORT_TIMEOUT_MS,
            linger_ms=0,
        )
        p.init_transactions()
        (pid, epoch) = p._txn.producer_id_and_epoch()
        p.begin_transaction()
        p.send("spread", value=b"timed-out", partition=partition).result(timeout=30)

        def aborted() -> bool:
            (state,) = admin.describe_transactions([tid])
            return state.state == "CompleteAbort"

        wait_for(aborted, timeout=30, what="the coordinator to abort the timed-out transaction")
        with pytest.raises(errors.InvalidProducerEpochError):
            p.send("spread", value=b"late", partition=partition).result(timeout=30)
        p.abort_transaction()
        p.begin_transaction()
        p.send("spread", value=b"next", partition=partition)
        p.commit_transaction()
        assert p._txn.producer_id_and_epoch() == (pid, epoch + 2)
        p.close()
        assert values(read_topic(cluster.bootstrap_servers, "spread")) == [b"next"]
        admin.close()


def test_consume_transform_produce_goes_on_after_a_timeout_with_its_offsets(tmp_path: Path) -> None:
    """The timed-out transaction held consumed offsets: they vanish with it, and the next one commits them."""
    with LocalCluster(brokers=1, data_dir=tmp_path, config=FAST_ABORT) as cluster:
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        admin.create_topic("ctp-in", partitions=1, replication_factor=1)
        admin.create_topic("ctp-out", partitions=1, replication_factor=1)
        tp = TopicPartition("ctp-in", 0)
        consumer = Consumer(bootstrap_servers=cluster.bootstrap_servers, group_id="ctp-g", enable_auto_commit=False)
        consumer.assign([tp])
        p = Producer(
            bootstrap_servers=cluster.bootstrap_servers,
            transactional_id="ctp-timeout-tx",
            transaction_timeout_ms=SHORT_TIMEOUT_MS,
            linger_ms=0,
        )
        p.init_transactions()
        p.begin_transaction()
        p.send("ctp-out", value=b"lost").result(timeout=30)
        p.send_offsets_to_transaction({tp: 5}, consumer.group_metadata())

        def aborted() -> bool:
            (state,) = admin.describe_transactions(["ctp-timeout-tx"])
            return state.state == "CompleteAbort"

        wait_for(aborted, timeout=30, what="the coordinator to abort the timed-out transaction")
        with pytest.raises(errors.InvalidProducerEpochError):
            p.send_offsets_to_transaction({tp: 6}, consumer.group_metadata())
        p.abort_transaction()
        assert consumer.committed([tp])[tp] is None  # the timed-out offsets went with their transaction

        p.begin_transaction()
        p.send("ctp-out", value=b"kept")
        p.send_offsets_to_transaction({tp: 5}, consumer.group_metadata())
        p.commit_transaction()
        assert wait_for(lambda: consumer.committed([tp])[tp] == 5, timeout=20, what="committed offset 5")
        p.close()
        consumer.close()
        assert values(read_topic(cluster.bootstrap_servers, "ctp-out")) == [b"kept"]
        admin.close()
