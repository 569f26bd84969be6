"""A follower's fetch names its partition's topic id; the leader refuses one for a topic that was
deleted and created again under its name (a real ReplicaManager over RocksDB and SQLite metadata).

Without the id the leader served the new log's bytes at the old log's offsets, and counted the
old log's end offset towards the new log's high watermark: a follower whose fetch was in flight
across a delete and re-create truncated or was counted in sync without the data.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from sluice.api.v1 import interbroker_pb2 as ipb
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.channels import BrokerChannels
from sluice.broker.cluster import ClusterView
from sluice.broker.config import BrokerConfig
from sluice.broker.log.manager import LogManager
from sluice.broker.log.storage import RocksStorage
from sluice.broker.replica_manager import ReplicaManager
from sluice.metadata import documents, keys, open_store
from sluice.metadata.documents import BrokerDocument


def fetch(replicas: ReplicaManager, topic_id: str, offset: int = 0) -> ipb.ReplicaFetchPartitionResponse:
    req = ipb.ReplicaFetchRequest(replica_id=1, max_wait_ms=0, max_bytes=1 << 20)
    req.partitions.add(topic="t", partition=0, fetch_offset=offset, current_leader_epoch=0, last_fetched_epoch=-1,
                       topic_id=topic_id)  # fmt: skip
    raw = asyncio.run(replicas.replica_fetch(req))
    (p,) = ipb.ReplicaFetchResponse.FromString(raw).partitions
    return p


def test_the_leader_refuses_a_fetch_for_the_deleted_topic_of_the_same_name(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "metadata.sqlite"))
    config = BrokerConfig.build(0, "127.0.0.1", 1, str(tmp_path), str(tmp_path / "metadata.sqlite"), {})
    cluster = ClusterView(store, config)
    cluster.register()
    follower = BrokerDocument(1, "127.0.0.1", 2)
    documents.update_document(store, keys.broker(1), BrokerDocument, lambda _v: follower)
    storage = RocksStorage(str(tmp_path / "rocksdb"))
    logs = LogManager(storage, cluster, config)
    replicas = ReplicaManager(logs, cluster, config, BrokerChannels(cluster))
    try:
        cluster.refresh()
        old_id = cluster.create_topic("t", 1, 2, {})
        cluster.delete_topic("t")
        new_id = cluster.create_topic("t", 1, 2, {})
        assert cluster.topics["t"].partitions[0].leader == 0
        assert fetch(replicas, new_id).error_code == pb.NONE
        assert fetch(replicas, "").error_code == pb.NONE  # an older follower that sends no id
        stale = fetch(replicas, old_id, offset=5)  # where the old log ended
        assert stale.error_code == pb.UNKNOWN_TOPIC_OR_PARTITION
        assert "deleted and created again" in stale.error_message
        # the refused fetch did not count as the follower's position
        assert replicas.trackers[("t", 0)].end_offset(1) == 0
    finally:
        logs.close()
        storage.close()
        store.close()
