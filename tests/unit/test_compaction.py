"""Compaction of compacted partitions: latest value per key, decided transactions only, markers kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice import errors
from sluice.broker.config import DEFAULTS
from sluice.broker.log.partition import PartitionLog
from sluice.broker.log.storage import RocksStorage
from sluice.records import build_batch, decode_records

TOPIC_ID = "ffeeddccbbaa99887766554433221100"
NOW = 10**13


def open_log(path: Path, **overrides: object) -> tuple[RocksStorage, PartitionLog]:
    # the tests' clock (NOW) is centuries ahead of the broker's: no bound on timestamps ahead of it
    lenient = {"message.timestamp.after.max.ms": 2**63 - 1}
    values = {k: d for k, (_t, d) in DEFAULTS.items()} | {"cleanup.policy": "compact"} | lenient | overrides
    s = RocksStorage(str(path))
    p = PartitionLog(s, "c", 0, TOPIC_ID, values.__getitem__)
    p.become_leader(0)
    return s, p


def put(p: PartitionLog, key: bytes, value: bytes | None, ts: int = NOW, **header: int | bool) -> int:
    offset, _ = p.append(
        build_batch([(key, value, None, ts)], **header), verified_txn=True, leader_epoch=p.leader_epoch
    )
    p.high_watermark = p.log_end_offset
    return offset


def visible(p: PartitionLog) -> list[tuple[bytes | None, bytes | None]]:
    result = p.read(p.log_start_offset, 1 << 24, read_committed=True)
    return [(r.key, r.value) for b in result.batches for r in decode_records(b)]


def test_latest_value_per_key_survives(tmp_path: Path) -> None:
    s, p = open_log(tmp_path / "db")
    for i in range(5):
        put(p, b"a", b"a%d" % i)
        put(p, b"b", b"b%d" % i)
    put(p, b"c", b"c0")
    before = p.size_bytes
    assert p.compact(NOW) == 8
    assert visible(p) == [(b"a", b"a4"), (b"b", b"b4"), (b"c", b"c0")]
    assert p.log_end_offset == 11
    kept = sum(len(v) for _k, v in s.scan("log", p.prefix, p.prefix + b"\xff" * 9))
    assert p.size_bytes == kept < before  # the dropped batches leave the size
    s.close()
    s, p = open_log(tmp_path / "db")  # the log end survives the gaps
    assert p.size_bytes == kept  # and so does the size (the compaction wrote it)
    assert p.log_end_offset == 11 and put(p, b"d", b"d0") == 11
    s.close()


def test_transactions_aborted_dropped_committed_kept_open_untouched(tmp_path: Path) -> None:
    s, p = open_log(tmp_path / "db")
    put(p, b"k", b"old")
    put(p, b"k", b"aborted", producer_id=7, producer_epoch=0, base_sequence=-1, transactional=True)
    p.write_marker(7, 0, False, 0, leader_epoch=p.leader_epoch)
    put(p, b"j", b"committed", producer_id=8, producer_epoch=0, base_sequence=-1, transactional=True)
    p.write_marker(8, 0, True, 0, leader_epoch=p.leader_epoch)
    p.high_watermark = p.log_end_offset
    put(p, b"k", b"open", producer_id=9, producer_epoch=0, base_sequence=-1, transactional=True)
    p.compact(NOW)
    result = p.read(0, 1 << 24, read_committed=False, upto=p.log_end_offset)
    offsets = [b.base_offset for b in result.batches]
    assert 1 not in offsets and 2 not in offsets  # aborted data and its marker
    assert 3 in offsets and 4 in offsets  # committed data keeps its COMMIT marker
    assert 0 in offsets  # still the latest decided value of k: the open transaction may abort
    assert 5 in offsets
    assert p.aborted == {}
    s.close()


def test_old_tombstones_go_recent_ones_stay(tmp_path: Path) -> None:
    s, p = open_log(tmp_path / "db", **{"delete.retention.ms": 1000})
    put(p, b"x", b"1")
    put(p, b"x", None, ts=NOW - 5000)
    put(p, b"y", b"1")
    put(p, b"y", None, ts=NOW)
    put(p, b"z", b"last")
    p.compact(NOW)
    assert visible(p) == [(b"y", None), (b"z", b"last")]
    s.close()


def test_min_compaction_lag_keeps_recent_batches(tmp_path: Path) -> None:
    """min.compaction.lag.ms is read: batches newer than the lag, and all after them, are not cleaned yet."""
    s, p = open_log(tmp_path / "db", **{"min.compaction.lag.ms": 60_000})
    put(p, b"a", b"old", ts=NOW - 120_000)
    put(p, b"a", b"older-than-lag", ts=NOW - 90_000)
    put(p, b"a", b"recent", ts=NOW - 1_000)
    put(p, b"a", b"newest", ts=NOW - 120_000)  # after a recent batch: not cleanable yet either
    put(p, b"z", b"last")
    assert p.compact(NOW) == 1  # only the first "a": shadowed within the cleanable part
    assert visible(p) == [(b"a", b"older-than-lag"), (b"a", b"recent"), (b"a", b"newest"), (b"z", b"last")]
    assert p.compact(NOW + 120_000) == 2  # once the lag has passed, the usual rule
    assert visible(p) == [(b"a", b"newest"), (b"z", b"last")]
    s.close()


def test_a_record_without_a_key_is_refused_on_a_compacted_topic_and_nothing_is_appended(tmp_path: Path) -> None:
    """As Kafka refuses it (INVALID_RECORD): compaction keeps the latest record per key."""
    _s, p = open_log(tmp_path / "db")
    with pytest.raises(errors.InvalidRecordError, match=r"without a key \(record 1 of the batch\)"):
        p.append(build_batch([(b"a", b"1"), (None, b"2")]), leader_epoch=p.leader_epoch)
    assert p.log_end_offset == 0
    assert p.append(build_batch([(b"a", b"1"), (b"b", None)]), leader_epoch=p.leader_epoch) == (0, False)
