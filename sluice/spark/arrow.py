"""Record batches from the broker to Arrow record batches for Spark, column by column.

The read executors hand Spark ``pyarrow.RecordBatch`` objects (PySpark 4's
Python data sources accept them from ``DataSourceReader.read``), so no Python
object per row crosses into Spark. This module turns the wire batches of one
fetch into one Arrow batch with the columns of Spark's Kafka source: key,
value, topic, partition, offset, timestamp, timestampType and, with
includeHeaders, headers.

Why it looks the way it does. The record encoding (see :mod:`sluice.records`)
is a fixed 22-byte record header (offset delta, timestamp delta, key length,
value length, header count) followed by the key, the value and the headers.
Records have variable lengths, so finding where each record starts is a
sequential walk; everything else is done with numpy over the whole blob:

1. *Uniform batches* (every record has the same key and value lengths and no
   headers, which a producer of fixed-size records makes) are recognised in
   O(1) Python work: the blob is then an ``n x record_size`` matrix, and the
   guess is verified over every record with a strided numpy view before it
   is used. Keys and values are column slices of that matrix.
2. *Any other batch*: a Python loop finds the record starts (one ``unpack``
   per record, nothing allocated per record but a list entry); the record
   headers are then gathered for all records at once, and key and value
   bytes are cut out of the blob with one boolean mask each (a cumulative
   sum of +1 at each value's start and -1 at its end), which gives Arrow's
   data buffer directly; the offsets buffer is the cumulative sum of the lengths.

Batches in Kafka's encoding (``records_format`` KAFKA_V2: what Kafka clients
produced, stored as sent) have varint record headers: one Python walk finds
each record's key and value positions and lengths (:func:`_decode_v2`), and the
same masks cut the bytes. Decoding them here rather than asking the broker to
re-encode them keeps that per-record work on the executors, which scale out.

Headers (rare) are decoded in Python per record that has them, into a list
array. Records below ``start`` or at or above ``end`` (a range may begin or
end inside a batch) are dropped with a vectorised filter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from sluice.api.v1 import records_pb2
from sluice.records import (
    KAFKA_V2,
    RECORD_STRUCT,
    RecordBatch,
    RecordDecodeError,
    decompress,
    read_headers,
    read_v2_headers,
    zigzag_varint,
)

__all__ = ["COLUMNS", "HEADERS_TYPE", "arrow_schema", "decode_batches"]

COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType")
HEADERS_TYPE = pa.list_(pa.field("element", pa.struct([("key", pa.string()), ("value", pa.binary())])))

_HEADER_SIZE = RECORD_STRUCT.size  # 22
# The fixed record header as numpy sees it (big-endian, packed).
_HEADER_DTYPE = np.dtype([("delta", ">i4"), ("ts_delta", ">i8"), ("klen", ">i4"), ("vlen", ">i4"), ("hcount", ">u2")])

IntArray = npt.NDArray[np.int64]


def arrow_schema(include_headers: bool) -> pa.Schema:
    """The Arrow schema of the output (what Spark's ``to_arrow_schema`` makes of the Spark schema)."""
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(pa.field("headers", HEADERS_TYPE))
    return pa.schema(fields)


@dataclass(slots=True)
class _Decoded:
    """The columns of one wire batch, as numpy arrays plus the blob they point into."""

    blob: npt.NDArray[np.uint8]
    offsets: IntArray
    timestamps: IntArray
    key_start: IntArray
    key_len: IntArray  # -1: null
    value_start: IntArray
    value_len: IntArray  # -1: null
    headers: list[list[tuple[str, bytes]] | None] | None  # None: no record of the batch has headers
    timestamp_type: int
    row_size: int  # > 0: a uniform batch of records of this size


def _walk(data: bytes, count: int, base: int) -> tuple[IntArray, list[list[tuple[str, bytes]] | None] | None]:
    """Start of every record (the sequential part); headers of the records that have some."""
    starts = [0] * count
    unpack = RECORD_STRUCT.unpack_from  # offset delta, ts delta, key length, value length, header count
    size = _HEADER_SIZE
    end = len(data)
    pos = 0
    headers: list[list[tuple[str, bytes]] | None] | None = None
    try:
        for i in range(count):
            starts[i] = pos
            _d, _t, klen, vlen, hcount = unpack(data, pos)
            pos += size + (klen if klen > 0 else 0) + (vlen if vlen > 0 else 0)
            if hcount:
                if headers is None:
                    headers = [None] * count
                headers[i], pos = read_headers(data, pos, hcount)
            if pos > end:
                raise RecordDecodeError("record runs past the end of the batch")
    except (ValueError, UnicodeDecodeError) as exc:  # struct.error is a ValueError
        raise RecordDecodeError(f"malformed records in batch at offset {base}: {exc}") from exc
    return np.asarray(starts, dtype=np.int64), headers


def _gather_headers(blob: npt.NDArray[np.uint8], starts: IntArray) -> npt.NDArray[np.void]:
    """The 22-byte record headers at ``starts``, as a structured array."""
    idx = starts[:, None] + np.arange(_HEADER_SIZE, dtype=np.int64)
    headers: npt.NDArray[np.void] = blob[idx].reshape(-1).view(_HEADER_DTYPE)
    return headers


def _uniform(blob: npt.NDArray[np.uint8], data: bytes, count: int) -> npt.NDArray[np.void] | None:
    """The record headers if every record has the first one's size and no headers, else None."""
    _d, _t, klen, vlen, hcount = RECORD_STRUCT.unpack_from(data, 0)
    size = _HEADER_SIZE + max(klen, 0) + max(vlen, 0)
    if hcount or size * count != len(data):
        return None
    rows = blob.reshape(count, size)[:, :_HEADER_SIZE]
    fixed = np.ascontiguousarray(rows).reshape(-1).view(_HEADER_DTYPE)
    if not (np.all(fixed["klen"] == klen) and np.all(fixed["vlen"] == vlen) and not np.any(fixed["hcount"])):
        return None
    return fixed


def _decode_v2(batch: RecordBatch) -> _Decoded:
    """The columns of a batch in Kafka's encoding: one walk over the varint records."""
    data = decompress(batch.records, batch.compression)
    count = batch.record_count
    varint = zigzag_varint
    deltas = [0] * count
    ts_deltas = [0] * count
    key_start, key_len = [0] * count, [0] * count
    value_start, value_len = [0] * count, [0] * count
    headers: list[list[tuple[str, bytes]] | None] | None = None
    pos = 0
    try:
        for i in range(count):
            length, pos = varint(data, pos)
            end = pos + length
            ts_deltas[i], pos = varint(data, pos + 1)  # after the record's attributes byte
            deltas[i], pos = varint(data, pos)
            klen, pos = varint(data, pos)
            key_start[i], key_len[i] = pos, klen
            pos += max(klen, 0)
            vlen, pos = varint(data, pos)
            value_start[i], value_len[i] = pos, vlen
            pos += max(vlen, 0)
            hcount, pos = varint(data, pos)
            if hcount:
                if headers is None:
                    headers = [None] * count
                found, pos = read_v2_headers(data, pos, hcount)
                headers[i] = [(k, b"" if v is None else v) for k, v in found]  # null reads as empty, as in the client
            if pos != end or end > len(data) or hcount < 0:
                raise RecordDecodeError(f"record of {length} bytes does not match its fields")
    except (IndexError, UnicodeDecodeError, RecordDecodeError) as exc:
        raise RecordDecodeError(f"malformed Kafka records in batch at offset {batch.base_offset}: {exc}") from exc
    log_append = batch.timestamp_type == records_pb2.LOG_APPEND_TIME
    if log_append:
        timestamps = np.full(count, batch.max_timestamp, dtype=np.int64)
    else:
        timestamps = np.asarray(ts_deltas, dtype=np.int64) + batch.first_timestamp
    return _Decoded(
        blob=np.frombuffer(data, dtype=np.uint8),
        offsets=np.asarray(deltas, dtype=np.int64) + batch.base_offset,
        timestamps=timestamps,
        key_start=np.asarray(key_start, dtype=np.int64),
        key_len=np.asarray(key_len, dtype=np.int64),
        value_start=np.asarray(value_start, dtype=np.int64),
        value_len=np.asarray(value_len, dtype=np.int64),
        headers=headers,
        timestamp_type=1 if log_append else 0,
        row_size=0,
    )


def _decode_one(batch: RecordBatch) -> _Decoded:
    if batch.records_format == KAFKA_V2:
        return _decode_v2(batch)
    data = decompress(batch.records, batch.compression)
    count = batch.record_count
    blob = np.frombuffer(data, dtype=np.uint8)
    headers: list[list[tuple[str, bytes]] | None] | None = None
    fixed = _uniform(blob, data, count) if count and len(data) >= _HEADER_SIZE else None
    size = 0
    if fixed is not None:
        size = len(data) // count
        starts = np.arange(count, dtype=np.int64) * size
    else:
        starts, headers = _walk(data, count, batch.base_offset)
        fixed = _gather_headers(blob, starts)
    klen = fixed["klen"].astype(np.int64)
    vlen = fixed["vlen"].astype(np.int64)
    key_start = starts + _HEADER_SIZE
    value_start = key_start + np.maximum(klen, 0)
    log_append = batch.timestamp_type == records_pb2.LOG_APPEND_TIME
    if log_append:
        timestamps = np.full(count, batch.max_timestamp, dtype=np.int64)
    else:
        timestamps = fixed["ts_delta"].astype(np.int64) + batch.first_timestamp
    return _Decoded(
        blob=blob,
        offsets=fixed["delta"].astype(np.int64) + batch.base_offset,
        timestamps=timestamps,
        key_start=key_start,
        key_len=klen,
        value_start=value_start,
        value_len=vlen,
        headers=headers,
        timestamp_type=1 if log_append else 0,
        row_size=size,
    )


def _binary(blob: npt.NDArray[np.uint8], starts: IntArray, lengths: IntArray, row_size: int) -> pa.Array:
    """A binary array of the slices ``blob[start:start+length]`` (length -1: null).

    ``row_size`` > 0 says the slices sit at the same place in rows of that
    size (a uniform batch): the bytes are then one column block of the
    ``rows x row_size`` matrix.
    """
    n = len(lengths)
    valid = lengths >= 0
    lens = np.where(valid, lengths, 0)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    total = int(offsets[-1])
    if total >= 2**31:
        raise RecordDecodeError("more than 2 GiB of keys or values in one Arrow batch")
    if total == 0:
        data = np.zeros(0, dtype=np.uint8)
    elif row_size > 0:
        first = int(starts[0])
        width = int(lens[0])
        rows = blob[first - first % row_size :].reshape(-1, row_size)[:n]
        col = first % row_size
        data = np.ascontiguousarray(rows[:, col : col + width]).reshape(-1)
    else:
        # +1 where a slice starts, -1 where it ends (starts are distinct, and so are ends): the
        # running sum is 1 exactly on the wanted bytes.
        marks = np.zeros(len(blob) + 1, dtype=np.int8)
        marks[starts] += 1
        marks[starts + lens] -= 1
        data = blob[np.cumsum(marks[: len(blob)], dtype=np.int8).view(np.bool_)]
    validity = None if bool(valid.all()) else pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(
        pa.binary(),
        n,
        [validity, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)],
        null_count=n - int(valid.sum()),
    )


def _contiguous(keep: npt.NDArray[np.bool_]) -> bool:
    """True if the kept records are one run (a range cuts a batch only at its ends)."""
    idx = np.flatnonzero(keep)
    return len(idx) > 0 and int(idx[-1]) - int(idx[0]) + 1 == len(idx)


def decode_batches(
    batches: Sequence[RecordBatch],
    topic: str,
    partition: int,
    start: int,
    end: int,
    schema: pa.Schema,
) -> pa.RecordBatch | None:
    """One Arrow batch of the data records of ``batches`` with ``start <= offset < end``; None if there are none.

    Control batches are skipped (read_committed fetches never contain them;
    read_uncommitted ones do). With a ``headers`` field in ``schema`` the
    headers column is filled (null for a record without headers, as Spark's
    Kafka source does).
    """
    include_headers = "headers" in schema.names
    parts: list[tuple[_Decoded, npt.NDArray[np.bool_]]] = []
    for batch in batches:
        if batch.control or batch.record_count <= 0:
            continue
        last = batch.base_offset + batch.record_count
        if last <= start or batch.base_offset >= end:
            continue
        decoded = _decode_one(batch)
        keep = (decoded.offsets >= start) & (decoded.offsets < end)
        if keep.any():
            parts.append((decoded, keep))
    if not parts:
        return None
    keys: list[pa.Array] = []
    values: list[pa.Array] = []
    offsets: list[IntArray] = []
    stamps: list[IntArray] = []
    types: list[npt.NDArray[np.int32]] = []
    header_lists: list[list[tuple[str, bytes]] | None] = []
    for d, keep in parts:
        whole = bool(keep.all())
        sel = slice(None) if whole else keep
        # a uniform batch's rows are evenly spaced also after a filter that keeps a contiguous run
        row_size = d.row_size if whole or _contiguous(keep) else 0
        keys.append(_binary(d.blob, d.key_start[sel], d.key_len[sel], row_size))
        values.append(_binary(d.blob, d.value_start[sel], d.value_len[sel], row_size))
        offsets.append(d.offsets[sel])
        stamps.append(d.timestamps[sel])
        types.append(np.full(len(offsets[-1]), d.timestamp_type, dtype=np.int32))
        if include_headers:
            if d.headers is None:
                header_lists.extend([None] * len(offsets[-1]))
            else:
                header_lists.extend(h for h, k in zip(d.headers, keep, strict=True) if k)
    n = sum(len(o) for o in offsets)
    columns: list[pa.Array] = [
        pa.concat_arrays(keys) if len(keys) > 1 else keys[0],
        pa.concat_arrays(values) if len(values) > 1 else values[0],
        pa.repeat(pa.scalar(topic, type=pa.string()), n),
        pa.array(np.full(n, partition, dtype=np.int32)),
        pa.array(np.concatenate(offsets)),
        pa.array(np.concatenate(stamps) * 1000, type=pa.timestamp("us", tz="UTC")),
        pa.array(np.concatenate(types)),
    ]
    if include_headers:
        columns.append(
            pa.array(
                [None if not h else [{"key": k, "value": v} for k, v in h] for h in header_lists], type=HEADERS_TYPE
            )
        )
    return pa.RecordBatch.from_arrays(columns, schema=schema)
