"""Kafka framing and the listener's options, without a broker: sizes, header versions, limits."""

from __future__ import annotations

import asyncio
import gc
import ssl
import struct
import uuid
from pathlib import Path

import pytest

from sluice.broker.config import BrokerConfig, ConfigError
from sluice.broker.kafka import transport
from sluice.broker.kafka.framing import (
    FrameError,
    parse_request,
    read_frame,
    request_header_version,
    response_frame,
    response_segments,
)
from sluice.broker.kafka.options import KafkaOptions
from sluice.broker.kafka_wire import codec
from sluice.broker.kafka_wire.messages.api_versions_response import ApiVersionsResponse
from sluice.broker.kafka_wire.messages.fetch_response import FetchableTopicResponse, FetchResponse, PartitionData
from sluice.broker.kafka_wire.messages.metadata_response import MetadataResponse
from sluice.broker.main import main
from sluice.testing.certs import broker_tls_dirs, clients_ca_file
from sluice.tls import TlsError


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


TOPIC_ID = uuid.UUID(int=7)


@pytest.mark.parametrize("version", [4, 12, 16])  # int32 lengths before v12, compact ones after
def test_a_fetch_response_sends_its_large_batches_uncopied_and_the_same_bytes(version: int) -> None:
    big = [bytes([i]) * (codec.UNCOPIED_FROM + i) for i in range(3)]
    small = [b"h" * 61, b"tiny"]
    parts = [small[0], big[0], big[1], small[1], big[2]]

    def response(records: bytes | codec.Chunks) -> FetchResponse:
        partitions = [PartitionData(partition_index=i, records=records if i == 1 else b"x") for i in range(3)]
        return FetchResponse(responses=[FetchableTopicResponse(topic="t", topic_id=TOPIC_ID, partitions=partitions)])

    segments = response_segments(1, 9, response(codec.Chunks(parts)), version)
    body = codec.encode(response(b"".join(parts)), version)
    header = struct.pack(">i", 9) + (b"\x00" if version >= 12 else b"")  # flexible from v12: header v1
    joined = struct.pack(">i", len(header) + len(body)) + header + body
    assert b"".join(segments) == joined  # the same frame, size prefix included
    assert response_frame(1, 9, response(codec.Chunks(parts)), version) == joined
    # the large chunks are passed on as given; the small ones are copied into the bytes around them
    assert [s for s in segments if any(s is b for b in big)] == big
    assert segments[1:3] == big[:2] and segments[4] is big[2]
    assert segments[3] == b"tiny" and segments[0].endswith(small[0])  # small parts joined the bytes around them
    assert len(segments) == 6  # and the rest of the response after the last chunk
    decoded = codec.decode(FetchResponse, joined[8 + (version >= 12) :], version)
    assert decoded.responses[0].partitions[1].records == b"".join(parts)
    # nothing but the list keeps the batches: dropped with it, they are freed at once (no cycle)
    stored = bytearray(b"s" * codec.UNCOPIED_FROM)
    view = memoryview(stored)
    gc.disable()  # a collection would hide a cycle
    try:
        segments = response_segments(1, 9, response(codec.Chunks([view])), version)
        del segments, view
        stored.append(0)  # BufferError while any view of it is alive
    finally:
        gc.enable()


def test_options() -> None:
    assert KafkaOptions.parse(None, None) is None
    assert KafkaOptions.parse("0.0.0.0:9093", "[::1]:19093") == KafkaOptions(("0.0.0.0", 9093), ("::1", 19093))
    for listen, advertise in (("nohost", None), ("h:0", None), ("h:x", None), (None, "h:1"), ("h:1", "h:70000")):
        with pytest.raises(ConfigError):
            KafkaOptions.parse(listen, advertise)


def test_broker_refuses_a_bad_kafka_listen(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--id", "0", "--listen", "127.0.0.1:1", "--data", str(tmp_path), "--kafka-listen", "x"]) == 2
    assert "--kafka-listen" in capsys.readouterr().err


def test_the_kafka_listener_takes_the_client_listeners_tls(tmp_path: Path) -> None:
    """No separate setting: plaintext, tls or mtls as --client-listener, with the same files."""
    tls_dir = broker_tls_dirs(tmp_path, [0], "127.0.0.1")[0]
    clients_ca = clients_ca_file(tmp_path)

    def config(mode: str, ca: str = "") -> BrokerConfig:
        return BrokerConfig.build(
            0, "127.0.0.1", 1, str(tmp_path), str(tmp_path / "m.sqlite"), {},
            inter_broker_port=2, tls_dir=str(tls_dir), client_listener=mode, clients_ca=ca,
        )  # fmt: skip

    assert transport.server_context(config("plaintext")) is None
    one_way = transport.server_context(config("tls"))
    assert one_way is not None and one_way.verify_mode == ssl.CERT_NONE
    mutual = transport.server_context(config("mtls", str(clients_ca)))
    assert mutual is not None and mutual.verify_mode == ssl.CERT_REQUIRED
    # the clients CA and the cluster CA, as on the gRPC client listener
    assert {c["subject"][0][0][1] for c in mutual.get_ca_certs()} == {
        "sluice-local-clients-ca",
        "sluice-local-cluster-ca",
    }
    with pytest.raises(TlsError, match="clients-ca"):
        transport.server_context(config("mtls", str(tmp_path / "missing.crt")))


def test_the_kafka_listener_beside_a_token_client_listener_is_tls_without_client_certificates(
    tmp_path: Path,
) -> None:
    """With ``--client-listener token`` the Kafka port is SASL_SSL: TLS with the broker's certificate
    and no client certificate asked for; the SASL OAUTHBEARER exchange then authenticates the
    ServiceAccount (sluice.broker.kafka.authentication; tests/k8s/test_kafka_oauthbearer.py)."""
    tls_dir = broker_tls_dirs(tmp_path, [0], "127.0.0.1")[0]
    token = BrokerConfig.build(
        0, "127.0.0.1", 1, str(tmp_path), str(tmp_path / "m.sqlite"), {},
        inter_broker_port=2, tls_dir=str(tls_dir), client_listener="token",
    )  # fmt: skip
    context = transport.server_context(token)
    assert context is not None and context.verify_mode == ssl.CERT_NONE
