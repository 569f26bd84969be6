"""A transaction stays unstable until its marker is below the HW (Kafka's unreplicated transactions).

PartitionLog over a real RocksDB, the HW moved by hand as a leader's followers
(or a follower's leader) would move it.
"""

from __future__ import annotations

from pathlib import Path

from sluice.broker.config import DEFAULTS
from sluice.broker.log.partition import PartitionLog, validate_batch
from sluice.broker.log.producer_state import ProducerEntry
from sluice.broker.log.storage import RocksStorage
from sluice.records import RecordBatch, build_batch, control_batch

TOPIC_ID = "fedcba9876543210fedcba9876543210"


def open_log(path: Path) -> tuple[RocksStorage, PartitionLog]:
    values = {k: d for k, (_t, d) in DEFAULTS.items()}
    storage = RocksStorage(str(path / "db"))
    p = PartitionLog(storage, "t", 0, TOPIC_ID, values.__getitem__)
    p.become_leader(0)
    return storage, p


def txn_batch(pid: int, seq: int, n: int = 2) -> RecordBatch:
    batch = build_batch(
        [(None, b"v%d" % i) for i in range(n)], producer_id=pid, producer_epoch=0, base_sequence=seq, transactional=True
    )
    validate_batch(batch, 1 << 20)
    return batch


def test_a_committed_transaction_is_unstable_until_its_marker_is_below_the_hw(tmp_path: Path) -> None:
    storage, p = open_log(tmp_path)
    p.append(txn_batch(7, 0), verified_txn=True, leader_epoch=p.leader_epoch)  # offsets 0-1
    p.append(txn_batch(7, 2), verified_txn=True, leader_epoch=p.leader_epoch)  # offsets 2-3
    p.high_watermark = 4  # the data is on every in-sync replica
    assert p.last_stable_offset == 0
    assert p.write_marker(7, 0, True, 0, leader_epoch=p.leader_epoch) == 4
    assert p.open_txns == {}
    # the marker is only on this replica: the transaction is still unstable
    assert p.first_unstable_offset == 0
    assert p.last_stable_offset == 0
    assert p.read(0, 1 << 20, True).batches == []
    p.high_watermark = 5  # the marker reached the ISR
    assert p.first_unstable_offset is None
    assert p.last_stable_offset == 5
    assert [b.base_offset for b in p.read(0, 1 << 20, True).batches] == [0, 2]
    storage.close()


def test_aborted_transactions_wait_for_their_marker_too_and_the_earliest_first_offset_wins(tmp_path: Path) -> None:
    storage, p = open_log(tmp_path)
    p.append(txn_batch(7, 0), verified_txn=True, leader_epoch=p.leader_epoch)  # 0-1, producer 7
    p.append(txn_batch(8, 0), verified_txn=True, leader_epoch=p.leader_epoch)  # 2-3, producer 8
    p.high_watermark = 4
    p.write_marker(8, 0, False, 0, leader_epoch=p.leader_epoch)  # 4: abort of 8
    p.write_marker(7, 0, True, 0, leader_epoch=p.leader_epoch)  # 5: commit of 7
    assert [(m, f) for m, f, _pid in p.unreplicated_txns] == [(4, 2), (5, 0)]
    assert p.last_stable_offset == 0
    p.high_watermark = 5  # 8's abort replicated, 7's commit not yet
    assert [(m, f) for m, f, _pid in p.unreplicated_txns] == [(5, 0)]
    assert p.last_stable_offset == 0
    p.high_watermark = 6
    assert p.last_stable_offset == 6
    storage.close()


def test_a_follower_keeps_the_rule_for_markers_it_copied(tmp_path: Path) -> None:
    storage, p = open_log(tmp_path)
    data = txn_batch(7, 0)
    data.base_offset = 0
    p.append_replica(data)
    p.high_watermark = 2
    marker = control_batch(7, 0, True, 0)
    marker.base_offset = 2
    p.append_replica(marker)
    # elected now, before the leader told it the HW passed the marker: still unstable
    assert p.last_stable_offset == 0
    p.high_watermark = 3
    assert p.last_stable_offset == 3
    storage.close()


def test_the_unreplicated_set_is_rebuilt_after_a_restart_from_the_hw_checkpoint(tmp_path: Path) -> None:
    storage, p = open_log(tmp_path)
    p.append(txn_batch(7, 0), verified_txn=True, leader_epoch=p.leader_epoch)  # 0-1
    p.high_watermark = 2
    p.write_marker(7, 0, True, 0, leader_epoch=p.leader_epoch)  # 2
    p.append(txn_batch(7, 2), verified_txn=True, leader_epoch=p.leader_epoch)  # 3-4: the next transaction of 7
    p.high_watermark = 5
    p.write_marker(7, 0, True, 0, leader_epoch=p.leader_epoch)  # 5
    p.checkpoint_high_watermark()  # HW 5: the first marker is below it, the second is not
    storage.close()
    storage, p = open_log(tmp_path)
    assert p.high_watermark == 5
    assert [(m, f) for m, f, _pid in p.unreplicated_txns] == [(5, 3)]
    assert p.last_stable_offset == 3
    p.high_watermark = 6
    assert p.last_stable_offset == 6
    storage.close()


def test_truncation_rebuilds_the_set_from_what_is_left(tmp_path: Path) -> None:
    storage, p = open_log(tmp_path)
    p.append(txn_batch(7, 0), verified_txn=True, leader_epoch=p.leader_epoch)  # 0-1
    p.high_watermark = 2
    p.write_marker(7, 0, True, 0, leader_epoch=p.leader_epoch)  # 2
    assert p.last_stable_offset == 0
    p.truncate_to(2)  # the marker was not on the new leader: the transaction is open again
    assert p.open_txns == {7: 0}
    assert p.unreplicated_txns == []
    assert p.last_stable_offset == 0
    storage.close()


def test_producer_entries_written_before_completed_transactions_were_kept_still_decode() -> None:
    entry = ProducerEntry(5, 1)
    entry.appended(1, 0, 3, 10, 1000, True)
    old_format = entry.encode()  # no completed transactions: the old encoding exactly
    assert ProducerEntry.decode(5, old_format) == entry
    entry.completed = [(10, 13), (20, 22)]
    again = ProducerEntry.decode(5, entry.encode())
    assert again.completed == [(10, 13), (20, 22)]
    assert list(again.batches) == list(entry.batches)
