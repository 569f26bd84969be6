"""Follower logs over real RocksDB: copying, divergence after a leader change, truncation, rebuilt state."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice import errors
from sluice.broker.config import DEFAULTS
from sluice.broker.log.partition import PartitionLog
from sluice.broker.log.storage import RocksStorage
from sluice.broker.replication.fetcher import FollowerTracker, divergence
from sluice.records import build_batch, decode_records

TOPIC_ID = "00112233445566778899aabbccddeeff"


def config():  # type: ignore[no-untyped-def]
    return {k: d for k, (_t, d) in DEFAULTS.items()}.__getitem__


@pytest.fixture
def logs(tmp_path: Path) -> Iterator[tuple[PartitionLog, PartitionLog]]:
    sa, sb = RocksStorage(str(tmp_path / "a")), RocksStorage(str(tmp_path / "b"))
    yield PartitionLog(sa, "t", 0, TOPIC_ID, config()), PartitionLog(sb, "t", 0, TOPIC_ID, config())
    sa.close()
    sb.close()


def lead(part: PartitionLog, *values: bytes, **header: int | bool) -> None:
    if not part.leading:
        part.become_leader(part.leader_epoch)
    for v in values:
        part.append(build_batch([(None, v)], **header), verified_txn=True, leader_epoch=part.leader_epoch)


def copy(leader: PartitionLog, follower: PartitionLog) -> None:
    """One round of what the fetcher does, with the leader's divergence check."""
    for _ in range(10):
        d = divergence(leader, follower.log_end_offset, follower.latest_epoch)
        if d is None:
            break
        _e, own_end = follower.end_offset_for_epoch(d.epoch)
        follower.truncate_to(d.end_offset if own_end < 0 else min(d.end_offset, own_end))
    if follower.log_end_offset < leader.log_end_offset:
        result = leader.read(follower.log_end_offset, 1 << 20, False, upto=leader.log_end_offset)
        for batch in result.batches:
            follower.append_replica(batch)


def values(part: PartitionLog) -> list[bytes | None]:
    result = part.read(part.log_start_offset, 1 << 20, False, upto=part.log_end_offset)
    return [r.value for b in result.batches if not b.control for r in decode_records(b)]


def test_follower_copies_batches_and_their_state(logs: tuple[PartitionLog, PartitionLog]) -> None:
    a, b = logs
    a.become_leader(0)
    lead(a, b"x", b"y")
    lead(a, b"t1", producer_id=4, producer_epoch=0, base_sequence=0, transactional=True)
    a.write_marker(4, 0, False, 0, leader_epoch=a.leader_epoch)
    lead(a, b"t2", producer_id=4, producer_epoch=0, base_sequence=1, transactional=True)
    copy(a, b)
    assert values(b) == values(a)
    assert b.log_end_offset == a.log_end_offset == 5
    assert b.open_txns == a.open_txns == {4: 4}
    assert b.aborted == a.aborted == {4: [(2, 3)]}
    assert b.producers[4].last_seq == a.producers[4].last_seq == 1
    assert b.epoch_cache == [(0, 0)]


def test_old_leader_truncates_what_the_new_leader_never_had(logs: tuple[PartitionLog, PartitionLog]) -> None:
    a, b = logs
    a.become_leader(0)
    lead(a, b"0", b"1", b"2")
    copy(a, b)
    lead(a, b"lost", producer_id=9, producer_epoch=0, base_sequence=0)  # never reached b
    b.become_leader(1)  # b is elected
    lead(b, b"3", b"4")
    a.become_follower(1)  # a comes back as a follower of b
    d = divergence(b, a.log_end_offset, a.latest_epoch)
    assert d is not None and (d.epoch, d.end_offset) == (0, 3)
    copy(b, a)
    assert values(a) == [b"0", b"1", b"2", b"3", b"4"]
    assert 9 not in a.producers  # the producer state of the dropped batch went with it
    assert a.epoch_cache == [(0, 0), (1, 3)]
    assert divergence(b, a.log_end_offset, a.latest_epoch) is None


def test_truncation_survives_reopen(tmp_path: Path) -> None:
    s = RocksStorage(str(tmp_path / "c"))
    p = PartitionLog(s, "t", 0, TOPIC_ID, config())
    p.become_leader(0)
    lead(p, b"a", b"b", b"c")
    p.truncate_to(1)
    s.close()
    s = RocksStorage(str(tmp_path / "c"))
    p = PartitionLog(s, "t", 0, TOPIC_ID, config())
    assert p.log_end_offset == 1 and values(p) == [b"a"]
    s.close()


def test_tracker_lag_and_end_offsets() -> None:
    t = FollowerTracker.starting([1, 2, 3], me=1, now_ms=0)
    assert t.end_offset(2) == -1 and not t.lagging(2, 1000, 5000)
    assert t.lagging(3, 6000, 5000)  # in the ISR at the start, never fetched
    t.fetched(2, 10, 10, now_ms=6000)
    assert t.end_offset(2) == 10 and not t.lagging(2, 6000, 5000)
    t.fetched(2, 12, 20, now_ms=12000)  # fetching, but behind
    assert t.lagging(2, 12000, 5000)


def test_an_epoch_led_without_writing_is_forgotten(logs: tuple[PartitionLog, PartitionLog]) -> None:
    """A replica that led an epoch and wrote nothing, then follows a leader that never had that epoch."""
    a, b = logs
    a.become_leader(0)
    lead(a, b"0")
    copy(a, b)
    b.become_leader(1)  # b leads epoch 1 briefly and writes nothing
    a.become_leader(2)  # a leads again: it never saw epoch 1
    lead(a, b"1")
    copy(a, b)
    assert values(b) == [b"0", b"1"]
    assert b.epoch_cache == [(0, 0), (2, 1)]
    assert divergence(a, b.log_end_offset, b.latest_epoch) is None


def test_empty_replica_with_a_stale_epoch_converges(logs: tuple[PartitionLog, PartitionLog]) -> None:
    a, b = logs
    b.become_leader(0)  # b was the first leader of an empty partition
    a.become_leader(1)
    d = divergence(a, b.log_end_offset, b.latest_epoch)
    assert d is not None
    copy(a, b)
    assert b.epoch_cache == [] and divergence(a, b.log_end_offset, b.latest_epoch) is None


def test_a_follower_that_stopped_fetching_does_not_count_as_alive() -> None:
    t = FollowerTracker()
    t.fetched(2, 10, 10, now_ms=1000)
    assert t.fetching(2, 2500, 2000)
    assert not t.fetching(2, 5000, 2000)  # its last offset is stale: it must fetch again to rejoin
    assert not t.fetching(3, 5000, 2000)


def test_a_follower_refuses_a_batch_that_fails_its_crc(logs: tuple[PartitionLog, PartitionLog]) -> None:
    a, b = logs
    a.become_leader(0)
    lead(a, b"x", b"y")
    first, second = a.read(0, 1 << 20, False, upto=a.log_end_offset).batches
    b.append_replica(first)
    damaged = type(second)()
    damaged.CopyFrom(second)
    damaged.records = damaged.records[:-1] + bytes([damaged.records[-1] ^ 0x01])  # one bit flipped in transit
    with pytest.raises(errors.CorruptMessageError, match="CRC-32C"):
        b.append_replica(damaged)
    assert b.log_end_offset == 1 and values(b) == [b"x"]  # nothing of it was written
    b.append_replica(second)  # the leader's intact copy, fetched again
    assert values(b) == [b"x", b"y"]
