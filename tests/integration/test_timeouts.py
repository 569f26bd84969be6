"""Transaction timeouts: the coordinator aborts what a producer left open, and fences it."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice import errors
from sluice.client import Admin, Producer
from sluice.testing import LocalCluster

from .helpers import read_topic, wait_for

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
