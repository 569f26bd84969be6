"""Kafka's framing: size-prefixed requests and responses, and the request/response headers.

Every request is ``int32 size`` + header + body. The header version follows from
the API and its version (Kafka's rule: header v2 for the flexible versions of an
API, v1 before; v0 only existed for ControlledShutdown v0, which Kafka 4 dropped).
A response is ``int32 size`` + ``correlation_id`` (+ an empty tagged-field
section in header v1, used by flexible responses), except ApiVersions, whose
response header is always v0 so that a client can read it whatever version it
guessed (KIP-511).

The size prefix is checked against ``socket.request.max.bytes`` before a byte
of the body is read: an oversized claim costs nothing but the four bytes.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass

from sluice.broker.kafka_wire import codec
from sluice.broker.kafka_wire.codec import DecodeError, Message
from sluice.broker.kafka_wire.messages import APIS
from sluice.broker.kafka_wire.messages.request_header import RequestHeader

API_VERSIONS_KEY = 18
_SIZE = struct.Struct(">i")
_KEY_VERSION = struct.Struct(">hh")


class FrameError(Exception):
    """The connection sent something that is not a Kafka request: it is closed (one log line)."""


@dataclass(frozen=True, slots=True)
class Request:
    header: RequestHeader
    body: memoryview  # the bytes after the header, not decoded yet


async def read_frame(
    reader: asyncio.StreamReader, max_bytes: int, limit_name: str = "socket.request.max.bytes"
) -> bytes | None:
    """One frame's bytes (without the size), or None when the peer closed between frames.

    ``limit_name``: the setting ``max_bytes`` comes from, for the error."""
    try:
        prefix = await reader.readexactly(4)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise FrameError(f"connection closed inside a size prefix ({len(exc.partial)} of 4 bytes)") from None
    (size,) = _SIZE.unpack(prefix)
    if size < _KEY_VERSION.size + 4:
        raise FrameError(f"frame size {size} is too small for a request header")
    if size > max_bytes:
        raise FrameError(f"frame of {size} bytes exceeds {limit_name} ({max_bytes})")
    try:
        return await reader.readexactly(size)
    except asyncio.IncompleteReadError as exc:
        raise FrameError(f"connection closed after {len(exc.partial)} of a {size}-byte frame") from None


def request_header_version(api_key: int, api_version: int) -> int:
    api = APIS.get(api_key)
    if api is None:
        raise FrameError(f"unknown API key {api_key}")
    # A version above the newest known is read with the newest header: what a newer client sends
    # (KIP-511's ApiVersions probe relies on it).
    return 2 if api_version in api.flexible or api_version > api.valid.hi >= api.flexible.lo else 1


def parse_request(frame: bytes) -> Request:
    """The header of a frame (any known API, any version) and the body's bytes."""
    api_key, api_version = _KEY_VERSION.unpack_from(frame, 0)
    version = request_header_version(api_key, api_version)
    reader = codec.Reader(frame)
    try:
        header = codec.decode_from(reader, RequestHeader, version)
    except DecodeError as exc:
        raise FrameError(f"undecodable request header: {exc}") from None
    return Request(header, reader.buf[reader.pos :])


def response_segments(api_key: int, correlation_id: int, body: Message, version: int) -> list[codec.Buffer]:
    """The whole response frame (size, header: v0, or v1 for a flexible response; body) as buffers
    to send in order: a fetch answer's batches (:class:`~sluice.broker.kafka_wire.codec.Chunks`)
    are among them as they were read, not copied into the frame."""
    head = bytearray(8)
    _SIZE.pack_into(head, 4, correlation_id)
    if version in body.SCHEMA.flexible and api_key != API_VERSIONS_KEY:
        head.append(0)  # header v1: no tagged fields
    segments = codec.encode_segments(head, body, version)
    first = segments[0]
    assert isinstance(first, bytearray)  # the head, with room for the size
    _SIZE.pack_into(first, 0, sum(len(s) for s in segments) - 4)
    return segments


def response_frame(api_key: int, correlation_id: int, body: Message, version: int) -> bytes:
    """The whole response frame as one string of bytes (:func:`response_segments` joined)."""
    return b"".join(response_segments(api_key, correlation_id, body, version))
