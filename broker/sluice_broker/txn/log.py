"""The records of ``__transaction_state``: how a :class:`TxnMetadata` is stored and read back.

One record per state change, in an ordinary (non-idempotent, non-transactional)
record batch appended by the coordinator to the id's partition:

    key    the transactional id, UTF-8
    value  compact JSON, or null (a tombstone: the id expired and is gone)

    {"v": 0, "pid": 4001, "epoch": 3, "last_pid": 4001, "last_epoch": 2,
     "timeout_ms": 60000, "state": "Ongoing", "partitions": [["orders", 0], ...],
     "start_ms": 1700000000000, "update_ms": 1700000000123,
     "resume_pid": 4001, "resume_epoch": 2, "next_pid": -1, "timed_out": false,
     "tv2": true, "end_bumped": true}

``resume_pid``/``resume_epoch`` (the handle a non-fencing epoch bump replaced)
``next_pid`` (the producer id an exhausted epoch moves to), ``timed_out``
(the resume handle was replaced by a timeout, not an EndTxn) and ``tv2`` (the
transaction's producer speaks protocol version 2) came with
transaction protocol v2, and ``end_bumped`` (a Prepare* state whose end bumped the
epoch: its markers go out as transaction version 2) came with issue 30; a record
without them (written before) reads as -1 (false), which is what they were then,
so the layout version stays 0; each is written only when it differs from that
(most records do not carry them).

``state`` uses the names of :class:`TxnState` (the names DescribeTransactions
answers), ``partitions`` is sorted so the same state always encodes the same
way. JSON rather than a packed struct: the log holds a few records per
transaction, far off the data path, and stays readable with any tool (and by
the Kubernetes operator later). ``v`` lets a later version change the layout;
a reader refuses versions it does not know rather than guess.

Replay is "last value per key wins", which is also what compaction keeps.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from sluice.broker.txn.state import TxnMetadata, TxnState
from sluice.records import RecordBatch, build_batch, decode_records

VERSION = 0
# What a record written before transaction protocol v2 (without these keys) reads as.
_V2_ABSENT: dict[str, Any] = {
    "resume_pid": -1,
    "resume_epoch": -1,
    "next_pid": -1,
    "timed_out": False,
    "tv2": False,
    "end_bumped": False,
}


class TxnLogError(ValueError):
    """A __transaction_state record that cannot be decoded."""


def encode_key(transactional_id: str) -> bytes:
    return transactional_id.encode()


def encode_value(meta: TxnMetadata) -> bytes:
    doc: dict[str, Any] = {
        "v": VERSION,
        "pid": meta.producer_id,
        "epoch": meta.producer_epoch,
        "last_pid": meta.last_producer_id,
        "last_epoch": meta.last_producer_epoch,
        "timeout_ms": meta.timeout_ms,
        "state": meta.state.value,
        "partitions": sorted([t, p] for t, p in meta.partitions),
        "start_ms": meta.txn_start_ms,
        "update_ms": meta.last_update_ms,
    }
    # The protocol v2 fields, each written only when it differs from what a record without it reads as.
    v2: dict[str, Any] = {
        "resume_pid": meta.resume_producer_id,
        "resume_epoch": meta.resume_producer_epoch,
        "next_pid": meta.next_producer_id,
        "timed_out": meta.timed_out,
        "tv2": meta.tv2,
        "end_bumped": meta.end_bumped,
    }
    doc.update({k: v for k, v in v2.items() if v != _V2_ABSENT[k]})
    return json.dumps(doc, separators=(",", ":")).encode()


def decode_value(key: bytes, value: bytes) -> TxnMetadata:
    try:
        transactional_id = key.decode()
        doc: dict[str, Any] = json.loads(value)
        if doc.get("v") != VERSION:
            raise TxnLogError(f"unknown __transaction_state record version {doc.get('v')!r}")
        return TxnMetadata(
            transactional_id=transactional_id,
            producer_id=int(doc["pid"]),
            producer_epoch=int(doc["epoch"]),
            last_producer_id=int(doc["last_pid"]),
            last_producer_epoch=int(doc["last_epoch"]),
            timeout_ms=int(doc["timeout_ms"]),
            state=TxnState(doc["state"]),
            partitions=frozenset((str(t), int(p)) for t, p in doc["partitions"]),
            txn_start_ms=int(doc["start_ms"]),
            last_update_ms=int(doc["update_ms"]),
            resume_producer_id=int(doc.get("resume_pid", -1)),
            resume_producer_epoch=int(doc.get("resume_epoch", -1)),
            next_producer_id=int(doc.get("next_pid", -1)),
            timed_out=bool(doc.get("timed_out", False)),
            tv2=bool(doc.get("tv2", False)),
            end_bumped=bool(doc.get("end_bumped", False)),
        )
    except TxnLogError:
        raise
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise TxnLogError(f"cannot decode the __transaction_state record of {key!r}: {exc}") from exc


def state_batch(meta: TxnMetadata) -> RecordBatch:
    """The batch that records ``meta`` (a Dead state is written as a tombstone)."""
    value = None if meta.state is TxnState.DEAD else encode_value(meta)
    return build_batch([(encode_key(meta.transactional_id), value)])


def tombstone_batch(transactional_id: str) -> RecordBatch:
    return build_batch([(encode_key(transactional_id), None)])


def apply_batch(states: dict[str, TxnMetadata], batch: RecordBatch) -> None:
    """Apply one batch of the log to ``states`` (id -> metadata): the last value per key wins.

    Control batches (there are none in this topic) are skipped. A record that
    cannot be decoded raises :class:`TxnLogError`, so that the caller decides:
    the coordinator logs it as an error and skips the batch rather than never
    finishing the load of the partition.
    """
    if batch.control:
        return
    for rec in decode_records(batch):
        if rec.key is None:
            raise TxnLogError(f"__transaction_state record at offset {rec.offset} has no key")
        if rec.value is None:
            states.pop(rec.key.decode(errors="replace"), None)
        else:
            meta = decode_value(rec.key, rec.value)
            states[meta.transactional_id] = meta


def replay(batches: Iterable[RecordBatch]) -> dict[str, TxnMetadata]:
    """The state of every id in a partition's log, tombstones removing ids."""
    states: dict[str, TxnMetadata] = {}
    for batch in batches:
        apply_batch(states, batch)
    return states
