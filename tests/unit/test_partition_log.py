"""PartitionLog over a real RocksDB: offsets, idempotence, transactions, retention, reload."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sluice.api.v1 import records_pb2 as pb
from sluice.broker.config import DEFAULTS
from sluice.broker.log.partition import PartitionLog, validate_batch
from sluice.broker.log.storage import RocksStorage, WriteSet
from sluice.errors import SluiceError
from sluice.records import build_batch, decode_records

TOPIC_ID = "0123456789abcdef0123456789abcdef"


def config(overrides: dict[str, object] | None = None):  # type: ignore[no-untyped-def]
    values = {k: d for k, (_t, d) in DEFAULTS.items()} | (overrides or {})
    return values.__getitem__


@pytest.fixture
def storage(tmp_path: Path):  # type: ignore[no-untyped-def]
    s = RocksStorage(str(tmp_path / "db"))
    yield s
    s.close()


def part(storage: RocksStorage, **overrides: object) -> PartitionLog:
    p = PartitionLog(storage, "t", 0, TOPIC_ID, config(overrides))
    p.become_leader(0)
    p.high_watermark = p.log_end_offset
    return p


def append(p: PartitionLog, n: int = 1, **header: int | bool) -> int:
    batch = build_batch([(None, f"v{i}".encode()) for i in range(n)], **header)
    validate_batch(batch, 1 << 20)
    offset, _dup = p.append(batch, verified_txn=True, leader_epoch=p.leader_epoch)
    p.high_watermark = p.log_end_offset
    return offset


def test_offsets_are_assigned_in_order_and_survive_reopen(tmp_path: Path) -> None:
    s = RocksStorage(str(tmp_path / "db"))
    p = part(s)
    assert [append(p, 3), append(p, 2)] == [0, 3]
    s.close()
    s = RocksStorage(str(tmp_path / "db"))
    p = part(s)
    assert p.log_end_offset == 5
    values = [r.value for b in p.read(0, 1 << 20, False).batches for r in decode_records(b)]
    assert values == [b"v0", b"v1", b"v2", b"v0", b"v1"]
    s.close()


def test_retried_batch_is_stored_once_with_original_offset(storage: RocksStorage) -> None:
    p = part(storage)
    first = build_batch([(None, b"a")], producer_id=9, producer_epoch=0, base_sequence=0)
    assert p.append(first, leader_epoch=p.leader_epoch) == (0, False)
    append(p, 1)
    retry = build_batch([(None, b"a")], producer_id=9, producer_epoch=0, base_sequence=0)
    assert p.append(retry, leader_epoch=p.leader_epoch) == (0, True)
    assert p.log_end_offset == 2


def test_corrupt_and_oversize_batches_are_refused() -> None:
    batch = build_batch([(None, b"x" * 100)])
    batch.records = batch.records[:-1] + b"y"
    with pytest.raises(SluiceError) as err:
        validate_batch(batch, 1 << 20)
    assert err.value.code == pb.CORRUPT_MESSAGE
    with pytest.raises(SluiceError) as err:
        validate_batch(build_batch([(None, b"x" * 2000)]), 1000)
    assert err.value.code == pb.MESSAGE_TOO_LARGE


def test_read_committed_stops_at_lso_and_skips_aborted(storage: RocksStorage) -> None:
    p = part(storage)
    append(p, 1, producer_id=5, producer_epoch=0, base_sequence=0, transactional=True)  # offset 0
    append(p, 1)  # plain write after the open transaction: offset 1
    assert p.last_stable_offset == 0
    assert p.read(0, 1 << 20, True).batches == []
    assert len(p.read(0, 1 << 20, False).batches) == 2
    assert p.write_marker(5, 0, False, 0, leader_epoch=p.leader_epoch) == 2  # abort
    p.high_watermark = p.log_end_offset
    committed = p.read(0, 1 << 20, True)
    assert [b.base_offset for b in committed.batches] == [1]
    assert committed.next_fetch_offset == 3
    uncommitted = p.read(0, 1 << 20, False)
    assert uncommitted.aborted == [(5, 0)]


def test_marker_without_open_transaction_writes_nothing(storage: RocksStorage) -> None:
    p = part(storage)
    append(p, 1, producer_id=5, producer_epoch=0, base_sequence=0, transactional=True)
    assert p.write_marker(5, 0, True, 0, leader_epoch=p.leader_epoch) == 1
    assert p.write_marker(5, 0, True, 0, leader_epoch=p.leader_epoch) is None  # a coordinator re-sending after failover
    assert p.log_end_offset == 2


def test_an_append_admitted_at_an_epoch_this_replica_no_longer_leads_writes_nothing(storage: RocksStorage) -> None:
    """Issue 30: a request admitted at epoch 0 that waited while leadership moved must not be stamped
    with the new epoch. Refused as follower, and as leader again at a later epoch; markers alike."""
    p = part(storage)
    append(p, 1, producer_id=5, producer_epoch=0, base_sequence=0, transactional=True)  # offset 0
    admitted = p.leader_epoch
    late = build_batch([(None, b"late")], producer_id=6, producer_epoch=0, base_sequence=0, transactional=True)
    p.become_follower(1)  # another broker leads at epoch 1
    for attempt in range(2):
        with pytest.raises(SluiceError) as refused:
            p.append(late, leader_epoch=admitted, verified_txn=True)
        assert refused.value.code == pb.NOT_LEADER_OR_FOLLOWER and refused.value.retriable
        assert "admitted at leader epoch 0" in refused.value.message
        with pytest.raises(SluiceError) as marker:
            p.write_marker(5, 0, True, 0, leader_epoch=admitted)
        assert marker.value.code == pb.NOT_LEADER_OR_FOLLOWER
        assert p.log_end_offset == 1 and p.epoch_cache[-1][0] == (0 if attempt == 0 else 2)
        p.become_leader(2)  # leads again, at a later epoch: still not the epoch it was admitted at
    assert p.append(late, leader_epoch=2, verified_txn=True) == (1, False)
    p.high_watermark = p.log_end_offset
    assert p.read(1, 1 << 20, False).batches[0].partition_leader_epoch == 2


def test_aborted_index_and_open_transactions_survive_reopen(tmp_path: Path) -> None:
    s = RocksStorage(str(tmp_path / "db"))
    p = part(s)
    append(p, 1, producer_id=5, producer_epoch=0, base_sequence=0, transactional=True)
    p.write_marker(5, 0, False, 0, leader_epoch=p.leader_epoch)
    append(p, 1, producer_id=6, producer_epoch=0, base_sequence=0, transactional=True)
    s.close()
    s = RocksStorage(str(tmp_path / "db"))
    p = part(s)
    assert p.last_stable_offset == 2  # producer 6's transaction is still open
    assert p._is_aborted(5, 0)
    s.close()


def test_retention_by_bytes_advances_log_start(storage: RocksStorage) -> None:
    p = part(storage, **{"retention.bytes": 300, "retention.ms": -1})
    for _ in range(10):
        append(p, 1)
    start = p.apply_retention(0)
    assert 0 < start < 10
    with pytest.raises(SluiceError) as err:
        p.read(0, 1 << 20, False)
    assert err.value.code == pb.OFFSET_OUT_OF_RANGE
    assert p.read(start, 1 << 20, False).batches[0].base_offset == start


def test_retention_never_passes_an_open_transaction(storage: RocksStorage) -> None:
    p = part(storage, **{"retention.ms": 0})
    append(p, 1, producer_id=5, producer_epoch=0, base_sequence=0, transactional=True)
    append(p, 1)
    assert p.apply_retention(10**15) == 0


def test_idle_producers_expire_persistently_but_not_with_a_transaction_open(tmp_path: Path) -> None:
    s = RocksStorage(str(tmp_path / "db"))
    p = PartitionLog(s, "t", 0, TOPIC_ID, config({"producer.id.expiration.ms": 1000}))
    p.become_leader(0)
    p.append(
        build_batch([(None, b"a", None, 5_000)], producer_id=7, producer_epoch=0, base_sequence=0),
        leader_epoch=p.leader_epoch,
    )
    txn = build_batch([(None, b"b", None, 5_000)], producer_id=8, producer_epoch=0, base_sequence=0, transactional=True)
    p.append(txn, verified_txn=True, leader_epoch=p.leader_epoch)
    p.high_watermark = p.log_end_offset
    assert p.remove_expired_producers(5_500) == 0  # not idle long enough
    assert p.remove_expired_producers(6_000) == 1  # 7 goes; 8 has its transaction open
    assert set(p.producers) == {8}
    with pytest.raises(SluiceError) as info:  # 7 is a stranger now: its sequence must start again
        p.append(
            build_batch([(None, b"c", None, 6_000)], producer_id=7, producer_epoch=0, base_sequence=1),
            leader_epoch=p.leader_epoch,
        )
    assert info.value.code == pb.UNKNOWN_PRODUCER_ID
    s.close()
    s = RocksStorage(str(tmp_path / "db"))  # the removal was written, not only forgotten
    assert set(PartitionLog(s, "t", 0, TOPIC_ID, config()).producers) == {8}
    s.close()


def test_a_new_producer_is_refused_once_the_partition_holds_the_cap(storage: RocksStorage) -> None:
    p = PartitionLog(storage, "t", 0, TOPIC_ID, config({"producer.id.max.count.per.partition": 2}))
    p.become_leader(0)
    for pid in (1, 2):
        p.append(
            build_batch([(None, b"x")], producer_id=pid, producer_epoch=0, base_sequence=0), leader_epoch=p.leader_epoch
        )
    with pytest.raises(SluiceError) as info:
        p.append(
            build_batch([(None, b"x")], producer_id=3, producer_epoch=0, base_sequence=0), leader_epoch=p.leader_epoch
        )
    assert info.value.code == pb.POLICY_VIOLATION and "producer.id.max.count.per.partition=2" in str(info.value)
    p.append(
        build_batch([(None, b"y")], producer_id=1, producer_epoch=0, base_sequence=1), leader_epoch=p.leader_epoch
    )  # known ones go on


def stored_bytes(storage: RocksStorage, p: PartitionLog) -> int:
    """The oracle: the bytes of the partition's batches, read straight from RocksDB."""
    return sum(len(v) for _k, v in storage.scan("log", p.prefix, p.prefix + b"\xff" * 9))


def test_the_size_follows_appends_retention_truncation_and_restarts(tmp_path: Path) -> None:
    s = RocksStorage(str(tmp_path / "db"))
    p = part(s, **{"retention.bytes": 1000, "retention.ms": -1})
    assert p.size_bytes == 0
    for n in range(1, 13):
        append(p, n)
    assert p.size_bytes == stored_bytes(s, p) > 1000
    p.apply_retention(0)
    assert p.log_start_offset > 0 and p.size_bytes == stored_bytes(s, p) <= 1000
    p.truncate_to(p.log_end_offset - 12)  # drops the last batch (12 records)
    assert p.size_bytes == stored_bytes(s, p) > 0
    p.checkpoint_high_watermark()
    tail = [append(p, 2) for _ in range(3)]  # after the meta's size: a restart counts them again
    expected = stored_bytes(s, p)
    s.close()
    s = RocksStorage(str(tmp_path / "db"))
    p = part(s, **{"retention.bytes": 1000, "retention.ms": -1})
    assert tail and p.size_bytes == expected
    p.reset_to(1000)
    assert p.size_bytes == stored_bytes(s, p) == 0
    s.close()


def test_a_meta_written_before_sizes_were_kept_is_counted_once_at_start(tmp_path: Path) -> None:
    s = RocksStorage(str(tmp_path / "db"))
    p = part(s)
    for n in (3, 4, 5):
        append(p, n)
    expected = stored_bytes(s, p)
    meta = json.loads(s.get("partition_meta", p.prefix) or b"{}")
    for key in ("size_bytes", "size_end"):
        del meta[key]
    ws = WriteSet()
    ws.put("partition_meta", p.prefix, json.dumps(meta).encode())
    s.write(ws)
    s.close()
    s = RocksStorage(str(tmp_path / "db"))
    assert part(s).size_bytes == expected > 0
    s.close()
