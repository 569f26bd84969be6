"""Record batches: the encoding of records, compression and the CRC-32C.

A :class:`RecordBatch` (proto) is a header the broker reads plus an opaque
``records`` blob only clients decode. The broker's hot path calls
:func:`verify_crc` and never :func:`decode_records`.

Record encoding inside the (uncompressed) blob, record after record, all
integers big-endian (documented for other languages in docs/wire-format.md)::

    int32  offset_delta      offset - base_offset
    int64  timestamp_delta   timestamp - first_timestamp
    int32  key_length        -1: null key
    int32  value_length      -1: null value (a tombstone)
    uint16 header_count
    bytes  key, bytes value
    header_count x (uint16 key_length, utf-8 key, int32 value_length, value)

Fixed-width fields rather than Kafka's varints: a little larger, but encoding
and decoding in Python are a single struct call per record, which is what
makes a Python client fast.

The CRC covers :data:`CRC_HEADER` (producer_id .. timestamp_type, the fields
the producer sets) followed by the compressed blob; base_offset and
partition_leader_epoch are assigned by the broker and are not covered.

A batch may instead carry Kafka's own encoding (``records_format`` RECORDS_FORMAT_KAFKA_V2):
the records section of a v2 RecordBatch exactly as a Kafka client sent it, compressed as sent,
with the v2 batch's own CRC (:func:`compute_crc` knows both definitions). The Kafka listener
stores what Kafka's producers send that way, so neither Produce nor a Kafka consumer's Fetch
touches a record; :func:`decode_record_tuples` reads both encodings, and :func:`to_sluice_format`
converts for clients that only read Sluice's.

Control batches (transaction markers) hold one record whose key is
``int16 version (0), int16 type (0 abort, 1 commit)`` and whose value is
``int16 version (0), int32 coordinator_epoch``, as Kafka's do.
"""

from __future__ import annotations

import struct
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import cramjam
import crc32c as _crc32c
import lz4.frame
import zstandard

from sluice.api.v1 import records_pb2
from sluice.api.v1.records_pb2 import RecordBatch

__all__ = [
    "CRC_HEADER",
    "KAFKA_V2",
    "RECORD_STRUCT",
    "V2_HEADER",
    "BatchBuilder",
    "Record",
    "RecordBatch",
    "build_batch",
    "compress",
    "control_batch",
    "decode_record_tuples",
    "decode_records",
    "decompress",
    "iter_v2_records",
    "parse_control",
    "read_headers",
    "read_v2_headers",
    "serialize_encoded",
    "to_sluice_format",
    "v2_attributes",
    "v2_crc_header",
    "varint",
    "verify_crc",
    "zigzag_varint",
]

CRC_HEADER = struct.Struct(">qiiBBiqqBB")
# A Kafka v2 batch's 61-byte header: base offset, batch length, partition leader epoch, magic, CRC,
# then the 40 bytes under the CRC (below).
V2_HEADER = struct.Struct(">qiibIhiqqqhii")
# A Kafka v2 batch's fields under its CRC: attributes, last offset delta, base and max timestamp,
# producer id, epoch, base sequence, record count (the 61-byte header's last 40 bytes).
V2_CRC_HEADER = struct.Struct(">hiqqqhii")
KAFKA_V2 = records_pb2.RECORDS_FORMAT_KAFKA_V2
_RECORD = RECORD_STRUCT = struct.Struct(">iqiiH")  # the fixed part of a record (see the module docstring)
_RECORD_SIZE = _RECORD.size
_pack_record = _RECORD.pack
_time_ns = time.time_ns
_HKEY = struct.Struct(">H")
_HVAL = struct.Struct(">i")
_TAG_RECORDS = b"\x72"  # RecordBatch.records: field 14, length-delimited
_CONTROL_KEY = struct.Struct(">hh")
_CONTROL_VALUE = struct.Struct(">hi")

NO_PRODUCER_ID = -1
NO_EPOCH = -1
NO_SEQUENCE = -1

COMPRESSION_NAMES = {
    None: records_pb2.COMPRESSION_NONE,
    "none": records_pb2.COMPRESSION_NONE,
    "gzip": records_pb2.COMPRESSION_GZIP,
    "snappy": records_pb2.COMPRESSION_SNAPPY,
    "lz4": records_pb2.COMPRESSION_LZ4,
    "zstd": records_pb2.COMPRESSION_ZSTD,
}

_ZSTD_C = zstandard.ZstdCompressor(level=3)
_ZSTD_D = zstandard.ZstdDecompressor()

Headers = Sequence[tuple[str, bytes]]


class RecordDecodeError(ValueError):
    """The records blob of a batch cannot be decoded."""


@dataclass(slots=True)
class Record:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] = field(default_factory=list)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def compression_code(name: str | None) -> int:
    try:
        return COMPRESSION_NAMES[name.lower() if name else None]
    except KeyError:
        raise ValueError(f"unsupported compression {name!r}: use None, 'gzip', 'snappy', 'lz4' or 'zstd'") from None


def compress(data: bytes, codec: int) -> bytes:
    if codec == records_pb2.COMPRESSION_NONE:
        return data
    if codec == records_pb2.COMPRESSION_LZ4:
        return bytes(lz4.frame.compress(data))
    if codec == records_pb2.COMPRESSION_ZSTD:
        return bytes(_ZSTD_C.compress(data))
    if codec == records_pb2.COMPRESSION_GZIP:
        return zlib.compress(data, 6, wbits=31)
    if codec == records_pb2.COMPRESSION_SNAPPY:
        return _snappy_compress(data)
    raise ValueError(f"unsupported compression codec {codec}")


# The most one compressed batch may expand to. Kafka streams a compressed batch's records; here a
# section is decompressed whole, so without a bound a 16 KiB zstd batch of zeros could ask for
# gigabytes (a decompression bomb). 64 MiB is far above what a producer's batch (batch.size,
# max.message.bytes) holds in practice.
MAX_DECOMPRESSED_BYTES = 64 * 1024 * 1024


def decompress(data: bytes, codec: int, limit: int = MAX_DECOMPRESSED_BYTES) -> bytes:
    """``data`` decompressed: all of it (every gzip member, every zstd or lz4 frame), at most
    ``limit`` bytes; RecordDecodeError if it is truncated, corrupt or expands past ``limit``."""
    try:
        if codec == records_pb2.COMPRESSION_NONE:
            return data
        if codec == records_pb2.COMPRESSION_LZ4:
            out = _frames(data, limit, lz4.frame.LZ4FrameDecompressor, 64 * 1024)
        elif codec == records_pb2.COMPRESSION_ZSTD:
            # a stream decoder: frames written by Kafka's Java clients carry no content size
            out = _frames(data, limit, _ZSTD_D.decompressobj, 512)
        elif codec == records_pb2.COMPRESSION_GZIP:
            out = _frames(data, limit, lambda: zlib.decompressobj(wbits=31), 16 * 1024)
        elif codec == records_pb2.COMPRESSION_SNAPPY:
            out = _snappy_decompress(data, limit)
        else:
            raise RecordDecodeError(f"unsupported compression codec {codec}")
    except RecordDecodeError:
        raise
    except Exception as exc:  # each codec raises its own error type
        raise RecordDecodeError(f"cannot decompress records: {exc}") from exc
    return out


def _frames(data: bytes, limit: int, decoder: Callable[[], Any], piece_size: int) -> bytes:
    """Every frame (gzip member, zstd or lz4 frame) of ``data``, one after another, at most ``limit`` bytes.

    Input is fed ``piece_size`` bytes at a time, sized by the codec's largest expansion (deflate
    about 1,000:1, lz4 255:1, zstd 32,000:1), so one call never expands past about 16 MiB and a
    bomb stops there. A frame that ends early is an error (zstd's and lz4's decoders would
    otherwise return what they have)."""
    out: list[bytes] = []
    total = 0
    rest = memoryview(data)
    while rest:
        d = decoder()
        while rest and not d.eof:
            piece, rest = rest[:piece_size], rest[piece_size:]
            chunk = d.decompress(bytes(piece))
            total += len(chunk)
            if total > limit:
                raise RecordDecodeError(f"the records expand past {limit} bytes (a decompression bomb?)")
            out.append(chunk)
        if not d.eof:
            raise RecordDecodeError("the compressed records end in the middle of a frame")
        tail = d.unused_data
        rest = memoryview(bytes(tail) + bytes(rest)) if tail else rest
    return b"".join(out)


def v2_attributes(batch: RecordBatch) -> int:
    """The attributes field of ``batch`` as a Kafka v2 batch header spells it.

    Sluice's compression numbers are Kafka's codec ids (none 0, gzip 1, snappy 2, lz4 3, zstd 4)."""
    attributes = int(batch.compression)
    if batch.timestamp_type == records_pb2.LOG_APPEND_TIME:
        attributes |= 0x08
    if batch.transactional:
        attributes |= 0x10
    if batch.control:
        attributes |= 0x20
    return attributes


def v2_crc_header(batch: RecordBatch) -> bytes:
    """The 40 bytes of a v2 header that its CRC covers, for a batch in Kafka's records format."""
    return V2_CRC_HEADER.pack(
        v2_attributes(batch),
        batch.record_count - 1,  # Kafka's producers number a batch's records 0..n-1 (checked on produce)
        batch.first_timestamp,
        batch.max_timestamp,
        batch.producer_id,
        batch.producer_epoch,
        batch.base_sequence,
        batch.record_count,
    )


# Snappy as Kafka's clients write it: the Java client (snappy-java's SnappyOutputStream) frames raw
# snappy blocks as xerial does: a 16-byte header (magic, version 1, compatible version 1), then
# blocks of int32 length + raw snappy of at most 32 KiB of input each. librdkafka writes one raw
# snappy block without the header. Both are read; Sluice writes xerial's framing.
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK = 32 * 1024
_BLOCK_LENGTH = struct.Struct(">i")


def _snappy_compress(data: bytes) -> bytes:
    out = [_XERIAL_HEADER]
    for start in range(0, len(data), _XERIAL_BLOCK):
        block = bytes(cramjam.snappy.compress_raw(data[start : start + _XERIAL_BLOCK]))
        out += (_BLOCK_LENGTH.pack(len(block)), block)
    return b"".join(out)


def _snappy_decompress(data: bytes, limit: int) -> bytes:
    if not data.startswith(_XERIAL_MAGIC):
        _check_snappy_length(data, 0, limit)
        return bytes(cramjam.snappy.decompress_raw(data))
    out: list[bytes] = []
    pos = len(_XERIAL_HEADER)
    total = 0
    while pos < len(data):
        (length,) = _BLOCK_LENGTH.unpack_from(data, pos)
        pos += 4
        if length < 0 or pos + length > len(data):
            raise RecordDecodeError(f"a snappy block of {length} bytes runs past the data")
        block = data[pos : pos + length]
        total = _check_snappy_length(block, total, limit)
        out.append(bytes(cramjam.snappy.decompress_raw(block)))
        pos += length
    return b"".join(out)


def _check_snappy_length(block: bytes, total: int, limit: int) -> int:
    """``total`` plus the length a raw snappy block declares, checked against ``limit`` before decoding."""
    total += int(cramjam.snappy.decompress_raw_len(block))
    if total > limit:
        raise RecordDecodeError(f"the records expand past {limit} bytes (a decompression bomb?)")
    return total


def compute_crc(batch: RecordBatch) -> int:
    if batch.records_format == KAFKA_V2:
        return int(_crc32c.crc32c(batch.records, _crc32c.crc32c(v2_crc_header(batch))))
    return _crc(
        batch.producer_id,
        batch.producer_epoch,
        batch.base_sequence,
        batch.transactional,
        batch.control,
        batch.record_count,
        batch.first_timestamp,
        batch.max_timestamp,
        batch.compression,
        batch.timestamp_type,
        batch.records,
    )


def _crc(
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    transactional: bool,
    control: bool,
    record_count: int,
    first_timestamp: int,
    max_timestamp: int,
    compression: int,
    timestamp_type: int,
    records: bytes,
) -> int:
    head = CRC_HEADER.pack(
        producer_id,
        producer_epoch,
        base_sequence,
        transactional,
        control,
        record_count,
        first_timestamp,
        max_timestamp,
        compression,
        timestamp_type,
    )
    return int(_crc32c.crc32c(records, _crc32c.crc32c(head)))


def varint(value: int) -> bytes:
    """Protobuf's base-128 varint of a non-negative int."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def verify_crc(batch: RecordBatch) -> bool:
    try:
        return compute_crc(batch) == batch.crc
    except struct.error:  # a header field outside its packed range cannot be a valid batch
        return False


class BatchBuilder:
    """Accumulates records for one partition; :meth:`build` seals them into a batch.

    Used by the producer's accumulator: ``size`` is the encoded size so far,
    compared against batch.size before the next append. :meth:`append` is the
    producer's per-record hot path: one ``struct`` call and two list appends
    for a record without headers.
    """

    __slots__ = ("_first_ts", "_max_ts", "_parts", "count", "size")

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._first_ts = -1
        self._max_ts = -1
        self.count = 0
        self.size = 0

    def append(
        self,
        key: bytes | None,
        value: bytes | None,
        headers: Headers | None = None,
        timestamp: int | None = None,
    ) -> int:
        """Append one record; returns its index (offset delta) in the batch."""
        ts = _time_ns() // 1_000_000 if timestamp is None else timestamp
        index = self.count
        if index == 0:
            self._first_ts = self._max_ts = ts
        elif ts > self._max_ts:
            self._max_ts = ts
        if headers:
            self._append_with_headers(index, ts, key, value, headers)
        else:
            parts = self._parts
            if key is None:
                if value is None:
                    parts.append(_pack_record(index, ts - self._first_ts, -1, -1, 0))
                    self.size += _RECORD_SIZE
                else:
                    parts.append(_pack_record(index, ts - self._first_ts, -1, len(value), 0))
                    parts.append(value)
                    self.size += _RECORD_SIZE + len(value)
            else:
                vlen = -1 if value is None else len(value)
                parts.append(_pack_record(index, ts - self._first_ts, len(key), vlen, 0))
                parts.append(key)
                if value is not None:
                    parts.append(value)
                self.size += _RECORD_SIZE + len(key) + (vlen if vlen > 0 else 0)
        self.count = index + 1
        return index

    def _append_with_headers(
        self, index: int, ts: int, key: bytes | None, value: bytes | None, headers: Headers
    ) -> None:
        klen = -1 if key is None else len(key)
        vlen = -1 if value is None else len(value)
        parts = self._parts
        parts.append(_pack_record(index, ts - self._first_ts, klen, vlen, len(headers)))
        size = _RECORD_SIZE
        if key is not None:
            parts.append(key)
            size += klen
        if value is not None:
            parts.append(value)
            size += vlen
        for hk, hv in headers:
            kb = hk.encode()
            parts.append(_HKEY.pack(len(kb)) + kb + _HVAL.pack(len(hv)) + hv)
            size += 6 + len(kb) + len(hv)
        self.size += size

    def build(
        self,
        *,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = NO_EPOCH,
        base_sequence: int = NO_SEQUENCE,
        transactional: bool = False,
        compression: int = records_pb2.COMPRESSION_NONE,
    ) -> RecordBatch:
        head, records = self.build_serialized(
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=base_sequence,
            transactional=transactional,
            compression=compression,
        )
        return RecordBatch.FromString(head + records)

    def build_serialized(
        self,
        *,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = NO_EPOCH,
        base_sequence: int = NO_SEQUENCE,
        transactional: bool = False,
        compression: int = records_pb2.COMPRESSION_NONE,
    ) -> tuple[bytes, bytes]:
        """The batch serialized, as ``(head, records)``: ``head + records`` is the RecordBatch message.

        ``records`` is the (compressed) records blob, ``head`` every other
        field plus the blob's tag and length (``records`` is the last field,
        so this is exactly protobuf's serialization). The blob is never copied
        into a message: the producer sends the two pieces as they are.
        """
        if self.count == 0:
            raise ValueError("an empty batch cannot be built")
        return serialize_encoded(
            b"".join(self._parts),
            self.count,
            self._first_ts,
            self._max_ts,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=base_sequence,
            transactional=transactional,
            compression=compression,
        )


def serialize_encoded(
    raw: bytes,
    count: int,
    first_ts: int,
    max_ts: int,
    *,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    transactional: bool = False,
    compression: int = records_pb2.COMPRESSION_NONE,
) -> tuple[bytes, bytes]:
    """A batch of ``count`` records already in Sluice's record encoding, as BatchBuilder.build_serialized.

    For a writer that encodes records itself (the Kafka listener converts v2 records straight
    into this encoding): ``raw`` is the uncompressed records blob, ``first_ts``/``max_ts`` the
    first record's and the largest timestamp.
    """
    records = compress(raw, compression)
    crc = _crc(
        producer_id,
        producer_epoch,
        base_sequence,
        transactional,
        False,
        count,
        first_ts,
        max_ts,
        compression,
        records_pb2.CREATE_TIME,
        records,
    )
    header = RecordBatch(
        base_offset=0,
        partition_leader_epoch=-1,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        transactional=transactional,
        control=False,
        record_count=count,
        first_timestamp=first_ts,
        max_timestamp=max_ts,
        compression=compression,  # type: ignore[arg-type]
        timestamp_type=records_pb2.CREATE_TIME,
        crc=crc,
    )
    return header.SerializeToString() + _TAG_RECORDS + varint(len(records)), records


def build_batch(
    records: Iterable[tuple[bytes | None, bytes | None]]
    | Iterable[tuple[bytes | None, bytes | None, Headers | None, int | None]],
    **header: int | bool,
) -> RecordBatch:
    """A batch from (key, value[, headers, timestamp]) tuples; keyword args as BatchBuilder.build."""
    builder = BatchBuilder()
    for rec in records:
        builder.append(*rec)
    return builder.build(**header)  # type: ignore[arg-type]


def decode_records(batch: RecordBatch) -> list[Record]:
    """Decode the records of a (data) batch with their absolute offsets and timestamps."""
    return [Record(*rec) for rec in decode_record_tuples(batch)]


RecordTuple = tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes]]]


def read_headers(data: bytes, pos: int, count: int) -> tuple[list[tuple[str, bytes]], int]:
    """``count`` record headers (key, value) encoded at ``pos``, and the position after them.

    Raises struct.error or UnicodeDecodeError on malformed bytes; callers turn
    those into RecordDecodeError with the batch's offset.
    """
    headers: list[tuple[str, bytes]] = []
    for _ in range(count):
        (hk,) = _HKEY.unpack_from(data, pos)
        pos += 2
        hkey = data[pos : pos + hk].decode()
        pos += hk
        (hv,) = _HVAL.unpack_from(data, pos)
        pos += 4
        headers.append((hkey, data[pos : pos + hv]))
        pos += hv
    return headers, pos


def decode_record_tuples(batch: RecordBatch, min_offset: int = 0) -> list[RecordTuple]:
    """The records of a (data) batch as ``(offset, timestamp, key, value, headers)`` tuples.

    The consumer's hot path: no object per record beyond the tuple, the key
    and value slices and the headers list. Records below ``min_offset`` are
    decoded (to step over them) but not returned.
    """
    if batch.records_format == KAFKA_V2:
        return _decode_v2_tuples(batch, min_offset)
    data = decompress(batch.records, batch.compression)
    out: list[RecordTuple] = []
    append = out.append
    pos = 0
    end = len(data)
    base = batch.base_offset
    first_ts = batch.first_timestamp
    log_append = batch.timestamp_type == records_pb2.LOG_APPEND_TIME
    max_ts = batch.max_timestamp
    unpack = _RECORD.unpack_from
    size = _RECORD_SIZE
    try:
        for _ in range(batch.record_count):
            delta, ts_delta, klen, vlen, hcount = unpack(data, pos)
            pos += size
            if klen >= 0:
                key: bytes | None = data[pos : pos + klen]
                pos += klen
            else:
                key = None
            if vlen >= 0:
                value: bytes | None = data[pos : pos + vlen]
                pos += vlen
            else:
                value = None
            if hcount:
                headers, pos = read_headers(data, pos, hcount)
            else:
                headers = []
            if pos > end:
                raise RecordDecodeError("record runs past the end of the batch")
            offset = base + delta
            if offset >= min_offset:
                append((offset, max_ts if log_append else first_ts + ts_delta, key, value, headers))
    except (struct.error, UnicodeDecodeError) as exc:
        raise RecordDecodeError(f"malformed records in batch at offset {base}: {exc}") from exc
    return out


def zigzag_varint(buf: bytes, pos: int) -> tuple[int, int]:
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
            raise RecordDecodeError("varint longer than 64 bits")


V2Record = tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]


def read_v2_headers(buf: bytes, pos: int, count: int) -> tuple[list[tuple[str, bytes | None]], int]:
    """``count`` v2 record headers at ``pos`` (values None where Kafka's are null), and the position after."""
    headers: list[tuple[str, bytes | None]] = []
    for _ in range(count):
        klen, pos = zigzag_varint(buf, pos)
        if klen < 0:
            raise RecordDecodeError("a record header without a key")
        key = buf[pos : pos + klen].decode(errors="replace")  # as Java decodes it: never refused
        pos += klen
        vlen, pos = zigzag_varint(buf, pos)
        headers.append((key, None if vlen < 0 else buf[pos : pos + vlen]))
        pos += max(vlen, 0)
    return headers, pos


def iter_v2_records(buf: bytes, count: int) -> Iterator[V2Record]:
    """``count`` records of a v2 records section (uncompressed): (offset delta, timestamp delta, key,
    value, headers), header values None where Kafka's are null. Raises RecordDecodeError, IndexError
    or UnicodeDecodeError on malformed bytes."""
    varint = zigzag_varint
    pos = 0
    for _ in range(count):
        length, pos = varint(buf, pos)
        end = pos + length
        pos += 1  # the record's attributes (unused)
        ts_delta, pos = varint(buf, pos)
        offset_delta, pos = varint(buf, pos)
        klen, pos = varint(buf, pos)
        key = None if klen < 0 else buf[pos : pos + klen]
        pos += max(klen, 0)
        vlen, pos = varint(buf, pos)
        value = None if vlen < 0 else buf[pos : pos + vlen]
        pos += max(vlen, 0)
        hcount, pos = varint(buf, pos)
        headers, pos = read_v2_headers(buf, pos, hcount) if hcount else ([], pos)
        if pos != end or end > len(buf) or hcount < 0:
            raise RecordDecodeError(f"record of {length} bytes does not match its fields")
        yield offset_delta, ts_delta, key, value, headers


def _decode_v2_tuples(batch: RecordBatch, min_offset: int) -> list[RecordTuple]:
    """:func:`decode_record_tuples` for a batch in Kafka's records format.

    The consumer's hot path for what Kafka clients produced, so one loop in the style of the Sluice
    encoding's: varints of one byte (deltas, header counts, short keys) and of two (record and value
    lengths from 64 bytes to 8 KiB) are decoded in line, longer ones by :func:`zigzag_varint`.
    :func:`iter_v2_records` is the plain definition the tests hold this to. A null header value
    (which Kafka's format has and Sluice's records do not) reads as empty.
    """
    data = decompress(batch.records, batch.compression)
    base, base_ts = batch.base_offset, batch.first_timestamp
    log_append = batch.timestamp_type == records_pb2.LOG_APPEND_TIME
    max_ts = batch.max_timestamp
    varint = zigzag_varint
    out: list[RecordTuple] = []
    append = out.append
    size = len(data)
    pos = 0
    try:
        for _ in range(batch.record_count):
            b = data[pos]
            if b < 0x80:
                length, pos = (b >> 1) ^ -(b & 1), pos + 1
            elif data[pos + 1] < 0x80:
                raw = (b & 0x7F) | (data[pos + 1] << 7)
                length, pos = (raw >> 1) ^ -(raw & 1), pos + 2
            else:
                length, pos = varint(data, pos)
            end = pos + length
            b = data[pos + 1]  # after the record's attributes byte
            if b < 0x80:
                ts_delta, pos = (b >> 1) ^ -(b & 1), pos + 2
            else:
                ts_delta, pos = varint(data, pos + 1)
            b = data[pos]
            if b < 0x80:
                delta, pos = (b >> 1) ^ -(b & 1), pos + 1
            else:
                delta, pos = varint(data, pos)
            b = data[pos]
            if b < 0x80:
                klen, pos = (b >> 1) ^ -(b & 1), pos + 1
            else:
                klen, pos = varint(data, pos)
            if klen >= 0:
                key: bytes | None = data[pos : pos + klen]
                pos += klen
            else:
                key = None
            b = data[pos]
            if b < 0x80:
                vlen, pos = (b >> 1) ^ -(b & 1), pos + 1
            elif data[pos + 1] < 0x80:
                raw = (b & 0x7F) | (data[pos + 1] << 7)
                vlen, pos = (raw >> 1) ^ -(raw & 1), pos + 2
            else:
                vlen, pos = varint(data, pos)
            if vlen >= 0:
                value: bytes | None = data[pos : pos + vlen]
                pos += vlen
            else:
                value = None
            b = data[pos]
            if b == 0:
                headers: list[tuple[str, bytes]] = []
                pos += 1
            else:
                hcount, pos = varint(data, pos)
                if hcount < 0:
                    raise RecordDecodeError(f"a record with {hcount} headers")
                found, pos = read_v2_headers(data, pos, hcount)
                headers = [(k, b"" if v is None else v) for k, v in found]
            if pos != end or end > size:
                raise RecordDecodeError(f"record of {length} bytes does not match its fields")
            offset = base + delta
            if offset >= min_offset:
                append((offset, max_ts if log_append else base_ts + ts_delta, key, value, headers))
    except (IndexError, UnicodeDecodeError, RecordDecodeError) as exc:
        raise RecordDecodeError(f"malformed Kafka records in batch at offset {base}: {exc}") from exc
    return out


def to_sluice_format(batch: RecordBatch, compression: int = records_pb2.COMPRESSION_NONE) -> RecordBatch:
    """A batch in Kafka's records format re-encoded in Sluice's (same offsets, producer fields,
    timestamps and flags), for a gRPC client that reads only Sluice's encoding; others as they are.
    The records are compressed with ``compression`` (none by default: a reader decompresses less)."""
    if batch.records_format != KAFKA_V2:
        return batch
    tuples = decode_record_tuples(batch)
    builder = BatchBuilder()
    for offset, ts, key, value, headers in tuples:
        if offset - batch.base_offset != builder.count:
            raise RecordDecodeError(f"batch at offset {batch.base_offset} skips offset {offset}")
        builder.append(key, value, headers, ts)
    out = builder.build(
        producer_id=batch.producer_id,
        producer_epoch=batch.producer_epoch,
        base_sequence=batch.base_sequence,
        transactional=batch.transactional,
        compression=compression,
    )
    out.base_offset = batch.base_offset
    out.partition_leader_epoch = batch.partition_leader_epoch
    if batch.timestamp_type == records_pb2.LOG_APPEND_TIME:
        out.timestamp_type = records_pb2.LOG_APPEND_TIME
        out.max_timestamp = batch.max_timestamp
        out.crc = compute_crc(out)
    return out


def control_batch(
    producer_id: int,
    producer_epoch: int,
    committed: bool,
    coordinator_epoch: int,
    timestamp: int | None = None,
) -> RecordBatch:
    """A COMMIT/ABORT marker batch, written by the broker on a coordinator's request."""
    builder = BatchBuilder()
    builder.append(
        _CONTROL_KEY.pack(0, 1 if committed else 0),
        _CONTROL_VALUE.pack(0, coordinator_epoch),
        None,
        now_ms() if timestamp is None else timestamp,
    )
    batch = builder.build(producer_id=producer_id, producer_epoch=producer_epoch, transactional=True)
    batch.control = True
    batch.crc = compute_crc(batch)
    return batch


def parse_control(batch: RecordBatch) -> tuple[bool, int]:
    """(committed, coordinator_epoch) of a control batch."""
    (rec,) = decode_records(batch)
    if rec.key is None or rec.value is None:
        raise RecordDecodeError("control record without key or value")
    _version, kind = _CONTROL_KEY.unpack(rec.key)
    _v, coordinator_epoch = _CONTROL_VALUE.unpack(rec.value)
    return kind == 1, coordinator_epoch


# The fields of a stored batch's summary, in order: what a replica-log dump prints per batch
# (sluice.broker.log.dump) and what the replica consistency check compares (sluice.testing.replicas).
# "records_sha256" is the digest of the records section; the rest are RecordBatch's header fields.
BATCH_SUMMARY_FIELDS = (
    "base_offset",
    "record_count",
    "partition_leader_epoch",
    "producer_id",
    "producer_epoch",
    "base_sequence",
    "transactional",
    "control",
    "first_timestamp",
    "max_timestamp",
    "compression",
    "crc",
    "records_sha256",
    "records_format",
)
