"""Kafka's v2 record batches (magic 2): validate on produce, read records when another protocol asks.

What Kafka clients produce and fetch is Kafka's batch format, not Sluice's
(docs/wire-format.md). This module is the broker's view of it:

* :func:`split_batches` walks a Produce ``records`` field: it checks each
  batch's length, refuses magic < 2 the way Kafka 4 does (INVALID_RECORD:
  KIP-724 dropped message formats v0/v1) and verifies the CRC-32C, which covers
  everything from ``attributes`` to the end (CORRUPT_MESSAGE on a mismatch). It
  reads the 61-byte header only; records are never decoded on this path.
* :func:`to_stored_batch` puts a produced batch into Sluice's envelope as it
  came (``records_format`` KAFKA_V2: the records section as sent, compressed as
  sent, the batch's own CRC), so Produce copies and converts no record (the core
  reads them once, :mod:`sluice.broker.log.record_check`), and
  :func:`to_v2_batch` gives it back byte for byte to a Kafka consumer. Batches
  that gRPC clients produced in Sluice's record encoding are converted to v2 on
  that path, record by record (:func:`_to_v2_records`).
* :func:`iter_records` decodes the varint records of one batch (decompressing
  gzip, snappy, lz4 or zstd first) into plain tuples: the readable definition of the
  format.

Layout (all big-endian; Kafka's DefaultRecordBatch)::

    0  int64 baseOffset        8  int32 batchLength (bytes after this field)
    12 int32 partitionLeaderEpoch   16 int8 magic (2)   17 uint32 crc
    21 int16 attributes        23 int32 lastOffsetDelta   27 int64 baseTimestamp
    35 int64 maxTimestamp      43 int64 producerId   51 int16 producerEpoch
    53 int32 baseSequence      57 int32 recordCount  61 records...

attributes: bits 0-2 compression (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd),
bit 3 timestamp type (LogAppendTime), bit 4 transactional, bit 5 control.
"""

from __future__ import annotations

import contextlib
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import crc32c as _crc32c

from sluice import errors
from sluice.api.v1 import records_pb2
from sluice.broker.kafka_wire import codec
from sluice.records import (
    KAFKA_V2,
    RECORD_STRUCT,
    V2_HEADER,
    RecordBatch,
    RecordDecodeError,
    decompress,
    iter_v2_records,
    read_headers,
    v2_attributes,
    v2_crc_header,
)

HEADER = V2_HEADER
HEADER_SIZE = HEADER.size  # 61
_CRC_START = 21
_MAGIC_AT = 16
_LENGTH_AT = 8

COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD = range(5)
# Kafka's codec ids -> Sluice's (records.proto Compression, the same numbers)
_STORED_COMPRESSION = {
    COMPRESSION_NONE: records_pb2.COMPRESSION_NONE,
    COMPRESSION_GZIP: records_pb2.COMPRESSION_GZIP,
    COMPRESSION_SNAPPY: records_pb2.COMPRESSION_SNAPPY,
    COMPRESSION_LZ4: records_pb2.COMPRESSION_LZ4,
    COMPRESSION_ZSTD: records_pb2.COMPRESSION_ZSTD,
}


@dataclass(frozen=True, slots=True)
class BatchHeader:
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def compression(self) -> int:
        return self.attributes & 0x07

    @property
    def log_append_time(self) -> bool:
        return bool(self.attributes & 0x08)

    @property
    def transactional(self) -> bool:
        return bool(self.attributes & 0x10)

    @property
    def control(self) -> bool:
        return bool(self.attributes & 0x20)


def split_batches(data: bytes | memoryview) -> list[tuple[BatchHeader, memoryview]]:
    """Every batch of a Produce partition's ``records``: (header, the whole batch's bytes), validated."""
    view = memoryview(data)
    out: list[tuple[BatchHeader, memoryview]] = []
    pos = 0
    while pos < len(view):
        if len(view) - pos < _MAGIC_AT + 1:
            raise errors.CorruptMessageError(f"{len(view) - pos} bytes at offset {pos} are too short for a batch")
        magic = view[pos + _MAGIC_AT]
        if magic != 2:
            raise errors.InvalidRecordError(
                f"record batches of magic {magic} are not accepted: only magic 2 (Kafka 0.11+ clients)"
            )
        if len(view) - pos < HEADER_SIZE:
            raise errors.CorruptMessageError(f"a batch header needs {HEADER_SIZE} bytes, {len(view) - pos} left")
        (length,) = struct.unpack_from(">i", view, pos + _LENGTH_AT)
        end = pos + 12 + length
        if length < HEADER_SIZE - 12 or end > len(view):
            raise errors.CorruptMessageError(f"batch length {length} at offset {pos} does not fit the data")
        header = BatchHeader(*HEADER.unpack_from(view, pos))
        batch = view[pos:end]
        if _crc32c.crc32c(batch[_CRC_START:]) != header.crc:
            raise errors.CorruptMessageError(f"CRC-32C mismatch in the batch at offset {pos}")
        if header.record_count < 0 or header.last_offset_delta < 0:
            raise errors.CorruptMessageError("negative record count or offset delta")
        out.append((header, batch))
        pos = end
    return out


def _decompressed(header: BatchHeader, section: bytes) -> bytes:
    """A batch's records section, decompressed (CORRUPT_MESSAGE if it cannot be)."""
    try:
        return decompress(section, header.compression)
    except RecordDecodeError as exc:
        raise errors.CorruptMessageError(str(exc)) from None


Header = tuple[str, bytes | None]
KafkaRecord = tuple[int, int, bytes | None, bytes | None, list[Header]]  # offset delta, timestamp, key, value


def iter_records(header: BatchHeader, batch: bytes | memoryview) -> Iterator[KafkaRecord]:
    """The records of one validated batch: (offset_delta, timestamp, key, value, headers)."""
    buf = _decompressed(header, bytes(batch[HEADER_SIZE:]))
    try:
        for offset_delta, ts_delta, key, value, headers in iter_v2_records(buf, header.record_count):
            yield offset_delta, header.base_timestamp + ts_delta, key, value, headers
    except (IndexError, UnicodeDecodeError, RecordDecodeError) as exc:
        raise errors.CorruptMessageError(f"undecodable record: {exc}") from None


def to_stored_batch(header: BatchHeader, batch: bytes | memoryview) -> RecordBatch:
    """A produced v2 batch as Sluice stores it: its records section as sent (compressed as sent), in
    Sluice's envelope with the header's fields and its own CRC (``records_format`` KAFKA_V2).

    No record is copied, converted or read here: the core checks the records of every produced v2
    batch, whichever protocol brought it (:mod:`sluice.broker.log.record_check`). Attribute bits
    above the control bit are refused: the stored batch keeps only the ones it rebuilds the header
    from.
    """
    if header.control:
        raise errors.InvalidRecordError("control batches are written by brokers, not produced")
    if header.attributes & ~0x3F:
        raise errors.InvalidRecordError(
            f"batch attributes 0x{header.attributes:04x}: bits above the control bit (0x20) are not accepted "
            "from producers"
        )
    if header.compression not in _STORED_COMPRESSION:
        raise errors.UnsupportedCompressionTypeError(
            f"Kafka compression codec {header.compression} does not exist: "
            "none (0), gzip (1), snappy (2), lz4 (3) and zstd (4) do"
        )
    if header.record_count < 1 or header.last_offset_delta != header.record_count - 1:
        raise errors.InvalidRecordError(
            f"a batch of {header.record_count} records must end at offset delta {header.record_count - 1}, "
            f"not {header.last_offset_delta}"
        )
    return RecordBatch(
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        transactional=header.transactional,
        record_count=header.record_count,
        first_timestamp=header.base_timestamp,
        max_timestamp=header.max_timestamp,
        compression=_STORED_COMPRESSION[header.compression],
        timestamp_type=records_pb2.LOG_APPEND_TIME if header.log_append_time else records_pb2.CREATE_TIME,
        crc=header.crc,
        records=bytes(batch[HEADER_SIZE:]),
        records_format=KAFKA_V2,
    )


def _zigzag_slow(value: int) -> bytes:
    """``value`` as Kafka's zigzag varint (varint and varlong alike)."""
    raw = ((value << 1) ^ (value >> 63)) & ((1 << 64) - 1)
    out = bytearray()
    while raw >= 0x80:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


# Every value of at most two varint bytes, encoded once: record lengths, deltas, key and value
# lengths and header counts are nearly always this small, so the fetch path does a list look-up
# per field instead of a loop (about 2x faster conversion, measured in docs/kafka-compatibility.md).
_SMALL_LIMIT = 8192
_SMALL = [_zigzag_slow(v) for v in range(-_SMALL_LIMIT, _SMALL_LIMIT)]


def _zigzag(value: int) -> bytes:
    if -_SMALL_LIMIT <= value < _SMALL_LIMIT:
        return _SMALL[value + _SMALL_LIMIT]
    return _zigzag_slow(value)


_NULL = _zigzag(-1)


# A stored batch (records.proto's RecordBatch, as the broker serializes it: fields in number order)
# up to its records: fields 1-13 are varints (tag byte, then 1-10 bytes), field 14's tag is 0x72.
_VARINT_FIELD = rb"[\x08\x10\x18\x20\x28\x30\x38\x40\x48\x50\x58\x60\x68][\x80-\xff]{0,9}[\x00-\x7f]"
_UP_TO_RECORDS = re.compile(rb"(?:" + _VARINT_FIELD + rb")*\x72")


def stored_records(batch: RecordBatch, stored: bytes | None) -> bytes | memoryview:
    """The records section of a stored batch: a view into ``stored`` (its serialized form) when
    its layout is the one the broker writes, else ``batch.records`` (a copy: upb copies a bytes
    field on each read, 256 KiB for a batch of Kafka's perf tools)."""
    if stored is not None and (m := _UP_TO_RECORDS.match(stored)) is not None:
        reader = codec.Reader(stored, m.end())
        with contextlib.suppress(codec.DecodeError):  # a length past the end: not the broker's layout
            return reader.take(reader.uvarint())
    return batch.records


def v2_batch_parts(batch: RecordBatch, stored: bytes | None = None) -> tuple[bytes | memoryview, ...]:
    """A stored batch as the Kafka v2 batch a Kafka consumer fetches, as the parts to send in order.

    A batch a Kafka client produced is two: its 61-byte header and its records as sent, taken out
    of ``stored`` (the batch's serialized form, when at hand) without a copy (:func:`stored_records`).
    A batch in Sluice's record encoding is converted whole (:func:`to_v2_batch`).
    """
    if batch.records_format == KAFKA_V2:  # stored as a Kafka client sent it: back as it came
        records = stored_records(batch, stored)
        header = struct.pack(">qiibI", batch.base_offset, HEADER_SIZE - 12 + len(records),
                             batch.partition_leader_epoch, 2, batch.crc)  # fmt: skip
        return header + v2_crc_header(batch), records
    return (to_v2_batch(batch),)


def to_v2_batch(batch: RecordBatch) -> bytes:
    """A stored Sluice batch as the Kafka v2 batch a Kafka consumer fetches (same offsets, keys,
    values, headers and timestamps; control and transactional flags kept).

    The records are written uncompressed: re-compressing on the fetch path would add the
    codec's cost to the conversion's, and Kafka clients accept any codec per batch.
    """
    if batch.records_format == KAFKA_V2:  # stored as a Kafka client sent it: back as it came
        return b"".join(v2_batch_parts(batch))
    first_ts, base = batch.first_timestamp, batch.base_offset
    records = _to_v2_records(batch)
    attributes = v2_attributes(batch) & ~0x07  # the records are written uncompressed
    # Sluice spells "no producer id" -1 or 0; Kafka only -1, with epoch and sequence -1 too.
    if batch.producer_id > 0:
        pid, epoch, seq = batch.producer_id, batch.producer_epoch, batch.base_sequence
    else:
        pid, epoch, seq = -1, -1, -1
    after_crc = struct.pack(
        ">hiqqqhii", attributes, batch.record_count - 1, first_ts, batch.max_timestamp, pid, epoch, seq,
        batch.record_count,
    ) + records  # fmt: skip
    crc = _crc32c.crc32c(after_crc)
    length = HEADER_SIZE - 12 + len(records)
    return struct.pack(">qiibI", base, length, batch.partition_leader_epoch, 2, crc) + after_crc


def _to_v2_records(batch: RecordBatch) -> bytes:
    """The records of a stored Sluice batch in v2's varint encoding (the fetch path's loop).

    Like :func:`_to_sluice_records` on the produce path, one loop over the stored encoding
    (:data:`sluice.records.RECORD_STRUCT`) with no tuple per record: each record's fixed part is
    unpacked once and its varints come from the ``_SMALL`` table. A log-append-time batch gives
    every record the batch's max timestamp, as the Sluice reader does.
    """
    data = decompress(batch.records, batch.compression)
    unpack = RECORD_STRUCT.unpack_from
    fixed = RECORD_STRUCT.size
    zz = _zigzag
    log_append = batch.timestamp_type == records_pb2.LOG_APPEND_TIME
    append_delta = zz(batch.max_timestamp - batch.first_timestamp)
    pieces: list[bytes] = []
    pos = 0
    end = len(data)
    try:
        for _ in range(batch.record_count):
            delta, ts_delta, klen, vlen, hcount = unpack(data, pos)
            pos += fixed
            # attributes (unused, 0), timestamp delta, offset delta
            head = b"\x00" + (append_delta if log_append else zz(ts_delta)) + zz(delta)
            size = len(head)
            if klen >= 0:
                kvar = zz(klen)
                key = data[pos : pos + klen]
                pos += klen
                size += len(kvar) + klen
            else:
                kvar, key = _NULL, b""
                size += 1
            if vlen >= 0:
                vvar = zz(vlen)
                value = data[pos : pos + vlen]
                pos += vlen
                size += len(vvar) + vlen
            else:
                vvar, value = _NULL, b""
                size += 1
            count = zz(hcount)
            size += len(count)
            if hcount:
                encoded_headers, pos = _v2_headers(data, pos, hcount)
                size += len(encoded_headers)
                pieces += (zz(size), head, kvar, key, vvar, value, count, encoded_headers)
            else:
                pieces += (zz(size), head, kvar, key, vvar, value, count)
            if pos > end:
                raise RecordDecodeError("record runs past the end of the batch")
    except (struct.error, UnicodeDecodeError) as exc:
        raise RecordDecodeError(f"malformed records in batch at offset {batch.base_offset}: {exc}") from exc
    return b"".join(pieces)


def _v2_headers(data: bytes, pos: int, count: int) -> tuple[bytes, int]:
    """``count`` stored record headers at ``pos`` in v2's encoding, and the position after them."""
    headers, pos = read_headers(data, pos, count)
    out = bytearray()
    for hkey, hvalue in headers:
        encoded = hkey.encode()
        out += _zigzag(len(encoded)) + encoded + _zigzag(len(hvalue)) + hvalue
    return bytes(out), pos
