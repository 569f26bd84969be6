"""Stray-partition detection over a real RocksDB: stored partitions are compared by topic id."""

from __future__ import annotations

from pathlib import Path

from sluice.broker.config import DEFAULTS
from sluice.broker.log.partition import PartitionLog, validate_batch
from sluice.broker.log.storage import RocksStorage
from sluice.broker.log.stray import (
    assigned_partitions,
    delete_partition_keys,
    stored_partitions,
    stray_partitions,
)
from sluice.metadata.documents import PartitionState, TopicDocument
from sluice.records import build_batch

OLD_ID = "11111111111111111111111111111111"
NEW_ID = "22222222-2222-2222-2222-222222222222"  # ids with a UUID's dashes are the same id without


def config(key: str) -> object:
    return {k: d for k, (_t, d) in DEFAULTS.items()}[key]


def fill(storage: RocksStorage, topic_id: str, partition: int) -> PartitionLog:
    log = PartitionLog(storage, "orders", partition, topic_id, config)
    log.become_leader(0)
    batch = build_batch([(None, b"v")])
    validate_batch(batch, 1 << 20)
    log.append(batch, verified_txn=True, leader_epoch=log.leader_epoch)
    return log


def topic(topic_id: str, replicas: list[list[int]]) -> TopicDocument:
    return TopicDocument("orders", topic_id, False, {}, len(replicas[0]), [PartitionState.initial(r) for r in replicas])


def test_a_recreated_topic_s_old_partitions_are_stray_and_its_new_ones_are_not(tmp_path: Path) -> None:
    storage = RocksStorage(str(tmp_path / "db"))
    try:
        for p in range(2):
            fill(storage, OLD_ID, p)
            fill(storage, NEW_ID, p)
        stored = list(stored_partitions(storage))
        assert sorted((s.topic_id, s.partition, s.topic) for s in stored) == [
            (OLD_ID, 0, "orders"), (OLD_ID, 1, "orders"),
            (NEW_ID.replace("-", ""), 0, "orders"), (NEW_ID.replace("-", ""), 1, "orders"),
        ]  # fmt: skip
        # the same name, a new id; broker 1 holds partition 0 of it but not partition 1
        assigned = assigned_partitions([topic(NEW_ID, [[1, 0], [0, 2]])], broker_id=1)
        strays = stray_partitions(stored, assigned)
        assert sorted((s.topic_id, s.partition) for s in strays) == [
            (OLD_ID, 0), (OLD_ID, 1), (NEW_ID.replace("-", ""), 1),
        ]  # fmt: skip
        for s in strays:
            delete_partition_keys(storage, s.prefix)
        left = list(stored_partitions(storage))
        assert [(s.topic_id, s.partition) for s in left] == [(NEW_ID.replace("-", ""), 0)]
        # nothing of a deleted partition is left in any column family
        kept = PartitionLog(storage, "orders", 0, NEW_ID, config)
        assert kept.log_end_offset == 1
        assert list(storage.scan("log", b"", b"\xff" * 30)) == list(
            storage.scan("log", kept.prefix, kept.prefix + b"\xff" * 9)
        )
    finally:
        storage.close()


def test_nothing_is_stray_when_everything_stored_is_assigned(tmp_path: Path) -> None:
    storage = RocksStorage(str(tmp_path / "db"))
    try:
        fill(storage, OLD_ID, 0)
        assert stray_partitions(stored_partitions(storage), assigned_partitions([topic(OLD_ID, [[3]])], 3)) == []
    finally:
        storage.close()


def log_manager(tmp_path: Path, metadata: str, storage: RocksStorage):  # type: ignore[no-untyped-def]
    from sluice.broker.channels import BrokerChannels
    from sluice.broker.cluster import ClusterView
    from sluice.broker.config import BrokerConfig
    from sluice.broker.log.manager import LogManager
    from sluice.broker.replica_manager import ReplicaManager
    from sluice.metadata import open_store

    store = open_store(str(tmp_path / metadata))
    config = BrokerConfig.build(0, "127.0.0.1", 1, str(tmp_path), str(tmp_path / metadata), {})
    cluster = ClusterView(store, config)
    cluster.register()
    cluster.refresh()
    logs = LogManager(storage, cluster, config)
    ReplicaManager(logs, cluster, config, BrokerChannels(cluster))  # it opens the logs of assigned partitions
    return store, cluster, logs


def test_strays_are_deleted_only_while_the_data_directory_belongs_to_the_metadata_s_cluster(tmp_path: Path) -> None:
    storage = RocksStorage(str(tmp_path / "db"))
    try:
        store, cluster, logs = log_manager(tmp_path, "a.sqlite", storage)
        cluster.create_topic("kept", 1, 1, {})
        fill(storage, OLD_ID, 0)  # a partition no metadata knows
        assert logs.delete_stray_partitions() == [f"orders-0 (topic id {OLD_ID})"]
        logs.close()
        store.close()

        # the same data directory, pointed at another cluster's metadata (a fresh file): every
        # partition would look stray; nothing is deleted
        fill(storage, OLD_ID, 1)
        store, cluster, logs = log_manager(tmp_path, "b.sqlite", storage)
        assert logs.delete_stray_partitions() == []
        assert sorted(s.topic for s in stored_partitions(storage)) == ["kept", "orders"]
        logs.close()
        store.close()

        # back on its own cluster's metadata: deleted
        store, cluster, logs = log_manager(tmp_path, "a.sqlite", storage)
        assert logs.delete_stray_partitions() == [f"orders-1 (topic id {OLD_ID})"]
        assert [s.topic for s in stored_partitions(storage)] == ["kept"]
        logs.close()
        store.close()
    finally:
        storage.close()
