"""The core's check of produced v2 records (sluice.broker.log.record_check).

Every produced KAFKA_V2 batch is checked once, in the core, whichever protocol brought it. The
compiled reader (aiokafka's Cython extension, a dependency) answers first; the Python walk is the
definition and gives the verdict whenever the compiled reader refuses. So the property that keeps the
check as strict as the walk is: **whatever the compiled reader accepts, the walk accepts, with the
same timestamps**. It is checked on valid sections and on thousands of seeded mutations of them
(bytes flipped, cut, inserted, varints lengthened), bounded in count.
"""

from __future__ import annotations

import random

import pytest

from sluice import errors
from sluice.api.v1 import records_pb2
from sluice.broker.kafka.record_batch import HEADER_SIZE, split_batches, to_stored_batch
from sluice.broker.log import record_check
from sluice.records import RecordBatch, compress, iter_v2_records, verify_crc

default_records = pytest.importorskip("kafka.record.default_records")  # the dev extra installs kafka-python

MUTATIONS = 4000  # per section; seeded, so a failure reproduces
BASE_TS = 1_700_000_000_000

Records = list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]]
SECTIONS: dict[str, Records] = {
    "small values, null keys": [(None, b"v%d" % i, []) for i in range(20)],
    "keys, headers, a null header value": [
        (b"k0", b"v" * 300, []),
        (None, b"only value", [("h1", b"x"), ("h2", None)]),
        (b"key only", None, []),
        (b"", b"", [("empty", b"")]),
    ],
    "two- and three-byte varints": [(b"k" * 200, b"v" * 20_000, [("h", b"x" * 150)]) for _ in range(3)],
}


def kafka_batch(records: Records, stamps: list[int] | None = None, codec: int = 0) -> bytes:
    builder = default_records.DefaultRecordBatchBuilder(2, codec, 0, -1, -1, -1, 1 << 22)
    for i, (key, value, headers) in enumerate(records):
        builder.append(i, BASE_TS + i * 1000 if stamps is None else stamps[i], key, value, headers)
    return bytes(builder.build())


def section(records: Records) -> bytes:
    return kafka_batch(records)[HEADER_SIZE:]


def stored(data: bytes) -> RecordBatch:
    return to_stored_batch(*split_batches(data)[0])


def walked(buf: bytes, count: int) -> tuple[int, int] | None:
    try:
        return record_check.walk_records(buf, count)
    except errors.CorruptMessageError:
        return None


def mutate(buf: bytes, rng: random.Random) -> bytes:
    data = bytearray(buf)
    kind = rng.randrange(5)
    at = rng.randrange(len(data))
    if kind == 0:  # one byte anything
        data[at] = rng.randrange(256)
    elif kind == 1:  # one bit
        data[at] ^= 1 << rng.randrange(8)
    elif kind == 2:  # cut short
        del data[at:]
    elif kind == 3:  # bytes inserted
        data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 4)))
    elif data[at] < 0x80:  # a one-byte varint written as two bytes (same value, longer encoding)
        data[at : at + 1] = bytes([data[at] | 0x80, 0x00])
    else:  # a byte dropped
        del data[at]
    return bytes(data)


def test_the_compiled_reader_is_installed_and_reads_valid_sections() -> None:
    assert record_check._CompiledBatch is not None, "aiokafka's compiled extension is a dependency of the broker"
    for records in SECTIONS.values():
        buf = section(records)
        expected = (0, (len(records) - 1) * 1000)
        assert record_check.compiled_times(buf, len(records)) == expected
        assert walked(buf, len(records)) == expected
        # the count is checked both ways
        assert record_check.compiled_times(buf, len(records) + 1) is None
        assert record_check.compiled_times(buf, len(records) - 1) is None


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_whatever_the_compiled_reader_accepts_the_walk_accepts_with_the_same_times(name: str) -> None:
    records = SECTIONS[name]
    buf = section(records)
    rng = random.Random(f"walk-{name}")
    refused_by_both = accepted_by_both = 0
    for _ in range(MUTATIONS):
        mutated = mutate(buf, rng)
        compiled = record_check.compiled_times(mutated, len(records))
        walk = walked(mutated, len(records))
        if compiled is not None:
            assert walk == compiled, f"the compiled reader read {compiled}, the walk {walk}: {mutated.hex()}"
        refused_by_both += compiled is None and walk is None
        accepted_by_both += compiled is not None
    # The mutations exercise both verdicts (a property over refusals only would prove nothing).
    assert refused_by_both > MUTATIONS // 4
    assert accepted_by_both > 0


def test_a_header_key_that_is_not_utf8_is_accepted_as_kafka_accepts_it() -> None:
    # Kafka reads header keys with Java's lenient decoding; the compiled reader refuses them, the
    # walk (which never decodes a key) decides.
    buf = section([(None, b"v", [("hk", b"x")])]).replace(b"hk", b"h\xff")
    assert record_check.compiled_times(buf, 1) is None
    assert record_check.check_section(buf, 1) == (0, 0)
    [(_delta, _ts, _key, _value, headers)] = list(iter_v2_records(buf, 1))
    assert headers == [("h\ufffd", b"x")]  # as Java decodes it


def test_a_negative_key_or_value_length_is_null_as_kafka_reads_it() -> None:
    # Kafka's DefaultRecord reads any negative key, value or header value length as null; both
    # readers of the check and Sluice's decoders do the same (-31: zigzag 0x3d).
    buf = section([(None, None, [("h", None)])])
    assert buf.count(b"\x01") == 3  # the three nulls, each -1
    mutated = buf.replace(b"\x01", b"\x3d")
    assert record_check.compiled_times(mutated, 1) == (0, 0)
    assert record_check.check_section(mutated, 1) == (0, 0)
    [(_delta, _ts, key, value, headers)] = list(iter_v2_records(mutated, 1))
    assert (key, value, headers) == (None, None, [("h", None)])


def test_a_lying_record_is_refused_whichever_protocol_brought_it() -> None:
    batch = stored(kafka_batch(SECTIONS["small values, null keys"]))
    batch.records = batch.records[:-1] + b"\x02"  # the last record's header count: 1 header, none follows
    with pytest.raises(errors.CorruptMessageError, match="undecodable record"):
        record_check.check_produced(batch)


@pytest.mark.parametrize("codec", [0, 1])
def test_the_records_earliest_and_latest_timestamps_and_a_max_timestamp_corrected(codec: int) -> None:
    # Records out of time order: the first is not the earliest, the last not the latest.
    stamps = [BASE_TS, BASE_TS + 5000, BASE_TS - 3000, BASE_TS + 1000]
    batch = stored(kafka_batch([(None, b"v", [])] * 4, stamps, codec))
    assert batch.max_timestamp == BASE_TS + 5000  # kafka-python writes the right one
    assert record_check.check_produced(batch) == (BASE_TS - 3000, BASE_TS + 5000)

    # A client that writes a wrong maxTimestamp (its CRC matching): corrected, with a new CRC, as Kafka does.
    liar = stored(kafka_batch([(None, b"v", [])] * 4, stamps, codec))
    liar.max_timestamp = BASE_TS
    liar.crc = record_check.compute_crc(liar)
    assert record_check.check_produced(liar) == (BASE_TS - 3000, BASE_TS + 5000)
    assert liar.max_timestamp == BASE_TS + 5000 and verify_crc(liar)
    assert liar.crc == batch.crc  # the same bytes Kafka's client would have sent


def test_log_append_time_batches_keep_their_header_and_sluice_encoded_ones_are_not_walked() -> None:
    batch = stored(kafka_batch([(None, b"v", [])] * 2))
    batch.timestamp_type = records_pb2.LOG_APPEND_TIME
    batch.max_timestamp = 7  # the partition sets it on append
    batch.crc = record_check.compute_crc(batch)
    record_check.check_produced(batch)
    assert batch.max_timestamp == 7
    sluice = RecordBatch(records=b"not walked", record_count=1, first_timestamp=3, max_timestamp=4)
    assert record_check.check_produced(sluice) == (3, 4)


def test_a_compressed_section_is_checked_after_decompression() -> None:
    batch = stored(kafka_batch(SECTIONS["keys, headers, a null header value"], codec=1))
    assert record_check.check_produced(batch) == (BASE_TS, BASE_TS + 3000)
    plain = bytearray(section(SECTIONS["keys, headers, a null header value"]))
    plain[-1] = 0x02  # the last record's header count, with no header after it
    batch.records = compress(bytes(plain), records_pb2.COMPRESSION_GZIP)
    with pytest.raises(errors.CorruptMessageError, match="undecodable record"):
        record_check.check_produced(batch)
