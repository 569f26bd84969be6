"""Transactions and read_committed visibility: DESIGN sections 2 and 4, Kafka's rules."""

from __future__ import annotations

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
