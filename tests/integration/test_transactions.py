"""Transactions and read_committed visibility: DESIGN sections 2 and 4, Kafka's rules."""

from __future__ import annotations

import random
import sys
import time

from sluice import errors
from sluice.client import Admin, Producer
from sluice.testing import LocalCluster

from .helpers import read_topic, values


def make_topics(cluster: LocalCluster, *names: str, partitions: int = 1) -> None:
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    for name in names:
        admin.create_topic(name, partitions=partitions, replication_factor=1)
    admin.close()


def txn_producer(cluster: LocalCluster, txn_id: str) -> Producer:
    p = Producer(bootstrap_servers=cluster.bootstrap_servers, transactional_id=txn_id, linger_ms=0)
    p.init_transactions()
    return p


def test_open_transaction_is_invisible_until_commit(cluster: LocalCluster, unique_topic: str) -> None:
    make_topics(cluster, unique_topic)
    p = txn_producer(cluster, f"{unique_topic}-tx")
    p.begin_transaction()
    for i in range(10):
        p.send(unique_topic, value=f"v{i}".encode())
    p.flush()
    assert read_topic(cluster.bootstrap_servers, unique_topic, idle_s=1.0) == []
    assert len(read_topic(cluster.bootstrap_servers, unique_topic, "read_uncommitted", idle_s=1.0)) == 10
    p.commit_transaction()
    assert values(read_topic(cluster.bootstrap_servers, unique_topic)) == [f"v{i}".encode() for i in range(10)]
    p.close()


def test_aborted_transaction_is_never_visible_to_read_committed(cluster: LocalCluster, unique_topic: str) -> None:
    make_topics(cluster, unique_topic)
    p = txn_producer(cluster, f"{unique_topic}-tx")
    p.begin_transaction()
    p.send(unique_topic, value=b"aborted-1")
    p.send(unique_topic, value=b"aborted-2")
    p.flush()  # stored, then aborted (abort_transaction drops what is not sent yet, as Kafka's does)
    p.abort_transaction()
    p.begin_transaction()
    p.send(unique_topic, value=b"kept")
    p.commit_transaction()
    p.close()
    assert values(read_topic(cluster.bootstrap_servers, unique_topic)) == [b"kept"]
    uncommitted = values(read_topic(cluster.bootstrap_servers, unique_topic, "read_uncommitted"))
    assert uncommitted == [b"aborted-1", b"aborted-2", b"kept"]


def test_transaction_over_partitions_and_topics_is_atomic(cluster: LocalCluster, unique_topic: str) -> None:
    a, b = f"{unique_topic}-a", f"{unique_topic}-b"
    make_topics(cluster, a, b, partitions=3)
    p = txn_producer(cluster, f"{unique_topic}-tx")
    p.begin_transaction()
    for i in range(30):
        p.send(a, value=f"a{i}".encode(), partition=i % 3)
        p.send(b, value=f"b{i}".encode(), partition=i % 3)
    p.abort_transaction()
    assert read_topic(cluster.bootstrap_servers, a) == []
    assert read_topic(cluster.bootstrap_servers, b) == []
    p.begin_transaction()
    for i in range(30):
        p.send(a, value=f"a{i}".encode(), partition=i % 3)
        p.send(b, value=f"b{i}".encode(), partition=i % 3)
    p.commit_transaction()
    p.close()
    got_a = read_topic(cluster.bootstrap_servers, a)
    got_b = read_topic(cluster.bootstrap_servers, b)
    assert sorted(values(got_a)) == sorted(f"a{i}".encode() for i in range(30))
    assert sorted(values(got_b)) == sorted(f"b{i}".encode() for i in range(30))
    assert {r[0] for r in got_a} == {0, 1, 2}


def test_plain_write_after_open_transaction_waits_for_its_end(cluster: LocalCluster, unique_topic: str) -> None:
    """read_committed reads in offset order up to the LSO (Kafka's rule)."""
    make_topics(cluster, unique_topic)
    tx = txn_producer(cluster, f"{unique_topic}-tx")
    plain = Producer(bootstrap_servers=cluster.bootstrap_servers, linger_ms=0)
    tx.begin_transaction()
    tx.send(unique_topic, value=b"t1").result(timeout=30)
    plain.send(unique_topic, value=b"p1").result(timeout=30)
    assert read_topic(cluster.bootstrap_servers, unique_topic, idle_s=1.0) == []
    tx.commit_transaction()
    assert values(read_topic(cluster.bootstrap_servers, unique_topic)) == [b"t1", b"p1"]

    tx.begin_transaction()
    tx.send(unique_topic, value=b"t2").result(timeout=30)
    plain.send(unique_topic, value=b"p2").result(timeout=30)
    tx.abort_transaction()
    assert values(read_topic(cluster.bootstrap_servers, unique_topic)) == [b"t1", b"p1", b"p2"]
    tx.close()
    plain.close()


# The "impatient" client profile of issue 30 (short timeouts everywhere).
IMPATIENT = {
    "request_timeout_ms": 2000,
    "delivery_timeout_ms": 6000,
    "max_block_ms": 6000,
    "transaction_timeout_ms": 20000,
}


def test_every_acknowledged_commit_right_after_an_abort_is_fully_readable(
    cluster: LocalCluster, unique_topic: str
) -> None:
    """Abort, then at once begin, send and commit, many times (issue 30).

    The sender could still be failing the aborted transaction's batches when
    the next transaction queued its own: those were dropped without breaking
    the transaction, and its commit returned success with nothing written.
    The application does what the issue's impatient clients do: a commit that
    raises a retriable error is called again (3 attempts), otherwise the
    transaction is aborted, and if that fails the producer is replaced. At the
    end a read_committed consumer must see every value of every acknowledged
    commit exactly once, nothing aborted, and each unknown outcome all or nothing.
    A short GIL switch interval makes the threads interleave often: before
    the fix, 300 transactions lost an acknowledged commit in each of 3 runs.
    """
    make_topics(cluster, unique_topic, partitions=3)
    txn_id = f"{unique_topic}-tx"
    rng = random.Random(30)
    committed: list[bytes] = []
    aborted: list[bytes] = []
    unknown: list[list[bytes]] = []
    recreated = 0

    def new_producer() -> Producer:
        p = Producer(bootstrap_servers=cluster.bootstrap_servers, transactional_id=txn_id, **IMPATIENT)  # type: ignore[arg-type]
        p.init_transactions(timeout=30)
        return p

    def send_batch(p: Producer, n: int, tag: str) -> list[bytes]:
        sent = [f"{tag}-{i}".encode() for i in range(rng.randint(1, 12))]
        for i, v in enumerate(sent):
            p.send(unique_topic, value=v, partition=(n + i) % 3)
        return sent

    def commit(p: Producer, sent: list[bytes]) -> bool:
        """True: acknowledged; False: aborted; raises nothing (unknown outcomes are recorded)."""
        for _attempt in range(3):
            try:
                p.commit_transaction(timeout=5)
                committed.extend(sent)
                return True
            except errors.SluiceError as exc:
                if not exc.retriable:
                    break
        try:
            p.abort_transaction(timeout=5)
            aborted.extend(sent)
        except errors.SluiceError:
            unknown.append(sent)
            raise
        return False

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    p = new_producer()
    try:
        deadline = time.monotonic() + 60
        n = 0
        while n < 600 and time.monotonic() < deadline:
            n += 1
            try:
                p.begin_transaction()
                sent = send_batch(p, n, f"t{n}")
                if rng.random() < 0.3:
                    # abort while its records are queued or in flight, then the next one at once
                    p.abort_transaction(timeout=5)
                    aborted.extend(sent)
                    n += 1
                    p.begin_transaction()
                    sent = send_batch(p, n, f"t{n}")
                commit(p, sent)
            except errors.SluiceError:
                recreated += 1
                p.close(5)
                p = new_producer()
        assert n >= 20, f"only {n} transactions in 60 s"
    finally:
        sys.setswitchinterval(interval)
        p.close(10)

    got = values(read_topic(cluster.bootstrap_servers, unique_topic))
    seen = set(got)
    assert len(got) == len(seen), "a value was read twice"
    lost = [v for v in committed if v not in seen]
    assert not lost, f"{len(lost)} value(s) of acknowledged commits are not readable: {lost[:10]}"
    assert not seen & set(aborted), "an aborted value is visible"
    for values_of_txn in unknown:
        assert len(seen & set(values_of_txn)) in (0, len(values_of_txn)), "a transaction is partly visible"
    assert seen <= set(committed) | {v for u in unknown for v in u}
    print(f"{n} transactions: {len(committed)} values committed, {len(aborted)} aborted, ", end="")
    print(f"{len(unknown)} transactions of unknown outcome, {recreated} producers replaced")
    assert len(committed) > 0 and recreated <= n // 10, (len(committed), recreated)
