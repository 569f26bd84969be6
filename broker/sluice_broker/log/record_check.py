"""What every produced batch in Kafka's v2 records format must hold, checked once, in the core.

A batch in Kafka's records format (``records_format`` KAFKA_V2) is stored as it came and given back
byte for byte, so its records are checked before it is stored, whichever protocol brought it: the
Kafka listener (Kafka's clients) or gRPC (clients in other languages that send v2 bytes). What is
checked is what Kafka's LogValidator checks on produce: every field in bounds, each record's length
matching its fields, offset deltas 0..n-1 and as many records as the header says, after one bounded
decompression of a compressed section (CORRUPT_MESSAGE otherwise). So every reader can decode what
the log holds. Negative lengths of keys, values and header values are null, as Kafka's
``DefaultRecord`` reads them; a negative header key length is refused, as Kafka refuses it.

The check also gives the records' earliest and latest timestamps, which Kafka's LogValidator takes
from the records too: the partition checks both against ``message.timestamp.{before,after}.max.ms``
(every record, not only the header's two), and a CreateTime header whose ``maxTimestamp`` is not the
records' largest is corrected, with a new CRC (Kafka's ``setMaxTimestamp``), so time lookups and
retention see the records' real times.

Every produced record passes here, so aiokafka's compiled (Cython) reader answers first: about
0.1 µs a 100-byte record against 1 µs for :func:`walk_records`, which is the definition. The
compiled reader accepts only what the walk accepts (tests/unit/test_record_check.py compares
them on thousands of mutated sections); whatever it refuses or cannot read (a header key that is not
UTF-8, which Kafka accepts) is walked again in Python, which gives the verdict and its message.
"""

from __future__ import annotations

from sluice import errors
from sluice.api.v1 import records_pb2
from sluice.records import (
    KAFKA_V2,
    V2_HEADER,
    RecordBatch,
    RecordDecodeError,
    compute_crc,
    decompress,
    zigzag_varint,
)

try:  # aiokafka's compiled (Cython) record reader: the fast path, see check_section
    from aiokafka.record._crecords.default_records import (  # type: ignore[import-untyped]  # .pyi, no py.typed
        DefaultRecordBatch as _CompiledBatch,
    )
except ImportError:  # no wheel for this platform, or aiokafka installed without its extensions
    _CompiledBatch = None

_AFTER_LENGTH = V2_HEADER.size - 12  # the header's bytes that its length field counts
_NONE_YET = 1 << 62  # the earliest (and minus the latest) before the first record: beyond any delta


def check_produced(batch: RecordBatch) -> tuple[int, int]:
    """Check a produced KAFKA_V2 batch's records (CORRUPT_MESSAGE) and return their earliest and
    latest timestamps; a CreateTime batch's ``max_timestamp`` becomes the latest, with a new CRC, as
    Kafka corrects it. Batches in Sluice's encoding are not walked (their decoders refuse what they
    cannot read): their header's first and largest timestamps are returned."""
    if batch.records_format != KAFKA_V2:
        return batch.first_timestamp, batch.max_timestamp
    section = batch.records
    if batch.compression != records_pb2.COMPRESSION_NONE:
        try:
            section = decompress(section, batch.compression)
        except RecordDecodeError as exc:
            raise errors.CorruptMessageError(str(exc)) from None
    earliest, latest = check_section(section, batch.record_count)
    earliest += batch.first_timestamp
    latest += batch.first_timestamp
    if batch.timestamp_type == records_pb2.CREATE_TIME and batch.max_timestamp != latest:
        batch.max_timestamp = latest
        batch.crc = compute_crc(batch)
    return earliest, latest


def check_section(buf: bytes, record_count: int) -> tuple[int, int]:
    """The uncompressed records section ``buf`` holds exactly ``record_count`` well-formed records
    numbered 0..n-1; their earliest and latest timestamp deltas (CORRUPT_MESSAGE otherwise)."""
    if _CompiledBatch is not None:
        found = compiled_times(buf, record_count)
        if found is not None:
            return found
    return walk_records(buf, record_count)


def compiled_times(buf: bytes, record_count: int) -> tuple[int, int] | None:
    """What the compiled reader reads: the earliest and latest timestamp deltas if it reads exactly
    ``record_count`` records numbered 0..n-1 from ``buf``, else None."""
    assert _CompiledBatch is not None
    # In front of the section, a header saying: base offset and base timestamp 0, so each record's
    # offset and timestamp are its deltas, and no compression. The reader checks no CRC.
    head = V2_HEADER.pack(0, _AFTER_LENGTH + len(buf), 0, 2, 0, 0, record_count - 1, 0, 0, -1, -1, -1, record_count)
    index, earliest, latest = 0, _NONE_YET, -_NONE_YET
    try:
        for record in _CompiledBatch(head + buf):
            if record.offset != index:
                return None
            stamp = record.timestamp
            if stamp > latest:
                latest = stamp
            if stamp < earliest:
                earliest = stamp
            index += 1
    except Exception:  # any refusal: the walk decides, and names the record
        return None
    return (earliest, latest) if index == record_count else None


def walk_records(buf: bytes, record_count: int) -> tuple[int, int]:
    """:func:`check_section` in Python, the definition. No key, value or header is copied; one-byte
    varints (nearly every length and delta) are read in line."""
    end = len(buf)
    pos = index = 0
    earliest, latest = _NONE_YET, -_NONE_YET
    try:
        while pos < end:
            b = buf[pos]
            if b < 0x80:
                length, pos = (b >> 1) ^ -(b & 1), pos + 1
            else:
                length, pos = zigzag_varint(buf, pos)
            record_end = pos + length
            if length < 6 or record_end > end:  # attributes, timestamp delta, offset delta, 2 lengths, a count
                raise RecordDecodeError(f"record {index} of length {length} does not fit the section")
            pos += 1  # attributes (unused in v2)
            b = buf[pos]  # timestamp delta
            if b < 0x80:
                stamp, pos = (b >> 1) ^ -(b & 1), pos + 1
            else:
                stamp, pos = zigzag_varint(buf, pos)
            if stamp > latest:
                latest = stamp
            if stamp < earliest:
                earliest = stamp
            b = buf[pos]
            if b < 0x80:
                delta, pos = (b >> 1) ^ -(b & 1), pos + 1
            else:
                delta, pos = zigzag_varint(buf, pos)
            if delta != index:
                raise RecordDecodeError(f"record {index} has offset delta {delta}")
            # Lengths of key, value and header value: negative is null, as Kafka's DefaultRecord reads them.
            b = buf[pos]  # the key's length (-1: null, one byte 0x01)
            if b == 1:
                pos += 1
            else:
                size, pos = zigzag_varint(buf, pos)
                pos += max(size, 0)
            b = buf[pos]  # the value's length
            if b < 0x80:
                size, pos = (b >> 1) ^ -(b & 1), pos + 1
            else:
                size, pos = zigzag_varint(buf, pos)
            if size > 0:
                pos += size
            b = buf[pos]
            if b == 0:  # no headers: nearly every record
                pos += 1
                count = 0
            else:
                count, pos = zigzag_varint(buf, pos)
            if count < 0:
                raise RecordDecodeError(f"record {index} has {count} headers")
            for _ in range(count):
                size, pos = zigzag_varint(buf, pos)
                if size < 0:
                    raise RecordDecodeError(f"record {index} has a header without a key")
                pos += size
                size, pos = zigzag_varint(buf, pos)
                pos += max(size, 0)
            if pos != record_end:
                raise RecordDecodeError(f"record {index} of {length} bytes does not match its fields")
            index += 1
    except (IndexError, RecordDecodeError) as exc:
        raise errors.CorruptMessageError(f"undecodable record: {exc}") from None
    if index != record_count:
        raise errors.CorruptMessageError(
            f"the batch's header says {record_count} records; its records section holds {index}"
        )
    return earliest, latest
