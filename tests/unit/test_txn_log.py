"""Records of __transaction_state (broker/sluice_broker/txn/log.py): encoding, tombstones, replay."""

from __future__ import annotations

import json

import pytest

from sluice.broker.txn.log import (
    TxnLogError,
    decode_value,
    encode_key,
    encode_value,
    replay,
    state_batch,
    tombstone_batch,
)
from sluice.broker.txn.state import TxnMetadata, TxnState
from sluice.records import build_batch, control_batch, decode_records, verify_crc


def sample(tid: str = "orders-tx", state: TxnState = TxnState.ONGOING, epoch: int = 3) -> TxnMetadata:
    base = TxnMetadata.new(tid, 4001, 60_000, now=1_700_000_000_000)
    return TxnMetadata(
        transactional_id=tid,
        producer_id=base.producer_id,
        producer_epoch=epoch,
        last_producer_id=4001,
        last_producer_epoch=epoch - 1,
        timeout_ms=60_000,
        state=state,
        partitions=frozenset({("orders", 1), ("__consumer_offsets", 7), ("orders", 0)}),
        txn_start_ms=1_700_000_000_000,
        last_update_ms=1_700_000_000_123,
    )


def test_round_trip() -> None:
    m = sample()
    assert decode_value(encode_key(m.transactional_id), encode_value(m)) == m


def test_every_state_round_trips() -> None:
    for state in TxnState:
        m = sample(state=state)
        assert decode_value(b"orders-tx", encode_value(m)).state is state


def test_value_is_documented_compact_json() -> None:
    doc = json.loads(encode_value(sample()))
    assert doc == {
        "v": 0,
        "pid": 4001,
        "epoch": 3,
        "last_pid": 4001,
        "last_epoch": 2,
        "timeout_ms": 60000,
        "state": "Ongoing",
        "partitions": [["__consumer_offsets", 7], ["orders", 0], ["orders", 1]],
        "start_ms": 1_700_000_000_000,
        "update_ms": 1_700_000_000_123,
    }
    assert b" " not in encode_value(sample())
    assert encode_value(sample()) == encode_value(sample())  # deterministic


def test_unicode_ids_round_trip() -> None:
    m = sample(tid="zahlungen-ü-✓")
    assert decode_value(encode_key(m.transactional_id), encode_value(m)).transactional_id == "zahlungen-ü-✓"


@pytest.mark.parametrize(
    "value",
    [
        b"not json",
        b"{}",
        json.dumps({"v": 1}).encode(),
        json.dumps({**json.loads(encode_value(sample())), "state": "Frozen"}).encode(),
        json.dumps({**json.loads(encode_value(sample())), "partitions": [["t"]]}).encode(),
    ],
)
def test_undecodable_values_are_refused(value: bytes) -> None:
    with pytest.raises(TxnLogError):
        decode_value(b"tx", value)


def test_state_batch_is_one_plain_record() -> None:
    m = sample()
    batch = state_batch(m)
    assert verify_crc(batch)
    assert batch.producer_id == -1 and not batch.transactional and not batch.control
    (rec,) = decode_records(batch)
    assert rec.key == b"orders-tx" and rec.value == encode_value(m)


def test_dead_is_written_as_a_tombstone() -> None:
    (rec,) = decode_records(state_batch(sample(state=TxnState.DEAD)))
    assert rec.value is None
    (rec,) = decode_records(tombstone_batch("orders-tx"))
    assert rec.key == b"orders-tx" and rec.value is None


def test_replay_keeps_the_last_value_per_key_and_honours_tombstones() -> None:
    a1 = sample("a", TxnState.EMPTY, epoch=1)
    a2 = sample("a", TxnState.ONGOING, epoch=1)
    b1 = sample("b", TxnState.COMPLETE_COMMIT, epoch=5)
    c1 = sample("c", TxnState.EMPTY, epoch=1)
    batches = [
        state_batch(a1),
        state_batch(b1),
        control_batch(1, 0, True, 0),  # never in this topic, but skipped if it were
        state_batch(c1),
        state_batch(a2),
        tombstone_batch("c"),
        tombstone_batch("never-existed"),
    ]
    assert replay(batches) == {"a": a2, "b": b1}


def test_replay_of_a_batch_with_several_records() -> None:
    a = sample("a", TxnState.EMPTY)
    b = sample("b", TxnState.PREPARE_COMMIT)
    batch = build_batch([(b"a", encode_value(a)), (b"b", encode_value(b)), (b"a", None)])
    assert replay([batch]) == {"b": b}


def test_replay_refuses_a_record_without_key() -> None:
    with pytest.raises(TxnLogError):
        replay([build_batch([(None, encode_value(sample()))])])
