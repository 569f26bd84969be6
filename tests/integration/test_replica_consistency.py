"""The replica consistency check catches what it exists for (issue 30): a check that can only pass proves nothing.

Two real stored logs (PartitionLog on RocksDB, as a broker writes them) are made to differ the
way issue 30's deposed leader made them differ, read back through the broker's dump tool (the
subprocess path a cluster check takes) and compared: same offset and leader epoch with different
batches; an in-sync replica missing a batch below the HW. Identical logs compare clean. Then a
real 3-broker cluster after a leader kill must pass ``cluster.check_replica_consistency()``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sluice.broker.config import DEFAULTS
from sluice.broker.log.partition import PartitionLog
from sluice.broker.log.storage import RocksStorage
from sluice.client import Admin, Producer
from sluice.records import build_batch
from sluice.testing import LocalCluster
from sluice.testing import replicas as replica_check

TOPIC_ID = "00112233445566778899aabbccddeeff"


def stored_log(path: Path, values: list[list[bytes]], epochs: list[int]) -> Path:
    """A RocksDB holding one partition ``q-0``: one batch per entry of ``values``, each at its leader epoch."""
    config = {k: d for k, (_t, d) in DEFAULTS.items()}
    storage = RocksStorage(str(path))
    log = PartitionLog(storage, "q", 0, TOPIC_ID, config.__getitem__)
    for batch_values, epoch in zip(values, epochs, strict=True):
        if not log.leading or epoch != log.leader_epoch:
            log.become_leader(epoch)  # each log believes it leads: how a deposed leader wrote in issue 30
        log.append(build_batch([(None, v, None, 10**12) for v in batch_values]), leader_epoch=epoch)
        log.high_watermark = log.log_end_offset
    log.checkpoint_high_watermark()
    storage.close()
    return path


def read(broker: int, path: Path) -> list[replica_check.ReplicaLog]:
    return replica_check.read_replica_logs(sys.executable, broker, path)


def test_identical_replicas_compare_clean(tmp_path: Path) -> None:
    a = read(0, stored_log(tmp_path / "a", [[b"x"], [b"y", b"z"]], [0, 1]))
    b = read(1, stored_log(tmp_path / "b", [[b"x"], [b"y", b"z"]], [0, 1]))
    assert [log.log_end_offset for log in a + b] == [3, 3]
    assert replica_check.compare(a + b, {("q", 0): [0, 1]}) == []


def test_a_different_batch_in_the_same_epoch_is_found(tmp_path: Path) -> None:
    """Issue 30's shape: at offset 1, epoch 1, one replica holds another producer's batch."""
    a = read(0, stored_log(tmp_path / "a", [[b"x"], [b"p0-364", b"p0-366"]], [0, 1]))
    b = read(2, stored_log(tmp_path / "b", [[b"x"], [b"p2-427", b"p2-429"]], [0, 1]))
    # not in the ISR either: rule 1 holds anywhere in the log
    found = replica_check.compare(a + b, {("q", 0): [0]})
    assert found and "q-0 offset 1 leader epoch 1: brokers 0 and 2" in found[0], found
    assert "records_sha256" in found[0]
    # in the ISR, below the HW: rule 2 names it too
    found = replica_check.compare(a + b, {("q", 0): [0, 2]}, {("q", 0): 3}, {("q", 0): 0})
    assert any("below the HW 3" in f for f in found), found
    with pytest.raises(replica_check.ReplicaDivergence, match="offset 1 leader epoch 1"):
        raise replica_check.ReplicaDivergence(found)


def test_an_in_sync_replica_missing_a_batch_below_the_hw_is_found(tmp_path: Path) -> None:
    a = read(0, stored_log(tmp_path / "a", [[b"x"], [b"y"], [b"z"]], [0, 0, 0]))
    b = read(1, stored_log(tmp_path / "b", [[b"x"], [b"y"]], [0, 0]))
    found = replica_check.compare(a + b, {("q", 0): [0, 1]}, {("q", 0): 3}, {("q", 0): 0})
    assert any("offset 2 (below the HW 3)" in f and "broker 1 has no batch" in f for f in found), found
    assert any("ends at 2, below the HW 3" in f for f in found), found
    # out of the ISR a shorter log is fine; so is a batch compacted away on one replica of a compacted topic
    assert replica_check.compare(a + b, {("q", 0): [0]}, {("q", 0): 3}) == []
    compacted = replica_check.compare(a + b, {("q", 0): [0, 1]}, {("q", 0): 3}, compacted=frozenset({"q"}))
    assert compacted == ["q-0: in-sync broker 1 ends at 2, below the HW 3"], compacted


def test_a_live_cluster_after_a_leader_kill_is_consistent(tmp_path: Path) -> None:
    with LocalCluster(brokers=3, data_dir=tmp_path, failure_timeout_ms=1500) as cluster:
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        admin.create_topic("rc", partitions=2, replication_factor=3)
        admin.close()
        producer = Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all", linger_ms=0)
        for i in range(20):
            producer.send("rc", value=b"v%d" % i, partition=i % 2).result(timeout=30)
        old = cluster.partition_state("rc", 0)
        leader = old["leader"]
        cluster.kill(leader)
        cluster.wait_for_leader_change("rc", 0, after_epoch=old["leader_epoch"], timeout=30)
        for i in range(20, 40):
            producer.send("rc", value=b"v%d" % i, partition=i % 2).result(timeout=60)
        cluster.restart(leader, timeout=90)
        producer.close()
        for p in range(2):
            cluster.wait_for_partition("rc", p, lambda s: len(s["isr"]) == 3, timeout=60, what="a full ISR")
        compared = cluster.check_replica_consistency()
        assert compared >= 3 * 40  # every broker's batches of "rc" (and the internal topics')
