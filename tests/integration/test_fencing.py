"""Zombie fencing by transactional.id: DESIGN section 4."""

from __future__ import annotations

import pytest

from sluice import errors
from sluice.client import Admin, Consumer, Producer, TopicPartition
from sluice.testing import LocalCluster

from .helpers import read_topic, values


def test_second_producer_fences_the_first_and_aborts_its_transaction(cluster: LocalCluster, unique_topic: str) -> None:
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    admin.create_topic(unique_topic, partitions=1, replication_factor=1)
    admin.close()
    txn_id = f"{unique_topic}-tx"
    zombie = Producer(bootstrap_servers=cluster.bootstrap_servers, transactional_id=txn_id, linger_ms=0)
    zombie.init_transactions()
    zombie.begin_transaction()
    zombie.send(unique_topic, value=b"from-zombie").result(timeout=30)

    successor = Producer(bootstrap_servers=cluster.bootstrap_servers, transactional_id=txn_id, linger_ms=0)
    successor.init_transactions()  # bumps the epoch and aborts the zombie's open transaction

    with pytest.raises(errors.ProducerFencedError):
        zombie.send(unique_topic, value=b"late").result(timeout=30)
    with pytest.raises(errors.ProducerFencedError):
        zombie.send_offsets_to_transaction({TopicPartition(unique_topic, 0): 1}, _group_metadata(cluster))
    with pytest.raises(errors.ProducerFencedError):
        zombie.commit_transaction()
    zombie.close()

    successor.begin_transaction()
    successor.send(unique_topic, value=b"from-successor")
    successor.commit_transaction()
    successor.close()
    assert values(read_topic(cluster.bootstrap_servers, unique_topic)) == [b"from-successor"]


def _group_metadata(cluster: LocalCluster) -> object:
    consumer = Consumer(bootstrap_servers=cluster.bootstrap_servers, group_id="fencing-group")
    meta = consumer.group_metadata()
    consumer.close()
    return meta


def test_new_instance_after_clean_close_starts_cleanly(cluster: LocalCluster, unique_topic: str) -> None:
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    admin.create_topic(unique_topic, partitions=1, replication_factor=1)
    admin.close()
    txn_id = f"{unique_topic}-tx"
    for round_ in range(3):
        p = Producer(bootstrap_servers=cluster.bootstrap_servers, transactional_id=txn_id, linger_ms=0)
        p.init_transactions()
        p.begin_transaction()
        p.send(unique_topic, value=f"round-{round_}".encode())
        p.commit_transaction()
        p.close()
    assert values(read_topic(cluster.bootstrap_servers, unique_topic)) == [b"round-0", b"round-1", b"round-2"]


def test_init_transactions_twice_is_a_state_error(cluster: LocalCluster, unique_topic: str) -> None:
    p = Producer(bootstrap_servers=cluster.bootstrap_servers, transactional_id=f"{unique_topic}-tx")
    p.init_transactions()
    with pytest.raises(errors.IllegalStateError):
        p.init_transactions()
    p.close()
