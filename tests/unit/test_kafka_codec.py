"""The generated Kafka message codecs: every message at every version, and kafka-python as an oracle.

Round trips alone cannot catch a codec that is wrong the same way both ways, so a handful of
messages are also encoded here and decoded by kafka-python (3.x, which generates its own codecs
from its own copy of Kafka's JSON), and the other way round, byte for byte.
"""

from __future__ import annotations

import dataclasses
import random
import uuid
from typing import Any

import pytest

from sluice.broker.kafka_wire import codec
from sluice.broker.kafka_wire.codec import DecodeError, Field, Message, decode, encode
from sluice.broker.kafka_wire.messages import APIS
from sluice.broker.kafka_wire.messages.api_versions_request import ApiVersionsRequest
from sluice.broker.kafka_wire.messages.api_versions_response import ApiVersion, ApiVersionsResponse
from sluice.broker.kafka_wire.messages.metadata_request import MetadataRequest, MetadataRequestTopic
from sluice.broker.kafka_wire.messages.request_header import RequestHeader

INT_RANGES = {
    "int8": (-128, 127),
    "int16": (-32768, 32767),
    "uint16": (0, 65535),
    "int32": (-(2**31), 2**31 - 1),
    "uint32": (0, 2**32 - 1),
    "int64": (-(2**63), 2**63 - 1),
}


def sample_value(rng: random.Random, f: Field, kind: str, version: int) -> Any:
    if kind in INT_RANGES:
        lo, hi = INT_RANGES[kind]
        return rng.choice([lo, hi, 0, 1, -1 if lo < 0 else 2, rng.randint(lo, hi)])
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "float64":
        return rng.choice([0.0, 1.5, -2.25e10])
    if kind == "string":
        return rng.choice(["", "topic-é", "x" * 200])
    if kind in ("bytes", "records"):
        return rng.choice([b"", b"\x00\x01\xff", bytes(range(256))])
    if kind == "uuid":
        return uuid.UUID(int=rng.getrandbits(128))
    raise AssertionError(kind)


def sample(rng: random.Random, cls: type[Message], version: int, depth: int = 0) -> Message:
    """An instance with a non-default value in every field present at ``version`` (some nulls)."""
    values: dict[str, Any] = {}
    for f in cls.SCHEMA.fields:
        if version not in f.versions:
            continue
        if version in f.nullable and rng.random() < 0.2:
            values[f.name] = None
        elif f.kind == "struct":
            values[f.name] = sample(rng, f.element, version, depth + 1)
        elif f.kind == "array":
            n = 0 if depth > 3 else rng.choice([0, 1, 2])
            if isinstance(f.element, str):
                values[f.name] = [sample_value(rng, f, f.element, version) for _ in range(n)]
            else:
                values[f.name] = [sample(rng, f.element, version, depth + 1) for _ in range(n)]
        else:
            values[f.name] = sample_value(rng, f, f.kind, version)
    return cls(**values)


CASES = [
    pytest.param(cls, version, id=f"{cls.__name__}-v{version}")
    for api in APIS.values()
    for cls in (api.request, api.response)
    for version in range(api.valid.lo, api.valid.hi + 1)
]


def test_every_listed_api_is_generated() -> None:
    names = {api.name for api in APIS.values()}
    wanted = {
        "ApiVersions", "Metadata", "Produce", "Fetch", "ListOffsets", "OffsetForLeaderEpoch", "FindCoordinator",
        "JoinGroup", "SyncGroup", "Heartbeat", "LeaveGroup", "OffsetCommit", "OffsetFetch", "InitProducerId",
        "AddPartitionsToTxn", "AddOffsetsToTxn", "TxnOffsetCommit", "EndTxn", "CreateTopics", "DeleteTopics",
        "CreatePartitions", "DescribeConfigs", "IncrementalAlterConfigs", "ListGroups", "DescribeGroups",
        "DeleteGroups", "DescribeCluster", "DescribeTransactions", "ListTransactions", "DescribeProducers",
        "ConsumerGroupHeartbeat",
    }  # fmt: skip
    assert wanted <= names, wanted - names
    assert len(CASES) > 500


@pytest.mark.parametrize(("cls", "version"), CASES)
def test_round_trip_every_message_every_version(cls: type[Message], version: int) -> None:
    rng = random.Random(f"{cls.__name__}-{version}")
    for _ in range(3):
        msg = sample(rng, cls, version)
        data = encode(msg, version)
        assert decode(cls, data, version) == msg
        # and every strict prefix is refused, never misread (a truncated frame)
        for cut in sorted({0, len(data) // 2, len(data) - 1}):
            if 0 <= cut < len(data):
                with pytest.raises(DecodeError):
                    decode(cls, data[:cut], version)


def test_unknown_tagged_fields_are_skipped() -> None:
    msg = ApiVersionsRequest(client_software_name="c", client_software_version="1")
    data = encode(msg, 3)
    assert data.endswith(b"\x00")  # no tagged fields
    # one unknown tag (77) of 3 bytes, then one more (1000, a two-byte varint) of 0 bytes
    extended = data[:-1] + bytes([2, 77, 3, 1, 2, 3]) + bytes([0xE8, 0x07, 0])
    assert decode(ApiVersionsRequest, extended, 3) == msg


def test_known_tagged_field_written_only_when_not_default() -> None:
    plain = ApiVersionsResponse(api_keys=[ApiVersion(18, 0, 4)])
    assert encode(plain, 3).endswith(b"\x00")
    tagged = dataclasses.replace(plain, finalized_features_epoch=7, zk_migration_ready=True)
    data = encode(tagged, 3)
    assert len(data) > len(encode(plain, 3))
    assert decode(ApiVersionsResponse, data, 3) == tagged
    # non-flexible versions have no tagged section and cannot carry them
    assert decode(ApiVersionsResponse, encode(tagged, 2), 2).finalized_features_epoch == -1


def test_request_header_client_id_is_never_compact() -> None:
    header = RequestHeader(request_api_key=3, request_api_version=12, correlation_id=9, client_id="abc")
    data = encode(header, 2)
    assert data == b"\x00\x03\x00\x0c\x00\x00\x00\x09" + b"\x00\x03abc" + b"\x00"
    assert decode(RequestHeader, encode(dataclasses.replace(header, client_id=None), 1), 1).client_id is None


def test_null_where_not_nullable_is_refused() -> None:
    with pytest.raises(ValueError):
        encode(MetadataRequest(topics=None), 0)  # topics is nullable from v1 only
    # a null (-1) topics array at v0 is a decode error
    with pytest.raises(DecodeError):
        decode(MetadataRequest, b"\xff\xff\xff\xff", 0)
    # a length running past the frame
    with pytest.raises(DecodeError):
        decode(MetadataRequest, b"\x00\x00\x00\x01\x00\x09ab", 0)


def test_versions_parse() -> None:
    assert 5 in codec.Versions.parse("3+") and 2 not in codec.Versions.parse("3+")
    assert list(range(10)) == [v for v in range(10) if v in codec.Versions.parse("0-9")]
    assert 0 not in codec.Versions.parse("none")


# -- kafka-python as an oracle -----------------------------------------------------------------


def _kp(name: str) -> Any:
    kp = pytest.importorskip("kafka.protocol")  # the dev extra installs it
    import kafka.protocol.admin
    import kafka.protocol.consumer
    import kafka.protocol.metadata
    import kafka.protocol.producer

    for module in (kafka.protocol.metadata, kafka.protocol.producer, kafka.protocol.consumer, kafka.protocol.admin):
        if hasattr(module, name):
            return getattr(module, name)
    raise AssertionError(f"kafka-python has no {name} ({kp})")


ORACLE = [
    ("ApiVersionsRequest", [0, 1, 2, 3, 4]),
    ("ApiVersionsResponse", [0, 1, 2, 3, 4]),
    ("MetadataRequest", [0, 1, 4, 8, 9, 10, 12, 13]),
    ("MetadataResponse", [0, 1, 5, 7, 9, 10, 12, 13]),
    ("FindCoordinatorRequest", [0, 1, 3, 4, 6]),
    ("FindCoordinatorResponse", [0, 1, 3, 4, 6]),
    ("ProduceRequest", [3, 8, 9, 11, 13]),
    ("ProduceResponse", [3, 8, 9, 11, 13]),
    ("EndTxnRequest", [0, 1, 3, 4, 5]),
    ("JoinGroupRequest", [2, 5, 6, 9]),
    ("OffsetCommitRequest", [2, 7, 8, 9]),
]


@pytest.mark.parametrize(("name", "versions"), ORACLE, ids=[n for n, _ in ORACLE])
def test_kafka_python_reads_what_we_write_and_we_read_what_it_writes(name: str, versions: list[int]) -> None:
    theirs = _kp(name)
    mine = next(c for a in APIS.values() for c in (a.request, a.response) if c.__name__ == name)
    for version in versions:
        if version > theirs.max_version or version not in mine.VALID_VERSIONS:
            continue
        rng = random.Random(f"oracle-{name}-{version}")
        for _ in range(5):
            msg = sample(rng, mine, version)
            if isinstance(msg, ApiVersionsResponse):
                # kafka-python reads an ApiVersions error response at v0 (KIP-511's fallback)
                msg.error_code = 0
            data = encode(msg, version)
            decoded = theirs[version].decode(data)
            again = bytes(theirs[version].encode(decoded))
            assert again == data, f"{name} v{version}: kafka-python re-encodes differently"
            assert decode(mine, again, version) == msg


def test_kafka_python_bytes_decode_to_the_same_fields() -> None:
    kp_req = _kp("MetadataRequest")
    topic = kp_req.MetadataRequestTopic(name="a", topic_id=uuid.UUID(int=0))
    request = kp_req[12](topics=[topic], allow_auto_topic_creation=False, include_topic_authorized_operations=True)
    data = bytes(request.encode())
    ours = decode(MetadataRequest, data, 12)
    assert ours.topics == [MetadataRequestTopic(topic_id=uuid.UUID(int=0), name="a")]
    assert ours.allow_auto_topic_creation is False and ours.include_topic_authorized_operations is True
