"""Kafka v2 record batches: validation (magic, length, CRC-32C) and records, with kafka-python's builder as oracle."""

from __future__ import annotations

import struct
from collections.abc import Callable

import cramjam
import crc32c
import pytest

from sluice import errors
from sluice.api.v1 import records_pb2
from sluice.broker.kafka.record_batch import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_ZSTD,
    HEADER_SIZE,
    BatchHeader,
    iter_records,
    split_batches,
    to_stored_batch,
    to_v2_batch,
)
from sluice.broker.log.record_check import check_produced
from sluice.records import (
    KAFKA_V2,
    MAX_DECOMPRESSED_BYTES,
    BatchBuilder,
    RecordBatch,
    RecordDecodeError,
    compress,
    decode_records,
    decompress,
    iter_v2_records,
    to_sluice_format,
    verify_crc,
)

COMPRESSION_SNAPPY = records_pb2.COMPRESSION_SNAPPY  # Kafka's codec id 2 too

default_records = pytest.importorskip("kafka.record.default_records")  # the dev extra installs kafka-python

RECORDS = [
    (b"k0", b"v" * 300, []),
    (None, b"only value", [("h1", b"x"), ("h2", b"")]),
    (b"key only", None, []),
    (b"", b"", [("empty", b"")]),
]


def kafka_batch(
    codec: int = COMPRESSION_NONE, *, transactional: bool = False, pid: int = -1, epoch: int = -1, seq: int = -1
) -> bytes:
    builder = default_records.DefaultRecordBatchBuilder(2, codec, int(transactional), pid, epoch, seq, 1 << 20)
    for i, (key, value, headers) in enumerate(RECORDS):
        builder.append(i, 1_700_000_000_000 + i, key, value, headers)
    return bytes(builder.build())


@pytest.mark.parametrize("codec", [COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_LZ4, COMPRESSION_ZSTD])
def test_records_of_kafka_python_batches(codec: int) -> None:
    data = kafka_batch(codec, transactional=True, pid=42, epoch=3, seq=7)
    [(header, batch)] = split_batches(data)
    assert (header.magic, header.compression, header.record_count, header.last_offset_delta) == (2, codec, 4, 3)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 3, 7)
    assert header.transactional and not header.control
    got = list(iter_records(header, batch))
    assert [(o, t) for o, t, *_ in got] == [(i, 1_700_000_000_000 + i) for i in range(4)]
    assert [(k, v, h) for _, _, k, v, h in got] == RECORDS


def stored_at(header: BatchHeader, batch: bytes | memoryview, offset: int = 1000, epoch: int = 4) -> RecordBatch:
    """The batch as the broker stores it once appended at ``offset`` by a leader of ``epoch``."""
    out = to_stored_batch(header, batch)
    out.base_offset, out.partition_leader_epoch = offset, epoch
    return out


@pytest.mark.parametrize("codec", [COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_LZ4, COMPRESSION_ZSTD])
def test_a_stored_batch_keeps_every_field_and_goes_back_to_kafka_byte_for_byte(codec: int) -> None:
    data = kafka_batch(codec, transactional=True, pid=9, epoch=1, seq=0)
    header, batch = split_batches(data)[0]
    stored = stored_at(header, batch)
    assert stored.records_format == KAFKA_V2 and verify_crc(stored)
    assert (stored.producer_id, stored.producer_epoch, stored.base_sequence) == (9, 1, 0)
    assert stored.transactional and stored.record_count == len(RECORDS) and stored.compression == codec
    assert stored.records == data[HEADER_SIZE:]  # as sent, still compressed
    records = decode_records(stored)  # what Sluice's own client reads
    assert [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in records] == [
        (1000 + i, 1_700_000_000_000 + i, k, v, h) for i, (k, v, h) in enumerate(RECORDS)
    ]
    fetched = bytearray(data)
    struct.pack_into(">qii", fetched, 0, 1000, len(data) - 12, 4)  # what the broker assigned
    assert to_v2_batch(stored) == bytes(fetched)


@pytest.mark.parametrize("delta_ms", [0, 1, 63, 64, 8191, 8192, 9_000_000])
@pytest.mark.parametrize("value_size", [0, 50, 63, 64, 8100, 8200, 70_000])
def test_stored_records_read_with_one_two_and_three_byte_varints(delta_ms: int, value_size: int) -> None:
    """Record lengths and timestamp deltas take one, two or more varint bytes."""
    builder = default_records.DefaultRecordBatchBuilder(2, COMPRESSION_NONE, 0, -1, -1, -1, 1 << 22)
    values = [bytes([i]) * value_size for i in range(3)]
    for i, value in enumerate(values):
        builder.append(i, 1_700_000_000_000 + i * delta_ms, None, value, [])
    header, batch = split_batches(bytes(builder.build()))[0]
    records = decode_records(stored_at(header, batch, offset=0))
    assert [(r.offset, r.timestamp, r.value) for r in records] == [
        (i, 1_700_000_000_000 + i * delta_ms, v) for i, v in enumerate(values)
    ]


def test_several_batches_in_one_records_field() -> None:
    data = kafka_batch() + kafka_batch(COMPRESSION_GZIP)
    assert [h.compression for h, _ in split_batches(data)] == [COMPRESSION_NONE, COMPRESSION_GZIP]


def test_a_flipped_bit_is_corrupt_message() -> None:
    data = bytearray(kafka_batch())
    data[HEADER_SIZE + 5] ^= 0x01  # inside the records, covered by the CRC
    with pytest.raises(errors.CorruptMessageError, match="CRC-32C"):
        split_batches(bytes(data))
    assert errors.CorruptMessageError.code == 2


def test_base_offset_and_leader_epoch_are_not_covered_by_the_crc() -> None:
    data = bytearray(kafka_batch())
    struct.pack_into(">qii", data, 0, 1000, len(data) - 12, 17)  # what a broker assigns
    [(header, _)] = split_batches(bytes(data))
    assert (header.base_offset, header.partition_leader_epoch) == (1000, 17)


def test_magic_below_2_is_refused_as_kafka_4_does() -> None:
    # a magic-1 message set entry: offset, size, crc, magic 1, attributes, timestamp, key, value
    body = struct.pack(">bbqii", 1, 0, 0, -1, 1) + b"v"
    entry = struct.pack(">qiI", 0, len(body) + 4, crc32c.crc32c(body)) + body
    with pytest.raises(errors.InvalidRecordError, match="magic 1"):
        split_batches(entry)


@pytest.mark.parametrize("cut", [1, 20, HEADER_SIZE - 1, HEADER_SIZE + 3])
def test_truncated_batches_are_corrupt(cut: int) -> None:
    data = kafka_batch()
    with pytest.raises((errors.CorruptMessageError, errors.InvalidRecordError)):
        split_batches(data[:cut])


def test_a_length_past_the_data_is_corrupt() -> None:
    data = bytearray(kafka_batch())
    struct.pack_into(">i", data, 8, len(data))  # 12 bytes more than there are
    with pytest.raises(errors.CorruptMessageError, match="does not fit"):
        split_batches(bytes(data))


def test_records_that_lie_about_their_length_are_corrupt() -> None:
    builder = default_records.DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 20)
    builder.append(0, 1, b"k", b"v", [])
    data = bytearray(builder.build())
    data[HEADER_SIZE] += 2  # the first record's zigzag length grows by one
    data[17:21] = struct.pack(">I", crc32c.crc32c(bytes(data[21:])))
    [(header, batch)] = split_batches(bytes(data))
    with pytest.raises(errors.CorruptMessageError):
        list(iter_records(header, batch))


def reference_conversion(header: BatchHeader, batch: bytes | memoryview) -> RecordBatch:
    """What a Sluice-only client should read: iter_records decoded, BatchBuilder re-encoded."""
    builder = BatchBuilder()
    for _offset_delta, timestamp, key, value, headers in iter_records(header, batch):
        builder.append(key, value, [(k, b"" if v is None else v) for k, v in headers], timestamp)
    out = builder.build(
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        transactional=header.transactional,
    )
    out.base_offset, out.partition_leader_epoch = 1000, 4
    return out


def test_a_client_that_reads_only_sluices_encoding_gets_the_builders_bytes() -> None:
    # Every varint width: one byte, two (64 B to 8 KiB), three and more, negative timestamp
    # deltas (out-of-order timestamps), null keys and values, empty ones, headers, a null header value.
    builder = default_records.DefaultRecordBatchBuilder(2, COMPRESSION_NONE, 1, 5, 2, 40, 1 << 24)
    cases = [
        (b"k", b"v", []),
        (None, b"x" * 63, []),
        (b"key" * 30, b"y" * 64, [("h", b"1")]),
        (b"", None, []),
        (None, None, [("a", b""), ("b", b"z" * 200), ("n", None)]),
        (b"big", b"w" * 9000, []),
        (b"huge", b"u" * 300_000, []),
    ]
    timestamps = [1_700_000_000_500, 1_700_000_000_000, 1_700_000_009_000, 1_700_000_000_001, 5, 1_700_000_000_002, 7]
    for i, ((key, value, headers), ts) in enumerate(zip(cases, timestamps, strict=True)):
        builder.append(i, ts, key, value, headers)
    [(header, batch)] = split_batches(bytes(builder.build()))
    converted = to_sluice_format(stored_at(header, batch))
    assert converted.records_format == records_pb2.RECORDS_FORMAT_SLUICE
    assert converted == reference_conversion(header, batch)
    assert verify_crc(converted) and converted.max_timestamp == 1_700_000_009_000


def test_a_null_header_value_is_stored_and_given_back_to_kafka_clients() -> None:
    builder = default_records.DefaultRecordBatchBuilder(2, COMPRESSION_NONE, 0, -1, -1, -1, 1 << 20)
    builder.append(0, 1, b"k", b"v", [("h", None)])
    [(header, batch)] = split_batches(bytes(builder.build()))
    [record] = default_records.DefaultRecordBatch(to_v2_batch(stored_at(header, batch)))
    assert list(record.headers) == [("h", None)]
    assert decode_records(stored_at(header, batch))[0].headers == [("h", b"")]  # Sluice's records have no null


def test_a_batch_whose_last_offset_delta_is_not_its_count_is_refused() -> None:
    builder = default_records.DefaultRecordBatchBuilder(2, COMPRESSION_NONE, 0, -1, -1, -1, 1 << 20)
    builder.append(0, 1, b"k", b"v", [])
    builder.append(2, 1, b"k", b"v", [])  # offset delta 2 after 0: 2 records ending at delta 2
    [(header, batch)] = split_batches(bytes(builder.build()))
    with pytest.raises(errors.InvalidRecordError, match="must end at offset delta 1, not 2"):
        to_stored_batch(header, batch)


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_a_codec_kafka_does_not_have_is_refused_as_unsupported(codec: int) -> None:
    data = bytearray(kafka_batch())
    data[22] |= codec  # attributes' codec bits
    data[17:21] = struct.pack(">I", crc32c.crc32c(bytes(data[21:])))
    [(header, batch)] = split_batches(bytes(data))
    with pytest.raises(errors.UnsupportedCompressionTypeError, match=f"codec {codec} does not exist"):
        to_stored_batch(header, batch)


def test_snappy_reads_xerials_framing_and_librdkafkas_raw_block() -> None:
    data = b"".join(b"record %d;" % i for i in range(20_000))  # ~200 KB: several 32 KiB xerial blocks
    framed = compress(data, records_pb2.COMPRESSION_SNAPPY)
    assert framed.startswith(b"\x82SNAPPY\x00") and len(framed) < len(data) // 2
    assert decompress(framed, records_pb2.COMPRESSION_SNAPPY) == data
    raw = bytes(cramjam.snappy.compress_raw(data))
    assert decompress(raw, records_pb2.COMPRESSION_SNAPPY) == data
    with pytest.raises(RecordDecodeError):
        decompress(framed[:-7], records_pb2.COMPRESSION_SNAPPY)


def test_a_snappy_batch_is_stored_as_sent_and_decoded() -> None:
    # kafka-python writes snappy only with python-snappy: recompress its uncompressed batch's records
    plain = kafka_batch()
    body = compress(plain[HEADER_SIZE:], records_pb2.COMPRESSION_SNAPPY)
    data = bytearray(plain[:HEADER_SIZE]) + body
    data[22] |= 2  # attributes' codec bits: snappy
    struct.pack_into(">i", data, 8, len(data) - 12)
    data[17:21] = struct.pack(">I", crc32c.crc32c(bytes(data[21:])))
    [(header, batch)] = split_batches(bytes(data))
    stored = stored_at(header, batch)
    assert stored.compression == records_pb2.COMPRESSION_SNAPPY and stored.records == body and verify_crc(stored)
    assert [(r.offset, r.key, r.value, list(r.headers)) for r in decode_records(stored)] == [
        (1000 + i, k, v, h) for i, (k, v, h) in enumerate(RECORDS)
    ]


def lying(codec: int) -> tuple[BatchHeader, memoryview]:
    """A batch whose first record claims to be two bytes longer than it is (CRC recomputed)."""
    builder = default_records.DefaultRecordBatchBuilder(2, COMPRESSION_NONE, 0, -1, -1, -1, 1 << 20)
    builder.append(0, 1, b"k", b"v", [])
    builder.append(1, 1, b"k", b"v", [])
    data = bytearray(builder.build())
    data[HEADER_SIZE] += 2
    if codec != COMPRESSION_NONE:
        data[HEADER_SIZE:] = compress(bytes(data[HEADER_SIZE:]), codec)
        struct.pack_into(">i", data, 8, len(data) - 12)
        data[22] |= codec
    data[17:21] = struct.pack(">I", crc32c.crc32c(bytes(data[21:])))
    return split_batches(bytes(data))[0]


def test_a_compressed_batch_that_lies_about_its_records_is_refused() -> None:
    with pytest.raises(errors.CorruptMessageError):
        produced(*lying(COMPRESSION_GZIP))
    truncated = bytearray(kafka_batch(COMPRESSION_ZSTD))
    truncated[57:61] = struct.pack(">i", len(RECORDS) + 1)  # one record more than there are
    truncated[23:27] = struct.pack(">i", len(RECORDS))
    truncated[17:21] = struct.pack(">I", crc32c.crc32c(bytes(truncated[21:])))
    [(header, batch)] = split_batches(bytes(truncated))
    with pytest.raises(errors.CorruptMessageError, match="says 5 records; its records section holds 4"):
        produced(header, batch)


def produced(header: BatchHeader, batch: memoryview) -> RecordBatch:
    """What Produce stores of a Kafka client's batch: the listener's envelope, then the core's check
    of its records (sluice.broker.log.record_check, which every protocol's batches pass)."""
    stored = to_stored_batch(header, batch)
    check_produced(stored)
    return stored


ALL_CODECS = [COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD]


@pytest.mark.parametrize("codec", ALL_CODECS)
def test_a_batch_whose_record_lies_about_its_length_is_refused_in_every_codec(codec: int) -> None:
    """As Kafka's LogValidator: the records are walked on produce, compressed or not, so no reader
    ever meets a batch it cannot decode (the CRC only says the client sent these bytes)."""
    with pytest.raises(errors.CorruptMessageError, match="undecodable record"):
        produced(*lying(codec))


def _patched(codec: int, edit: Callable[[bytearray], None], records: int = 2) -> tuple[BatchHeader, memoryview]:
    """A batch of ``records`` records, its records section edited by ``edit`` (uncompressed), then
    compressed with ``codec``, its length and CRC made right again: only the edit is wrong."""
    builder = default_records.DefaultRecordBatchBuilder(2, COMPRESSION_NONE, 0, -1, -1, -1, 1 << 20)
    for i in range(records):
        builder.append(i, 1, b"k", b"v", [])
    data = bytearray(builder.build())
    section = bytearray(data[HEADER_SIZE:])
    edit(section)
    data[HEADER_SIZE:] = section if codec == COMPRESSION_NONE else compress(bytes(section), codec)
    struct.pack_into(">i", data, 8, len(data) - 12)
    data[22] |= codec
    data[17:21] = struct.pack(">I", crc32c.crc32c(bytes(data[21:])))
    return split_batches(bytes(data))[0]


@pytest.mark.parametrize("codec", [COMPRESSION_NONE, COMPRESSION_GZIP])
def test_records_numbered_other_than_0_to_n_minus_1_are_refused(codec: int) -> None:
    def second_is_delta_0(section: bytearray) -> None:
        first_length = section[0] >> 1  # a one-byte zigzag varint
        second = 1 + first_length
        # length, attributes, timestamp delta (one byte each), then the offset delta: 1 -> 0
        assert section[second + 3] == 0x02
        section[second + 3] = 0x00

    with pytest.raises(errors.CorruptMessageError, match="record 1 has offset delta 0"):
        produced(*_patched(codec, second_is_delta_0))


def test_a_negative_header_count_is_refused_by_the_broker_and_both_decoders() -> None:
    def negative_headers(section: bytearray) -> None:
        first_length = section[0] >> 1
        assert section[first_length] == 0x00  # the first record's header count, its last byte
        section[first_length] = 0x01  # zigzag -1

    header, batch = _patched(COMPRESSION_NONE, negative_headers)
    with pytest.raises(errors.CorruptMessageError, match="-1 headers"):
        produced(header, batch)
    section = bytes(batch[HEADER_SIZE:])
    with pytest.raises(RecordDecodeError):
        list(iter_v2_records(section, 2))
    with pytest.raises(RecordDecodeError, match="-1 headers"):
        decode_records(RecordBatch(records=section, record_count=2, records_format=KAFKA_V2))


def test_attribute_bits_above_the_control_bit_are_refused_by_name() -> None:
    data = bytearray(kafka_batch(COMPRESSION_NONE))
    data[21] |= 0x01  # attributes' high byte: bit 8
    data[17:21] = struct.pack(">I", crc32c.crc32c(bytes(data[21:])))
    with pytest.raises(errors.InvalidRecordError, match="bits above the control bit"):
        to_stored_batch(*split_batches(bytes(data))[0])


@pytest.mark.parametrize("codec", [COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD])
def test_a_decompression_bomb_is_stopped_at_the_limit(codec: int) -> None:
    bomb = compress(b"\0" * (MAX_DECOMPRESSED_BYTES + 1), codec)
    assert len(bomb) < MAX_DECOMPRESSED_BYTES // 16  # what a producer would send: small
    with pytest.raises(RecordDecodeError, match="expand past"):
        decompress(bomb, codec)
    assert decompress(compress(b"\0" * 1000, codec), codec, limit=1000) == b"\0" * 1000


@pytest.mark.parametrize("codec", [COMPRESSION_GZIP, COMPRESSION_LZ4, COMPRESSION_ZSTD])
def test_every_frame_is_read_and_a_truncated_one_is_an_error(codec: int) -> None:
    one = compress(b"abc" * 1000, codec)
    assert decompress(one + one, codec) == b"abc" * 2000  # two gzip members, zstd or lz4 frames
    with pytest.raises(RecordDecodeError, match="middle of a frame"):
        decompress(one[:-4], codec)


def test_a_grpc_reader_gets_the_batches_before_an_undecodable_one_and_resumes_at_it() -> None:
    """Nothing produced today can be undecodable (the walk above), but a log written before it may
    hold such a batch: the gRPC fetch answers CORRUPT_MESSAGE and its next_fetch_offset points at the
    bad batch, never past it and the good batches after it."""
    from sluice.broker.servicers.broker import _sluice_encoded

    good = stored_at(*split_batches(kafka_batch(COMPRESSION_NONE))[0], offset=10)
    _header, bad_bytes = _patched(COMPRESSION_NONE, lambda section: section.__setitem__(0, section[0] + 4))
    bad = RecordBatch(base_offset=15, record_count=2, records_format=KAFKA_V2, records=bytes(bad_bytes[HEADER_SIZE:]))
    after = stored_at(*split_batches(kafka_batch(COMPRESSION_NONE))[0], offset=17)
    batches = [good, bad, after]
    sent, why, resume = _sluice_encoded(batches, [b.SerializeToString() for b in batches], 22)
    assert [RecordBatch.FromString(b).base_offset for b in sent] == [10] and "at offset 15" in why
    assert resume == 15
    assert _sluice_encoded([good], [good.SerializeToString()], 15) == (
        [to_sluice_format(good).SerializeToString()],
        "",
        15,
    )
