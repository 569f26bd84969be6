"""Kafka's v2 record batches (magic 2): validate on produce, read records when another protocol asks.

What Kafka clients produce and fetch is Kafka's batch format, not Sluice's
(docs/wire-format.md). This module is the broker's view of it:

* :func:`split_batches` walks a Produce ``records`` field: it checks each
  batch's length, refuses magic < 2 the way Kafka 4 does (INVALID_RECORD:
  KIP-724 dropped message formats v0/v1) and verifies the CRC-32C, which covers
  everything from ``attributes`` to the end (CORRUPT_MESSAGE on a mismatch). It
  reads the 61-byte header only; records are never decoded on this path.
* :func:`iter_records` decodes the varint records of one batch (decompressing
  gzip, lz4 or zstd first) into plain tuples: the readable definition of the
  format, which the tests hold the conversion to.
* :func:`to_sluice_batch` converts a batch into Sluice's own RecordBatch on the
  produce path, in one in-line loop (:func:`_to_sluice_records`); the design
  note in docs/kafka-compatibility.md measures what it costs against storing
  the v2 bytes as sent.

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

import gzip
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import crc32c as _crc32c
import lz4.frame
import zstandard

from sluice import errors
from sluice.api.v1 import records_pb2
from sluice.records import RECORD_STRUCT, RecordBatch, RecordDecodeError, decompress, read_headers, serialize_encoded

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
# Sluice's encoding of a record header's key and value lengths (sluice.records)
_HEADER_KEY = struct.Struct(">H")
_HEADER_VALUE = struct.Struct(">i")
_CRC_START = 21
_MAGIC_AT = 16
_LENGTH_AT = 8

COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD = range(5)
# Kafka's codec ids -> Sluice's (records.proto Compression); snappy has no Sluice codec yet.
_TO_SLUICE_COMPRESSION = {
    COMPRESSION_NONE: records_pb2.COMPRESSION_NONE,
    COMPRESSION_GZIP: records_pb2.COMPRESSION_GZIP,
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


def _decompress(codec: int, data: bytes) -> bytes:
    if codec == COMPRESSION_NONE:
        return data
    if codec == COMPRESSION_GZIP:
        return gzip.decompress(data)
    if codec == COMPRESSION_LZ4:
        return bytes(lz4.frame.decompress(data))
    if codec == COMPRESSION_ZSTD:
        return bytes(zstandard.ZstdDecompressor().decompressobj().decompress(data))
    raise errors.UnsupportedCompressionTypeError(f"Kafka compression codec {codec} is not supported yet")


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint (Kafka's record fields) at ``pos``: (value, next position)."""
    raw = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if not b & 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7
        if shift > 63:
            raise errors.CorruptMessageError("varint longer than 64 bits")


Header = tuple[str, bytes | None]
KafkaRecord = tuple[int, int, bytes | None, bytes | None, list[Header]]  # offset delta, timestamp, key, value


def iter_records(header: BatchHeader, batch: bytes | memoryview) -> Iterator[KafkaRecord]:
    """The records of one validated batch: (offset_delta, timestamp, key, value, headers)."""
    buf = _decompress(header.compression, bytes(batch[HEADER_SIZE:]))
    pos = 0
    try:
        for _ in range(header.record_count):
            length, pos = _varint(buf, pos)
            end = pos + length
            pos += 1  # record attributes (unused)
            ts_delta, pos = _varint(buf, pos)
            offset_delta, pos = _varint(buf, pos)
            klen, pos = _varint(buf, pos)
            key = None if klen < 0 else buf[pos : pos + klen]
            pos += max(klen, 0)
            vlen, pos = _varint(buf, pos)
            value = None if vlen < 0 else buf[pos : pos + vlen]
            pos += max(vlen, 0)
            count, pos = _varint(buf, pos)
            headers: list[Header] = []
            for _ in range(count):
                hklen, pos = _varint(buf, pos)
                hkey = buf[pos : pos + hklen].decode()
                pos += hklen
                hvlen, pos = _varint(buf, pos)
                hvalue = None if hvlen < 0 else buf[pos : pos + hvlen]
                pos += max(hvlen, 0)
                headers.append((hkey, hvalue))
            if pos != end or end > len(buf):
                raise errors.CorruptMessageError(f"record of {length} bytes does not match its fields")
            yield offset_delta, header.base_timestamp + ts_delta, key, value, headers
    except (IndexError, UnicodeDecodeError) as exc:
        raise errors.CorruptMessageError(f"undecodable record: {exc}") from None


def to_sluice_batch(header: BatchHeader, batch: bytes | memoryview) -> RecordBatch:
    """The same records as a Sluice RecordBatch (same producer fields, same codec where Sluice has it)."""
    if header.control:
        raise errors.InvalidRecordError("control batches are written by brokers, not converted")
    buf = _decompress(header.compression, bytes(batch[HEADER_SIZE:]))
    try:
        raw, first_ts, max_ts = _to_sluice_records(buf, header.record_count, header.base_timestamp)
    except (IndexError, UnicodeDecodeError, struct.error) as exc:
        raise errors.CorruptMessageError(f"undecodable record: {exc}") from None
    head, records = serialize_encoded(
        raw,
        header.record_count,
        first_ts,
        max_ts,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        transactional=header.transactional,
        compression=_TO_SLUICE_COMPRESSION.get(header.compression, records_pb2.COMPRESSION_NONE),
    )
    return RecordBatch.FromString(head + records)


class RecordRefusedError(errors.InvalidRecordError):
    """One record of a batch cannot be stored: INVALID_RECORD, with the record's index in its batch.

    Produce v8+ names the record (KIP-467's ``record_errors``); clients show that message where
    they show nothing for the partition's (librdkafka printed only "Broker failed to validate record").
    """

    def __init__(self, record_index: int, message: str) -> None:
        super().__init__(message)
        self.record_index = record_index


def _to_sluice_records(buf: bytes, count: int, base_ts: int) -> tuple[bytes, int, int]:
    """``count`` v2 records straight into Sluice's record encoding: (blob, first timestamp, max timestamp).

    The produce path of every Kafka client runs through here, so it is one loop without a
    generator, a tuple per record or a call per field: a varint of one byte (nearly every
    length and delta) is decoded in line, longer ones by :func:`_varint`; key and value are
    sliced once. This made the conversion about 3x faster than decoding with
    :func:`iter_records` and re-encoding with BatchBuilder (bench note in
    docs/kafka-compatibility.md). Records with headers take :func:`_headers`.
    """
    pack = RECORD_STRUCT.pack
    varint = _varint
    parts: list[bytes] = []
    add = parts.append
    pos = 0
    first_ts = max_ts = 0
    for index in range(count):
        b = buf[pos]
        if b < 0x80:
            length, pos = (b >> 1) ^ -(b & 1), pos + 1
        elif buf[pos + 1] < 0x80:  # records of 64 bytes to 8 KiB: two bytes
            raw = (b & 0x7F) | (buf[pos + 1] << 7)
            length, pos = (raw >> 1) ^ -(raw & 1), pos + 2
        else:
            length, pos = varint(buf, pos)
        end = pos + length
        b = buf[pos + 1]  # after the record's attributes byte (unused)
        if b < 0x80:
            ts_delta, pos = (b >> 1) ^ -(b & 1), pos + 2
        elif buf[pos + 2] < 0x80:  # a batch spanning 64 ms to 8 s: two bytes
            raw = (b & 0x7F) | (buf[pos + 2] << 7)
            ts_delta, pos = (raw >> 1) ^ -(raw & 1), pos + 3
        else:
            ts_delta, pos = varint(buf, pos + 1)
        b = buf[pos]
        if b < 0x80:
            offset_delta, pos = (b >> 1) ^ -(b & 1), pos + 1
        else:
            offset_delta, pos = varint(buf, pos)
        if offset_delta != index:
            raise errors.InvalidRecordError(f"offset delta {offset_delta} where {index} was expected")
        b = buf[pos]
        if b < 0x80:
            klen, pos = (b >> 1) ^ -(b & 1), pos + 1
        else:
            klen, pos = varint(buf, pos)
        key_at = pos
        if klen > 0:
            pos += klen
        b = buf[pos]
        if b < 0x80:
            vlen, pos = (b >> 1) ^ -(b & 1), pos + 1
        elif buf[pos + 1] < 0x80:  # values of 64 bytes to 8 KiB: two bytes
            raw = (b & 0x7F) | (buf[pos + 1] << 7)
            vlen, pos = (raw >> 1) ^ -(raw & 1), pos + 2
        else:
            vlen, pos = varint(buf, pos)
        value_at = pos
        if vlen > 0:
            pos += vlen
        b = buf[pos]
        if b < 0x80:
            hcount, pos = (b >> 1) ^ -(b & 1), pos + 1
        else:
            hcount, pos = varint(buf, pos)
        ts = base_ts + ts_delta
        if index == 0:
            first_ts = max_ts = ts
        elif ts > max_ts:
            max_ts = ts
        add(pack(index, ts - first_ts, klen, vlen, hcount))
        if klen > 0:
            add(buf[key_at : key_at + klen])
        if vlen > 0:
            add(buf[value_at : value_at + vlen])
        if hcount:
            try:
                encoded, pos = _headers(buf, pos, hcount)
            except errors.InvalidRecordError as exc:
                raise RecordRefusedError(index, f"record {index} of the batch: {exc.message}") from None
            add(encoded)
        if pos != end or end > len(buf) or klen < -1 or vlen < -1 or hcount < 0:
            raise errors.CorruptMessageError(f"record of {length} bytes does not match its fields")
    return b"".join(parts), first_ts, max_ts


def _headers(buf: bytes, pos: int, count: int) -> tuple[bytes, int]:
    """``count`` v2 record headers at ``pos`` in Sluice's header encoding, and the position after them."""
    out = bytearray()
    for _ in range(count):
        hklen, pos = _varint(buf, pos)
        if hklen < 0:
            raise errors.CorruptMessageError("a record header without a key")
        hkey = buf[pos : pos + hklen]
        hkey.decode()  # a header key is a string: refuse what is not UTF-8 here, as iter_records does
        pos += hklen
        hvlen, pos = _varint(buf, pos)
        if hvlen < 0:
            raise errors.InvalidRecordError(
                f"header {hkey.decode()!r} has a null value, which Sluice cannot store yet (its record format "
                "has no null header value): send an empty value, or leave the header out"
            )
        out += _HEADER_KEY.pack(hklen) + hkey + _HEADER_VALUE.pack(hvlen) + buf[pos : pos + hvlen]
        pos += hvlen
    return bytes(out), pos


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


def to_v2_batch(batch: RecordBatch) -> bytes:
    """A stored Sluice batch as the Kafka v2 batch a Kafka consumer fetches (same offsets, keys,
    values, headers and timestamps; control and transactional flags kept).

    The records are written uncompressed: re-compressing on the fetch path would add the
    codec's cost to the conversion's, and Kafka clients accept any codec per batch.
    """
    first_ts, base = batch.first_timestamp, batch.base_offset
    records = _to_v2_records(batch)
    attributes = COMPRESSION_NONE
    if batch.timestamp_type == records_pb2.LOG_APPEND_TIME:
        attributes |= 0x08
    if batch.transactional:
        attributes |= 0x10
    if batch.control:
        attributes |= 0x20
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
