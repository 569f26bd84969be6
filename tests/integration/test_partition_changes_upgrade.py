"""A rolling upgrade to partition change records with real brokers: three broker processes and the
local controller over the SQLite store, every broker registered as a broker from before records
(the test hook ``metadata.whole_documents``) until it restarts without the hook's file.

While one is registered so, the controller keeps the gate closed and a failover rewrites the
topic's document, as before. Once the last restarts with this code's registration, the controller
opens the gate and switches the topic (one write of its document); the next failover is a record,
the document is not written again, and nothing acknowledged before, across or after the switch is
lost.
"""

from __future__ import annotations

from pathlib import Path

from sluice.client import Admin, Producer
from sluice.metadata import documents, keys
from sluice.metadata.documents import ControllerDocument, TopicDocument
from sluice.testing import LocalCluster
from tests.support.waiting import wait_for

from .helpers import checked, read_topic, values

CONFIG = {
    "min.insync.replicas": "2",
    "metadata.partition.changes.enable": "true",
    "sluice.test.hooks": "metadata.whole_documents",
}
TOPIC = "upgraded"
PARTITIONS = 3
LAST = 2  # the broker restarted last in the rolling upgrade


def _produce(cluster: LocalCluster, first: int, count: int) -> None:
    producer = Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all", linger_ms=1)
    for f in [producer.send(TOPIC, value=b"v%d" % i, partition=i % PARTITIONS) for i in range(first, first + count)]:
        f.result(timeout=30)
    producer.close()


def _declaration(cluster: LocalCluster) -> tuple[TopicDocument, int]:
    found = documents.read(cluster.metadata, keys.topic(TOPIC), TopicDocument)
    assert found is not None
    return found.value, found.version


def _gate_open(cluster: LocalCluster) -> bool:
    found = documents.read(cluster.metadata, keys.CONTROLLER, ControllerDocument)
    return found is not None and found.value.partition_changes


def _whole_isrs(admin: Admin) -> bool:
    return all(sorted(p.isr) == [0, 1, 2] for p in admin.describe_topic(TOPIC).partitions)


def _fail_over(cluster: LocalCluster, admin: Admin, partition: int) -> int:
    """Kill the leader of ``partition`` and wait until every partition has another."""
    victim = cluster.leader(TOPIC, partition)
    cluster.kill(victim)
    wait_for(
        lambda: all(cluster.leader(TOPIC, p) not in (victim, -1) for p in range(PARTITIONS)),
        timeout=30,
        what=f"every partition led by another broker than {victim}",
    )
    return victim


def test_a_cluster_moves_to_partition_change_records_when_its_last_old_broker_restarts(tmp_path: Path) -> None:
    for b in range(3):  # a cluster of brokers from before records
        (tmp_path / f"broker-{b}").mkdir(parents=True)
        (tmp_path / f"broker-{b}" / "whole-documents").touch()
    with checked(LocalCluster(brokers=3, data_dir=tmp_path, config=CONFIG)) as cluster:
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        admin.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=3)
        _produce(cluster, 0, 90)

        # Before: the gate stays closed, and a failover rewrites the topic's document.
        assert not _gate_open(cluster)
        declared, version = _declaration(cluster)
        assert not declared.states_in_records
        victim = _fail_over(cluster, admin, 0)
        assert _declaration(cluster)[1] > version
        assert cluster.metadata.list(keys.PARTITION_CHANGES) == []
        _produce(cluster, 90, 90)  # acks=all with two replicas in sync
        cluster.restart(victim)
        wait_for(lambda: _whole_isrs(admin), timeout=60, what="every ISR whole again")

        # The rolling upgrade: each broker restarts as this code registers; the gate opens with the
        # last, and the controller switches the topic.
        for b in [b for b in range(3) if b != LAST] + [LAST]:
            (tmp_path / f"broker-{b}" / "whole-documents").unlink()
            cluster.restart(b)
            wait_for(lambda: _whole_isrs(admin), timeout=60, what=f"every ISR whole again after broker {b}")
            if b != LAST:
                assert not _gate_open(cluster) and not _declaration(cluster)[0].states_in_records
        wait_for(lambda: _gate_open(cluster), timeout=30, what="the controller to open the gate")
        wait_for(lambda: _declaration(cluster)[0].states_in_records, timeout=30, what="the topic to switch")
        _produce(cluster, 180, 90)

        # After: a failover is a record, and the topic's document is not written again.
        switched = _declaration(cluster)[1]
        records_before = len(cluster.metadata.list(keys.PARTITION_CHANGES))
        victim = _fail_over(cluster, admin, 1)
        assert len(cluster.metadata.list(keys.PARTITION_CHANGES)) > records_before
        _produce(cluster, 270, 90)
        cluster.restart(victim)
        wait_for(lambda: _whole_isrs(admin), timeout=60, what="every ISR whole again")
        assert _declaration(cluster)[1] == switched

        expected = {b"v%d" % i for i in range(360)}
        got = values(read_topic(cluster.bootstrap_servers, TOPIC))
        assert len(got) == len(expected) and set(got) == expected
        admin.close()
