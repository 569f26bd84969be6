"""Offset bookkeeping and the __consumer_offsets record format (pure, no storage)."""

from __future__ import annotations

import pytest

from sluice.broker.group.offsets import (
    OffsetAndMetadata,
    OffsetRecordError,
    OffsetStore,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    iter_offset_records,
    offset_records,
)
from sluice.records import RecordBatch, build_batch, control_batch


def test_key_and_value_round_trip() -> None:
    key = encode_key("grüppe", "orders.v1", 7)
    assert decode_key(key) == ("grüppe", ("orders.v1", 7))
    value = OffsetAndMetadata(123456789012, 4, "meta ✓", 1_700_000_000_000)
    assert decode_value(encode_value(value), record_offset=42) == OffsetAndMetadata(
        123456789012, 4, "meta ✓", 1_700_000_000_000, 42
    )


def test_key_layout_is_documented_big_endian() -> None:
    assert encode_key("g", "t", 1) == b"\x00\x00" + b"\x00\x01g" + b"\x00\x01t" + b"\x00\x00\x00\x01"


def test_unknown_key_type_is_skipped_and_garbage_is_an_error() -> None:
    assert decode_key(b"\x00\x05whatever") is None
    with pytest.raises(OffsetRecordError):
        decode_key(b"\x00\x00\x00\x09ab")
    with pytest.raises(OffsetRecordError):
        decode_value(b"\x00\x01" + b"\x00" * 30)  # unknown version


def test_records_round_trip_through_a_batch() -> None:
    batch = build_batch(
        offset_records("g", [(("t", 0), OffsetAndMetadata(5)), (("t", 1), OffsetAndMetadata(9, 2, "m", 77))])
    )
    batch.base_offset = 100
    out = list(iter_offset_records(batch))
    assert out == [
        ("g", ("t", 0), OffsetAndMetadata(5, -1, "", -1, 100)),
        ("g", ("t", 1), OffsetAndMetadata(9, 2, "m", 77, 101)),
    ]


def test_pending_offsets_become_committed_on_commit_marker() -> None:
    store = OffsetStore()
    store.commit("g", ("t", 0), OffsetAndMetadata(1, record_offset=0))
    store.stage("g", 7, ("t", 0), OffsetAndMetadata(10, record_offset=1))
    store.stage("g", 7, ("t", 1), OffsetAndMetadata(20, record_offset=1))
    assert store.committed("g", ("t", 0)) == OffsetAndMetadata(1, record_offset=0)
    assert store.has_pending("g", ("t", 0)) and store.has_pending("g", ("t", 1))
    assert store.partitions("g") == [("t", 0)]
    assert store.partitions("g", include_pending=True) == [("t", 0), ("t", 1)]
    assert store.end_txn(7, committed=True) == ["g"]
    assert not store.has_pending("g", ("t", 0))
    assert store.committed("g", ("t", 0)).offset == 10  # type: ignore[union-attr]
    assert store.committed("g", ("t", 1)).offset == 20  # type: ignore[union-attr]


def test_pending_offsets_vanish_on_abort() -> None:
    store = OffsetStore()
    store.commit("g", ("t", 0), OffsetAndMetadata(1, record_offset=0))
    store.stage("g", 7, ("t", 0), OffsetAndMetadata(10, record_offset=1))
    store.stage("h", 7, ("t", 0), OffsetAndMetadata(11, record_offset=2))
    assert store.end_txn(7, committed=False) == ["g", "h"]
    assert store.committed("g", ("t", 0)).offset == 1  # type: ignore[union-attr]
    assert "h" not in store.groups  # nothing left of it
    assert store.end_txn(7, committed=True) == []  # a repeated marker changes nothing


def test_two_producers_pending_on_one_group_are_independent() -> None:
    store = OffsetStore()
    store.stage("g", 1, ("t", 0), OffsetAndMetadata(10, record_offset=1))
    store.stage("g", 2, ("t", 1), OffsetAndMetadata(20, record_offset=2))
    store.end_txn(1, committed=False)
    assert store.has_pending("g", ("t", 1)) and not store.has_pending("g", ("t", 0))
    store.end_txn(2, committed=True)
    assert store.committed("g", ("t", 1)).offset == 20  # type: ignore[union-attr]


def test_a_later_plain_commit_wins_over_an_earlier_transactional_one() -> None:
    store = OffsetStore()
    store.stage("g", 7, ("t", 0), OffsetAndMetadata(10, record_offset=5))
    store.commit("g", ("t", 0), OffsetAndMetadata(50, record_offset=6))
    store.end_txn(7, committed=True)
    assert store.committed("g", ("t", 0)).offset == 50  # type: ignore[union-attr]


def test_replay_rebuilds_committed_and_pending_state() -> None:
    def at(batch: RecordBatch, offset: int) -> RecordBatch:
        batch.base_offset = offset
        return batch

    log = [
        at(build_batch(offset_records("g", [(("t", 0), OffsetAndMetadata(1))])), 0),
        at(
            build_batch(
                offset_records("g", [(("t", 0), OffsetAndMetadata(10))]),
                producer_id=7,
                producer_epoch=0,
                base_sequence=-1,
                transactional=True,
            ),
            1,
        ),
        at(
            build_batch(
                offset_records("g", [(("t", 1), OffsetAndMetadata(30))]),
                producer_id=8,
                producer_epoch=0,
                base_sequence=-1,
                transactional=True,
            ),
            2,
        ),
        at(
            build_batch(
                offset_records("g", [(("t", 2), OffsetAndMetadata(40))]),
                producer_id=9,
                producer_epoch=0,
                base_sequence=-1,
                transactional=True,
            ),
            3,
        ),
        at(control_batch(7, 0, True, 0), 4),
        at(control_batch(8, 0, False, 0), 5),
        at(build_batch([(b"\x00\x09future record", b"x")]), 6),  # unknown key type: skipped
    ]
    store = OffsetStore()
    for batch in log:
        store.replay(batch)
    assert store.committed("g", ("t", 0)) is not None
    assert store.committed("g", ("t", 0)).offset == 10  # type: ignore[union-attr]
    assert store.committed("g", ("t", 1)) is None  # aborted
    assert store.has_pending("g", ("t", 2))  # still open: the marker comes later
    assert store.pending_producers() == [9]


def test_tombstone_deletes_an_offset() -> None:
    store = OffsetStore()
    store.commit("g", ("t", 0), OffsetAndMetadata(1, record_offset=0))
    batch = build_batch([(encode_key("g", "t", 0), None)])
    batch.base_offset = 1
    store.replay(batch)
    assert store.committed("g", ("t", 0)) is None
    assert store.groups == {}
