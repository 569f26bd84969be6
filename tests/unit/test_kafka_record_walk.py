"""The produce check's two readers of a v2 records section agree where it matters.

Every produced record is checked (``record_batch._check_records``). The compiled reader (aiokafka's
Cython extension, a dependency) answers first; the Python walk is the definition and gives the
verdict whenever the compiled reader refuses. So the one property that keeps the check as strict as
the walk is: **whatever the compiled reader accepts, the walk accepts**. It is checked here on
valid sections and on thousands of seeded mutations of them (bytes flipped, cut, inserted,
varints lengthened), bounded in count.
"""

from __future__ import annotations

import random

import pytest

from sluice import errors
from sluice.broker.kafka import record_batch
from sluice.broker.kafka.record_batch import HEADER_SIZE, split_batches
from sluice.records import iter_v2_records

default_records = pytest.importorskip("kafka.record.default_records")  # the dev extra installs kafka-python

MUTATIONS = 4000  # per section; seeded, so a failure reproduces

SECTIONS = {
    "small values, null keys": [(None, b"v%d" % i, []) for i in range(20)],
    "keys, headers, a null header value": [
        (b"k0", b"v" * 300, []),
        (None, b"only value", [("h1", b"x"), ("h2", None)]),
        (b"key only", None, []),
        (b"", b"", [("empty", b"")]),
    ],
    "two- and three-byte varints": [(b"k" * 200, b"v" * 20_000, [("h", b"x" * 150)]) for _ in range(3)],
}


def section(records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]]) -> tuple[object, bytes]:
    builder = default_records.DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 22)
    for i, (key, value, headers) in enumerate(records):
        builder.append(i, 1_700_000_000_000 + i * 1000, key, value, headers)
    header, _batch = split_batches(bytes(builder.build()))[0]
    return header, bytes(builder.build())[HEADER_SIZE:]


def walk_accepts(header: object, buf: bytes) -> bool:
    try:
        record_batch._walk_records(header, buf)  # type: ignore[arg-type]
    except errors.CorruptMessageError:
        return False
    return True


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
    else:  # a one-byte varint written as two bytes (same value, longer encoding), or a byte dropped
        if data[at] < 0x80:
            data[at : at + 1] = bytes([data[at] | 0x80, 0x00])
        else:
            del data[at]
    return bytes(data)


def test_the_compiled_reader_is_installed_and_reads_valid_sections() -> None:
    assert record_batch._CompiledBatch is not None, "aiokafka's compiled extension is a dependency of the broker"
    for records in SECTIONS.values():
        header, buf = section(records)
        assert record_batch._compiled_reader_accepts(buf, len(records))
        assert walk_accepts(header, buf)
        # the count is checked both ways
        assert not record_batch._compiled_reader_accepts(buf, len(records) + 1)
        assert not record_batch._compiled_reader_accepts(buf, len(records) - 1)


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_whatever_the_compiled_reader_accepts_the_walk_accepts(name: str) -> None:
    records = SECTIONS[name]
    header, buf = section(records)
    rng = random.Random(f"walk-{name}")
    refused_by_both = accepted_by_both = refused_by_compiled_only = 0
    for _ in range(MUTATIONS):
        mutated = mutate(buf, rng)
        compiled = record_batch._compiled_reader_accepts(mutated, len(records))
        walked = walk_accepts(header, mutated)
        assert walked or not compiled, f"the compiled reader accepted what the walk refuses: {mutated.hex()}"
        refused_by_both += not compiled and not walked
        accepted_by_both += compiled and walked
        refused_by_compiled_only += walked and not compiled
    # The mutations exercise both verdicts (a property over refusals only would prove nothing).
    assert refused_by_both > MUTATIONS // 4
    assert accepted_by_both > 0


def test_a_header_key_that_is_not_utf8_is_accepted_as_kafka_accepts_it() -> None:
    # Kafka reads header keys with Java's lenient decoding; the compiled reader refuses them, the
    # walk (which never decodes a key) decides.
    header, buf = section([(None, b"v", [("hk", b"x")])])
    mutated = buf.replace(b"hk", b"h\xff")
    assert not record_batch._compiled_reader_accepts(mutated, 1)
    record_batch._check_records(header, mutated)  # type: ignore[arg-type]


def test_a_negative_key_or_value_length_is_null_as_kafka_reads_it() -> None:
    # Kafka's DefaultRecord reads any negative key, value or header value length as null; both
    # readers of the produce check and Sluice's decoders do the same (-31: zigzag 0x3d).
    header, buf = section([(None, None, [("h", None)])])
    assert buf.count(b"\x01") >= 3  # the three nulls, each -1
    mutated = buf.replace(b"\x01", b"\x3d")
    assert record_batch._compiled_reader_accepts(mutated, 1)
    record_batch._check_records(header, mutated)  # type: ignore[arg-type]
    [(_delta, _ts, key, value, headers)] = list(iter_v2_records(mutated, 1))
    assert (key, value, headers) == (None, None, [("h", None)])
