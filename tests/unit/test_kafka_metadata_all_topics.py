"""The all-topics Metadata request at every version, as Kafka clients put it on the wire.

"All topics" is an empty topics array at v0 and a null one from v1 (int32 -1 up to v8, the compact
null ``00`` from v9, where the request became flexible). librdkafka 2.16 writes the v9+ form with
its int32 placeholder left in place (``00 00 00 00``); Kafka's broker reads the first byte as the
null and ignores what follows the body, so the listener must too (``codec.decode_request``).
"""

from __future__ import annotations

import pytest

from sluice.broker.kafka.framing import parse_request
from sluice.broker.kafka_wire import codec
from sluice.broker.kafka_wire.codec import DecodeError
from sluice.broker.kafka_wire.messages.metadata_request import MetadataRequest

# The body of an all-topics request, allow_auto_topic_creation true, every other flag false, by version.
NULL_TOPICS = {
    **{v: "ffffffff" for v in range(1, 4)},
    **{v: "ffffffff01" for v in range(4, 8)},
    8: "ffffffff010000",  # + include_cluster_authorized_operations, include_topic_authorized_operations
    9: "0001000000",  # compact null, the 3 booleans, an empty tag section
    10: "0001000000",
    **{v: "00010000" for v in range(11, 14)},  # include_cluster_authorized_operations is gone from v11
}


def test_every_version_is_covered() -> None:
    valid = MetadataRequest.VALID_VERSIONS
    assert set(NULL_TOPICS) | {0} == set(range(valid.lo, valid.hi + 1))


@pytest.mark.parametrize("version", sorted(NULL_TOPICS))
def test_null_topics_decode_and_encode_byte_for_byte(version: int) -> None:
    body = bytes.fromhex(NULL_TOPICS[version])
    request = codec.decode(MetadataRequest, body, version)
    assert request.topics is None and request.allow_auto_topic_creation is True
    assert codec.encode(MetadataRequest(topics=None), version) == body
    assert codec.decode_request(MetadataRequest, body, version) == (request, 0)


@pytest.mark.parametrize("version", sorted(NULL_TOPICS))
def test_kafka_python_encodes_null_topics_the_same(version: int) -> None:
    metadata = pytest.importorskip("kafka.protocol.metadata")  # the dev extra installs kafka-python
    assert bytes(metadata.MetadataRequest[version](topics=None).encode()).hex() == NULL_TOPICS[version]


def test_v0_has_no_null_an_empty_array_means_all_topics() -> None:
    assert codec.decode(MetadataRequest, b"\x00\x00\x00\x00", 0).topics == []
    with pytest.raises(DecodeError, match="null is not allowed"):
        codec.decode(MetadataRequest, b"\xff\xff\xff\xff", 0)


def test_librdkafka_2_16_all_topics_v13_frame() -> None:
    """The whole frame librdkafka 2.16.0 (confluent-kafka 2.16.1) sends for list_topics(), captured off the wire."""
    frame = bytes.fromhex("0003000d00000003000772646b61666b6100" + "00000000010000")
    request = parse_request(frame)
    assert (request.header.request_api_version, request.header.client_id) == (13, "rdkafka")
    assert bytes(request.body) == bytes.fromhex("00000000010000")
    with pytest.raises(DecodeError, match="3 bytes left over"):
        codec.decode(MetadataRequest, request.body, 13)
    body, left_over = codec.decode_request(MetadataRequest, request.body, 13)
    assert body.topics is None and left_over == 3  # all topics, as Kafka's broker reads it
    # its brokers-only request (an empty array, compact count 1) is well formed
    brokers_only = parse_request(bytes.fromhex("0003000d00000002000772646b61666b6100" + "01000000"))
    assert codec.decode(MetadataRequest, brokers_only.body, 13).topics == []


def test_truncated_bodies_are_still_refused() -> None:
    with pytest.raises(DecodeError):
        codec.decode_request(MetadataRequest, b"\x00\x01", 13)
