"""Kafka framing and the listener's options, without a broker: sizes, header versions, limits."""

from __future__ import annotations

import asyncio
import struct

import pytest

from sluice.broker.config import ConfigError
from sluice.broker.kafka import codec
from sluice.broker.kafka.framing import FrameError, parse_request, read_frame, request_header_version, response_frame
from sluice.broker.kafka.messages.api_versions_response import ApiVersionsResponse
from sluice.broker.kafka.messages.metadata_response import MetadataResponse
from sluice.broker.kafka.options import KafkaOptions
from sluice.broker.main import main


def frames(data: bytes, limit: int = 1024) -> list[bytes | None]:
    async def run() -> list[bytes | None]:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        out: list[bytes | None] = []
        while True:
            frame = await read_frame(reader, limit)
            out.append(frame)
            if frame is None:
                return out

    return asyncio.run(run())


def test_frames_split_on_their_size_prefix() -> None:
    a, b = b"x" * 8, b"y" * 20
    assert frames(struct.pack(">i", 8) + a + struct.pack(">i", 20) + b) == [a, b, None]


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (struct.pack(">i", 2048) + b"z" * 2048, "exceeds socket.request.max.bytes"),
        (struct.pack(">i", -1), "too small"),
        (struct.pack(">i", 100) + b"z" * 10, "after 10 of a 100-byte frame"),
        (b"\x00\x00", "inside a size prefix"),
    ],
)
def test_bad_frames_are_refused_with_the_reason(data: bytes, reason: str) -> None:
    with pytest.raises(FrameError, match=reason):
        frames(data)


def test_header_versions() -> None:
    assert request_header_version(3, 8) == 1 and request_header_version(3, 9) == 2  # Metadata: flexible from 9
    assert request_header_version(18, 2) == 1 and request_header_version(18, 3) == 2
    assert request_header_version(18, 50) == 2  # a future ApiVersions is read with the newest header
    with pytest.raises(FrameError, match="unknown API key 999"):
        request_header_version(999, 0)


def test_parse_request_leaves_the_body_undecoded() -> None:
    frame = struct.pack(">hhi", 3, 12, 77) + struct.pack(">h", 2) + b"id" + b"\x00" + b"BODY"
    request = parse_request(frame)
    assert (request.header.request_api_key, request.header.correlation_id, request.header.client_id) == (3, 77, "id")
    assert bytes(request.body) == b"BODY"


def test_response_headers() -> None:
    # flexible Metadata (v9+): header v1 has an (empty) tagged-field section after the correlation id
    flexible = response_frame(3, 5, MetadataResponse(), 12)
    assert flexible[4:9] == struct.pack(">i", 5) + b"\x00"
    assert struct.unpack(">i", flexible[:4])[0] == len(flexible) - 4
    assert codec.decode(MetadataResponse, flexible[9:], 12) == MetadataResponse()
    # ApiVersions: header v0 even at flexible versions (KIP-511)
    av = response_frame(18, 6, ApiVersionsResponse(), 3)
    assert codec.decode(ApiVersionsResponse, av[8:], 3) == ApiVersionsResponse()


def test_options() -> None:
    assert KafkaOptions.parse(None, None) is None
    assert KafkaOptions.parse("0.0.0.0:9093", "[::1]:19093") == KafkaOptions(("0.0.0.0", 9093), ("::1", 19093))
    for listen, advertise in (("nohost", None), ("h:0", None), ("h:x", None), (None, "h:1"), ("h:1", "h:70000")):
        with pytest.raises(ConfigError):
            KafkaOptions.parse(listen, advertise)


def test_broker_refuses_a_bad_kafka_listen(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--id", "0", "--listen", "127.0.0.1:1", "--data", str(tmp_path), "--kafka-listen", "x"]) == 2
    assert "--kafka-listen" in capsys.readouterr().err


def test_broker_refuses_a_kafka_listener_beside_the_authorizer(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    """The Kafka listener checks no ACLs yet: it must not open a door around a secured broker."""
    argv = ["--id", "0", "--listen", "127.0.0.1:1", "--data", str(tmp_path), "--kafka-listen", "127.0.0.1:2"]
    assert main([*argv, "--config", "authorizer.enabled=true"]) == 2
    assert "no TLS or ACL checks" in capsys.readouterr().err
