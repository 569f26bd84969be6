"""How a client connects: plaintext, or TLS with an optional client certificate (mutual TLS).

Kafka's client names: ``security_protocol`` is ``"PLAINTEXT"`` (the default, a local cluster on
loopback) or ``"SSL"``; ``ssl_cafile`` is the CA the brokers' certificates are verified against
(the cluster CA; the system's roots when not given); ``ssl_certfile`` and ``ssl_keyfile`` are the
client's own certificate and key, which a broker whose client listener is ``mtls`` requires and
turns into the principal ``User:<CN>``. Files are read once, when the client is made, so a
missing or unreadable file fails the constructor with a message naming it (not every RPC later).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

PROTOCOLS = ("PLAINTEXT", "SSL")


def _read(what: str, path: str | None) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{what} {path!r} cannot be read: {exc.strerror or exc}") from None


@dataclass(frozen=True)
class ClientSecurity:
    """A client's transport security, ready to open channels with."""

    protocol: str = "PLAINTEXT"
    ca_pem: bytes | None = None
    cert_pem: bytes | None = None
    key_pem: bytes | None = None

    @classmethod
    def build(
        cls,
        security_protocol: str = "PLAINTEXT",
        ssl_cafile: str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
    ) -> ClientSecurity:
        """Check the settings (ValueError naming what is wrong) and read the files."""
        protocol = security_protocol.upper()
        if protocol not in PROTOCOLS:
            raise ValueError(f"security_protocol must be one of {', '.join(PROTOCOLS)}, not {security_protocol!r}")
        files = (("ssl_cafile", ssl_cafile), ("ssl_certfile", ssl_certfile), ("ssl_keyfile", ssl_keyfile))
        given = [name for name, value in files if value]
        if protocol == "PLAINTEXT":
            if given:
                raise ValueError(f"{', '.join(given)} given with security_protocol='PLAINTEXT': use 'SSL'")
            return cls()
        if bool(ssl_certfile) != bool(ssl_keyfile):
            raise ValueError("ssl_certfile and ssl_keyfile go together (the client certificate and its key)")
        return cls(
            protocol,
            _read("ssl_cafile", ssl_cafile),
            _read("ssl_certfile", ssl_certfile),
            _read("ssl_keyfile", ssl_keyfile),
        )

    def channel(self, address: str, options: Sequence[tuple[str, Any]]) -> grpc.Channel:
        """A channel to ``address`` with this security."""
        if self.protocol == "PLAINTEXT":
            return grpc.insecure_channel(address, options=list(options))
        creds = grpc.ssl_channel_credentials(self.ca_pem, self.key_pem, self.cert_pem)
        return grpc.secure_channel(address, creds, options=list(options))


PLAINTEXT = ClientSecurity()
