"""What listens at an address that accepts connections but failed a gRPC call: Kafka, gRPC, or neither.

A gRPC call to a port that is not gRPC fails as UNAVAILABLE ("Socket closed"), exactly as a
broker that is restarting does, so the client used to retry it for its whole request timeout
(30 s) and then report "Socket closed". Pointing a Sluice client at a Kafka port (a Sluice
broker's own Kafka listener, or a Kafka broker) is the likely mistake; a few bytes tell it apart.

The probe sends Kafka's ApiVersions v0 request, which every Kafka broker answers (a short one:
size, key 18, version 0, a correlation id, a null client id), and classifies the first bytes back:

* a Kafka response frame carrying our correlation id: ``KAFKA``;
* an HTTP/2 frame (a gRPC server sends its SETTINGS first, or a GOAWAY on our bytes): ``HTTP2``;
* a TLS record (an alert for our plaintext): ``TLS``;
* nothing (closed, or silent within the timeout): ``UNKNOWN``, treated as a broker that may
  come back, as before;
* anything else (an HTTP/1 server, an SSH banner): ``OTHER``.

Only ``KAFKA`` and ``OTHER`` make a client give up at once: the other answers are what a Sluice
broker (plaintext or TLS) can give while it starts or when the client's TLS settings are wrong.
"""

from __future__ import annotations

import socket
import struct
import time
from enum import StrEnum

_CORRELATION_ID = 0x51C3
_API_VERSIONS_V0 = struct.pack(">hhih", 18, 0, _CORRELATION_ID, -1)


class Listener(StrEnum):
    KAFKA = "kafka"
    HTTP2 = "http2"
    TLS = "tls"
    OTHER = "other"
    UNKNOWN = "unknown"


def split_address(addr: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` -> (host, port)."""
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


def classify(data: bytes) -> Listener:
    """The listener that sent ``data`` in answer to the ApiVersions v0 request."""
    if len(data) >= 8:
        size, correlation_id = struct.unpack(">ii", data[:8])
        if correlation_id == _CORRELATION_ID and 4 <= size <= 1 << 20:
            return Listener.KAFKA
    if len(data) >= 9 and data[3] in (0x04, 0x07):  # an HTTP/2 SETTINGS frame (a server's preface) or GOAWAY
        return Listener.HTTP2
    if len(data) >= 3 and data[0] in (0x15, 0x16) and data[1] == 0x03:  # TLS alert or handshake, version 3.x
        return Listener.TLS
    return Listener.OTHER if data else Listener.UNKNOWN


def probe(addr: str, timeout: float = 1.0) -> tuple[Listener, bytes]:
    """Connect to ``addr``, send ApiVersions v0 and classify the answer; the first bytes too (for messages)."""
    deadline = time.monotonic() + timeout
    try:
        host, port = split_address(addr)
        sock = socket.create_connection((host, port), timeout=timeout)
    except (OSError, ValueError):
        return Listener.UNKNOWN, b""
    data = b""
    with sock:
        try:
            sock.sendall(struct.pack(">i", len(_API_VERSIONS_V0)) + _API_VERSIONS_V0)
            while len(data) < 16:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                sock.settimeout(left)
                chunk = sock.recv(16 - len(data))
                if not chunk:
                    break
                data += chunk
                if classify(data) in (Listener.KAFKA, Listener.HTTP2, Listener.TLS):
                    break
        except OSError:
            pass
    return classify(data), data
