"""Prepared transactions against real brokers: two-phase commit with an external coordinator.

The producer that prepares is a separate process killed with SIGKILL after it
printed its handle, so nothing of it survives but what the coordinator logged;
the transaction timeout then passes, and another client ends the transaction
with the handle alone.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sluice import errors
from sluice.cli import main as cli_main
from sluice.client import Admin, PreparedTransaction, Producer
from sluice.testing import LocalCluster
from tests.support.waiting import wait_for

from .helpers import read_topic, values

FAST_ABORT = {
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "200",
    "transaction.max.timeout.ms": "60000",
}
TIMEOUT_MS = 1000

PREPARER = f"""
import json, sys, time
from sluice.client import Producer
bootstrap, tid, topic, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
p = Producer(bootstrap_servers=bootstrap, transactional_id=tid, transaction_timeout_ms={TIMEOUT_MS})
p.init_transactions()
p.begin_transaction()
for i in range(n):
    p.send(topic, value=(tid + "-" + str(i)).encode(), partition=i % 2)
h = p.prepare_transaction()
print(json.dumps([h.transactional_id, h.producer_id, h.producer_epoch]), flush=True)
time.sleep(600)
"""


def prepare_in_a_process_and_kill_it(bootstrap: str, tid: str, topic: str, n: int) -> PreparedTransaction:
    proc = subprocess.Popen(
        [sys.executable, "-c", PREPARER, bootstrap, tid, topic, str(n)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the process stays alive (sleeping) until killed
        if not line:
            raise AssertionError(f"the preparing producer died: {proc.stderr.read() if proc.stderr else ''}")
        tid_out, pid, epoch = json.loads(line)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    return PreparedTransaction(tid_out, pid, epoch)


def state_of(admin: Admin, tid: str) -> str:
    (d,) = admin.describe_transactions([tid])
    return d.state


def wait_state(admin: Admin, tid: str, state: str) -> None:
    wait_for(lambda: state_of(admin, tid) == state, timeout=30, what=f"{tid} to reach {state}")


def expected(tid: str, n: int) -> list[bytes]:
    return sorted(f"{tid}-{i}".encode() for i in range(n))


def committed_values(bootstrap: str, topic: str) -> list[bytes]:
    return sorted(v for v in values(read_topic(bootstrap, topic)) if v is not None)


@pytest.fixture
def prepared_cluster(tmp_path: Path) -> Callable[..., LocalCluster]:
    made: list[LocalCluster] = []

    def make(brokers: int = 1) -> LocalCluster:
        c = LocalCluster(
            brokers=brokers, data_dir=tmp_path / f"c{len(made)}", config=FAST_ABORT, failure_timeout_ms=1000
        )
        made.append(c)
        return c.start()

    yield make  # type: ignore[misc]
    for c in made:
        c.close()


def test_prepared_outlives_its_producer_and_the_timeout_then_another_client_commits(
    prepared_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = prepared_cluster()
    bootstrap = cluster.bootstrap_servers
    admin = Admin(bootstrap_servers=bootstrap)
    admin.create_topic("orders", partitions=2, replication_factor=1)
    handle = prepare_in_a_process_and_kill_it(bootstrap, "tx-commit", "orders", 20)
    time.sleep(3 * TIMEOUT_MS / 1000)  # the timeout scan runs every 200 ms
    assert state_of(admin, "tx-commit") == "Prepared"
    assert [t.handle for t in admin.list_prepared_transactions()] == [handle]
    assert committed_values(bootstrap, "orders") == []
    assert len(read_topic(bootstrap, "orders", "read_uncommitted")) == 20
    # Wrong handles fail with Kafka's errors and change nothing.
    older = PreparedTransaction(handle.transactional_id, handle.producer_id, handle.producer_epoch - 1)
    with pytest.raises(errors.ProducerFencedError):
        admin.commit_prepared_transaction(older)
    with pytest.raises(errors.InvalidProducerEpochError):
        admin.commit_prepared_transaction(
            PreparedTransaction(handle.transactional_id, handle.producer_id, handle.producer_epoch + 1)
        )
    with pytest.raises(errors.TransactionalIdNotFoundError):
        admin.commit_prepared_transaction(PreparedTransaction("no-such-id", handle.producer_id, 0))
    assert state_of(admin, "tx-commit") == "Prepared"

    admin.commit_prepared_transaction(handle)
    admin.commit_prepared_transaction(handle)  # a retried commit is fine
    wait_state(admin, "tx-commit", "CompleteCommit")
    assert committed_values(bootstrap, "orders") == expected("tx-commit", 20)
    with pytest.raises(errors.InvalidTxnStateError):
        admin.abort_prepared_transaction(handle)
    assert admin.list_prepared_transactions() == []
    admin.close()


def test_an_aborted_prepared_transaction_is_never_visible(prepared_cluster: Callable[..., LocalCluster]) -> None:
    cluster = prepared_cluster()
    bootstrap = cluster.bootstrap_servers
    admin = Admin(bootstrap_servers=bootstrap)
    admin.create_topic("orders", partitions=2, replication_factor=1)
    handle = prepare_in_a_process_and_kill_it(bootstrap, "tx-abort", "orders", 10)
    # While it is prepared it holds the LSO: a later committed write is not visible yet.
    with Producer(bootstrap_servers=bootstrap, transactional_id="after") as later:
        later.init_transactions()
        later.begin_transaction()
        for i in range(4):
            later.send("orders", value=f"after-{i}".encode(), partition=i % 2)
        later.commit_transaction()
    assert committed_values(bootstrap, "orders") == []
    admin.abort_prepared_transaction(handle)
    wait_state(admin, "tx-abort", "CompleteAbort")
    assert committed_values(bootstrap, "orders") == expected("after", 4)
    with pytest.raises(errors.InvalidTxnStateError):
        admin.commit_prepared_transaction(handle)
    admin.close()


def test_init_keeps_or_aborts_a_prepared_transaction_only_when_told(
    prepared_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = prepared_cluster()
    bootstrap = cluster.bootstrap_servers
    admin = Admin(bootstrap_servers=bootstrap)
    admin.create_topic("orders", partitions=2, replication_factor=1)
    handle = prepare_in_a_process_and_kill_it(bootstrap, "tx-init", "orders", 6)
    plain = Producer(bootstrap_servers=bootstrap, transactional_id="tx-init")
    with pytest.raises(errors.InvalidTxnStateError, match="prepared transaction"):
        plain.init_transactions()
    plain.close()
    assert state_of(admin, "tx-init") == "Prepared"
    # keep: the producer holds the prepared transaction and commits it itself.
    keeper = Producer(bootstrap_servers=bootstrap, transactional_id="tx-init")
    assert keeper.init_transactions(keep_prepared_txn=True) == handle
    assert keeper.previous_transaction_state == "Prepared"
    with pytest.raises(errors.IllegalStateError):
        keeper.send("orders", value=b"no")
    keeper.commit_transaction()
    keeper.close()
    wait_state(admin, "tx-init", "CompleteCommit")
    assert committed_values(bootstrap, "orders") == expected("tx-init", 6)
    # abort: a second prepared transaction is rolled back by the next instance.
    second = prepare_in_a_process_and_kill_it(bootstrap, "tx-init", "orders", 3)
    assert second.producer_epoch > handle.producer_epoch
    aborter = Producer(bootstrap_servers=bootstrap, transactional_id="tx-init")
    assert aborter.init_transactions(abort_prepared_txn=True) is None
    aborter.begin_transaction()
    aborter.send("orders", value=b"fresh", partition=0)
    aborter.commit_transaction()
    aborter.close()
    assert committed_values(bootstrap, "orders") == sorted([*expected("tx-init", 6), b"fresh"])
    with pytest.raises(errors.ProducerFencedError):
        admin.commit_prepared_transaction(second)
    admin.close()


def test_the_cli_lists_and_commits_prepared_transactions(
    prepared_cluster: Callable[..., LocalCluster], capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = prepared_cluster()
    bootstrap = cluster.bootstrap_servers
    admin = Admin(bootstrap_servers=bootstrap)
    admin.create_topic("orders", partitions=2, replication_factor=1)
    handle = prepare_in_a_process_and_kill_it(bootstrap, "tx-cli", "orders", 4)
    capsys.readouterr()
    assert cli_main(["transactions", "list", "--prepared", "--bootstrap-server", bootstrap]) == 0
    out = capsys.readouterr().out
    assert "tx-cli" in out and str(handle.producer_id) in out and "Prepared" in out
    args = ["--producer-id", str(handle.producer_id), "--producer-epoch", str(handle.producer_epoch)]
    assert cli_main(["transactions", "commit", "tx-cli", *args, "--bootstrap-server", bootstrap]) == 0
    assert "committed" in capsys.readouterr().out
    wait_state(admin, "tx-cli", "CompleteCommit")
    assert cli_main(["transactions", "abort", "tx-cli", *args, "--bootstrap-server", bootstrap]) == 1
    assert "INVALID_TXN_STATE" in capsys.readouterr().err
    assert committed_values(bootstrap, "orders") == expected("tx-cli", 4)
    admin.close()


def test_a_prepared_transaction_survives_a_restart_of_its_coordinator(
    prepared_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = prepared_cluster()
    bootstrap = cluster.bootstrap_servers
    admin = Admin(bootstrap_servers=bootstrap)
    admin.create_topic("orders", partitions=2, replication_factor=1)
    handle = prepare_in_a_process_and_kill_it(bootstrap, "tx-restart", "orders", 8)
    admin.close()
    cluster.kill(0)  # a crash: only what was logged survives
    cluster.restart(0)
    admin = Admin(bootstrap_servers=bootstrap)
    time.sleep(2 * TIMEOUT_MS / 1000)
    assert state_of(admin, "tx-restart") == "Prepared"
    admin.commit_prepared_transaction(handle)
    wait_state(admin, "tx-restart", "CompleteCommit")
    assert committed_values(bootstrap, "orders") == expected("tx-restart", 8)
    admin.close()


def test_a_prepared_transaction_survives_the_failover_of_its_coordinator(
    prepared_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = prepared_cluster(brokers=3)
    bootstrap = cluster.bootstrap_servers
    admin = Admin(bootstrap_servers=bootstrap)
    admin.create_topic("orders", partitions=2, replication_factor=3)
    handle = prepare_in_a_process_and_kill_it(bootstrap, "tx-failover", "orders", 8)
    (before,) = admin.describe_transactions(["tx-failover"])
    assert before.state == "Prepared"
    cluster.kill(before.coordinator_id)
    admin.close()
    admin = Admin(bootstrap_servers=bootstrap)

    def moved() -> bool:
        try:
            (now,) = admin.describe_transactions(["tx-failover"], timeout=5)
        except errors.SluiceError:
            return False
        return now.coordinator_id != before.coordinator_id and now.state == "Prepared"

    wait_for(moved, timeout=60, what="another broker to coordinate tx-failover")
    admin.commit_prepared_transaction(handle, timeout=60)
    wait_state(admin, "tx-failover", "CompleteCommit")
    assert committed_values(bootstrap, "orders") == expected("tx-failover", 8)
    admin.close()
