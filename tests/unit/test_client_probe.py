"""probe.classify: the first bytes a port answers Kafka's ApiVersions v0 with, and what they say it is."""

from __future__ import annotations

import struct

import pytest

from sluice.client._network.probe import Listener, classify, split_address


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (struct.pack(">ii", 42, 0x51C3) + b"\x00\x00", Listener.KAFKA),  # our correlation id back
        (b"\x00\x00\x18\x04\x00\x00\x00\x00\x00\x00\x04\x00", Listener.HTTP2),  # a gRPC server's SETTINGS
        (b"\x00\x00\x08\x07\x00\x00\x00\x00\x00", Listener.HTTP2),  # GOAWAY
        (b"\x15\x03\x03\x00\x02\x02\x32", Listener.TLS),  # a TLS alert
        (b"HTTP/1.1 400 Bad Request\r\n", Listener.OTHER),
        (b"SSH-2.0-OpenSSH_9.6\r\n", Listener.OTHER),
        (b"", Listener.UNKNOWN),  # closed without a word: may be a broker starting
        (struct.pack(">ii", 42, 7), Listener.OTHER),  # another correlation id: not an answer to us
    ],
)
def test_classify(data: bytes, kind: Listener) -> None:
    assert classify(data) == kind


def test_split_address() -> None:
    assert split_address("127.0.0.1:9092") == ("127.0.0.1", 9092)
    assert split_address("[::1]:19092") == ("::1", 19092)
