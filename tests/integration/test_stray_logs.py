"""Data of deleted topics never stays behind (issue 13, section 3): stray partitions, by topic id.

Three real brokers, replication factor 3. Broker 2 is stopped; meanwhile one topic is deleted
and another is deleted and created again under the same name (a new topic id). When broker 2
comes back it deletes every partition the metadata no longer assigns to it, compared by topic
id, so the re-created topic's new data is not confused with the old. The test reads broker 2's
RocksDB itself (the broker stopped) before and after: the old topic ids' keys are there before
and gone after, the new topic's records are all there, and the old records' bytes are in no file
of its data directory any more. Every wait is bounded.
"""

from __future__ import annotations

import os
from pathlib import Path

from sluice.broker.log.partition import partition_prefix
from sluice.broker.log.storage import RocksStorage
from sluice.broker.log.stray import PARTITION_COLUMN_FAMILIES, stored_partitions
from sluice.client import Admin, Producer
from sluice.records import RecordBatch, decode_records
from sluice.testing import LocalCluster
from tests.support.waiting import wait_for

CONFIG = {"min.insync.replicas": "2", "replica.lag.time.max.ms": "3000"}
OLD_TOKEN = b"OLD-DATA-OF-A-DELETED-TOPIC-9c41e7"
RECORDS = 60


def value_with(token: bytes, i: int) -> bytes:
    # random bytes around the token: incompressible, so the token stays verbatim in compressed SST blocks
    return os.urandom(200) + token + b"%06d" % i + os.urandom(200)


def produce(bootstrap: str, topic: str, token: bytes) -> list[bytes]:
    producer = Producer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    sent = [value_with(token, i) for i in range(RECORDS)]
    for i, v in enumerate(sent):
        producer.send(topic, value=v, partition=i % 2)
    producer.flush(timeout=60)
    producer.close()
    return sent


def topic_id(cluster: LocalCluster, topic: str) -> str:
    doc = cluster.topic_document(topic)
    assert doc is not None, f"no topic {topic}"
    return str(doc["topic_id"])


def keys_of(storage: RocksStorage, tid: str, partitions: int = 2) -> int:
    """How many keys of topic id ``tid`` (any of its partitions) are in any column family."""
    found = 0
    for p in range(partitions):
        prefix = partition_prefix(tid, p)
        for cf in PARTITION_COLUMN_FAMILIES:
            found += sum(1 for _ in storage.scan(cf, prefix, prefix + b"\xff" * 9))
    return found


def values_of(storage: RocksStorage, tid: str, partitions: int = 2) -> list[bytes]:
    out: list[bytes] = []
    for p in range(partitions):
        prefix = partition_prefix(tid, p)
        for _key, raw in storage.scan("log", prefix, prefix + b"\xff" * 9):
            batch = RecordBatch.FromString(raw)
            if not batch.control:
                out.extend(r.value for r in decode_records(batch) if r.value is not None)
    return out


def files_holding(directory: Path, needle: bytes) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.is_file() and needle in p.read_bytes())


def test_a_broker_down_during_delete_and_recreate_drops_the_old_data_and_keeps_the_new(tmp_path: Path) -> None:
    with LocalCluster(brokers=3, data_dir=tmp_path, config=CONFIG, failure_timeout_ms=1000) as cluster:
        bootstrap = cluster.bootstrap_servers
        admin = Admin(bootstrap_servers=bootstrap)
        for name in ("reborn", "gone"):
            admin.create_topic(name, partitions=2, replication_factor=3)
        produce(bootstrap, "reborn", OLD_TOKEN)
        produce(bootstrap, "gone", OLD_TOKEN)
        old_reborn, gone = topic_id(cluster, "reborn"), topic_id(cluster, "gone")
        # every acks=all write is on every ISR member; make sure broker 2 is one of them
        for name in ("reborn", "gone"):
            for p in range(2):
                assert 2 in cluster.partition_state(name, p)["isr"]

        assert cluster.stop(2, timeout=30) == 0
        admin.delete_topic("gone")
        admin.delete_topic("reborn")
        wait_for(lambda: cluster.topic_document("reborn") is None, timeout=20, what="the delete")
        admin.create_topic("reborn", partitions=2, replication_factor=3)
        new_reborn = topic_id(cluster, "reborn")
        assert new_reborn != old_reborn
        new_values = produce(bootstrap, "reborn", b"NEW-DATA-OF-THE-RECREATED-TOPIC")

        rocks = cluster.broker(2).data_path / "rocksdb"
        # before: the stopped broker still holds both old topics (the test can see what it checks)
        storage = RocksStorage(str(rocks))
        try:
            assert keys_of(storage, old_reborn) > 0 and keys_of(storage, gone) > 0
            assert keys_of(storage, new_reborn) == 0
        finally:
            storage.close()
        assert files_holding(rocks, OLD_TOKEN), "the old records' bytes should be on disk before the restart"

        cluster.restart(2, timeout=60)
        for p in range(2):
            wait_for(
                lambda p=p: 2 in cluster.partition_state("reborn", p)["isr"],  # type: ignore[misc]
                timeout=60,
                what=f"broker 2 back in the ISR of reborn-{p}",
            )
        log = cluster.broker(2).log_path.read_text()
        for name, tid in (("reborn", old_reborn), ("gone", gone)):
            for p in range(2):
                assert f"stray partition {name}-{p} (topic id {tid}): the metadata does not assign it" in log

        assert cluster.stop(2, timeout=30) == 0
        storage = RocksStorage(str(rocks))
        try:
            assert keys_of(storage, old_reborn) == 0, "keys of the deleted topic stayed behind"
            assert keys_of(storage, gone) == 0, "keys of the deleted topic stayed behind"
            stored_ids = {s.topic_id for s in stored_partitions(storage)}
            assert old_reborn not in stored_ids and gone not in stored_ids
            got = values_of(storage, new_reborn)
            common = len(set(got) & set(new_values))
            assert sorted(got) == sorted(new_values), f"new topic: {len(got)} of {len(new_values)}, {common} in common"
        finally:
            storage.close()
        assert files_holding(rocks, OLD_TOKEN) == [], "the old records' bytes are still on disk"

        # and the cluster still serves the new topic from broker 2 once it is back
        cluster.restart(2, timeout=60)
        admin.close()
