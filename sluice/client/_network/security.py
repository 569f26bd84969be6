"""How a client connects: plaintext, or TLS with an optional client certificate (mutual TLS).

Kafka's client names: ``security_protocol`` is ``"PLAINTEXT"`` (the default, a local cluster on
loopback) or ``"SSL"``; ``ssl_cafile`` is the CA the brokers' certificates are verified against
(the cluster CA; the system's roots when not given); ``ssl_certfile`` and ``ssl_keyfile`` are the
client's own certificate and key, which a broker whose client listener is ``mtls`` requires and
turns into the principal ``User:<CN>``. Files are read once, when the client is made, so a
missing or unreadable file fails the constructor with a message naming it (not every RPC later).

``"SASL_SSL"`` is TLS plus a Kubernetes ServiceAccount token sent with every call (a broker
whose client listener is ``token`` requires it and turns it into ``ServiceAccount:<ns>:<name>``):
``sasl_mechanism`` ``"OAUTHBEARER"`` (the default and only one), ``sasl_oauthbearer_token_file``
the token's file, re-read when it changes (:mod:`sluice.client._network.token_credentials`).
Tokens are never sent in plaintext: there is no SASL_PLAINTEXT.

Brokers are reached by IP address (the addresses they register), so the server name checked in
a broker's certificate is ``sluice-broker``, which every broker certificate carries (as brokers
check each other's, :data:`sluice.tls.BROKER_SERVER_NAME`); the CA (``ssl_cafile``) is the
cluster's, which signs only brokers (and the cluster's own components).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from sluice import tls
from sluice.client._network.token_credentials import TokenFile

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_SSL")
SASL_MECHANISMS = ("OAUTHBEARER",)


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
    token: TokenFile | None = None

    @classmethod
    def build(
        cls,
        security_protocol: str = "PLAINTEXT",
        ssl_cafile: str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
        *,
        sasl_mechanism: str | None = None,
        sasl_oauthbearer_token_file: str | None = None,
    ) -> ClientSecurity:
        """Check the settings (ValueError naming what is wrong) and read the files."""
        protocol = security_protocol.upper()
        if protocol == "SASL_PLAINTEXT":
            raise ValueError("security_protocol='SASL_PLAINTEXT' is not supported: tokens go over TLS only (SASL_SSL)")
        if protocol not in PROTOCOLS:
            raise ValueError(f"security_protocol must be one of {', '.join(PROTOCOLS)}, not {security_protocol!r}")
        sasl = (("sasl_mechanism", sasl_mechanism), ("sasl_oauthbearer_token_file", sasl_oauthbearer_token_file))
        if protocol != "SASL_SSL" and any(value for _, value in sasl):
            named = ", ".join(name for name, value in sasl if value)
            raise ValueError(f"{named} given with security_protocol={security_protocol!r}: use 'SASL_SSL'")
        files = (("ssl_cafile", ssl_cafile), ("ssl_certfile", ssl_certfile), ("ssl_keyfile", ssl_keyfile))
        given = [name for name, value in files if value]
        if protocol == "PLAINTEXT":
            if given:
                raise ValueError(f"{', '.join(given)} given with security_protocol='PLAINTEXT': use 'SSL'")
            return cls()
        if bool(ssl_certfile) != bool(ssl_keyfile):
            raise ValueError("ssl_certfile and ssl_keyfile go together (the client certificate and its key)")
        token = None
        if protocol == "SASL_SSL":
            mechanism = (sasl_mechanism or "OAUTHBEARER").upper()
            if mechanism not in SASL_MECHANISMS:
                raise ValueError(f"sasl_mechanism must be OAUTHBEARER (a ServiceAccount token), not {sasl_mechanism!r}")
            if not sasl_oauthbearer_token_file:
                raise ValueError("security_protocol='SASL_SSL' needs sasl_oauthbearer_token_file (the token's file)")
            token = TokenFile(sasl_oauthbearer_token_file)
        return cls(
            protocol,
            _read("ssl_cafile", ssl_cafile),
            _read("ssl_certfile", ssl_certfile),
            _read("ssl_keyfile", ssl_keyfile),
            token,
        )

    def channel(self, address: str, options: Sequence[tuple[str, Any]]) -> grpc.Channel:
        """A channel to ``address`` with this security."""
        if self.protocol == "PLAINTEXT":
            return grpc.insecure_channel(address, options=list(options))
        creds = grpc.ssl_channel_credentials(self.ca_pem, self.key_pem, self.cert_pem)
        if self.token is not None:
            creds = grpc.composite_channel_credentials(creds, self.token.call_credentials())
        named = [*options, ("grpc.ssl_target_name_override", tls.BROKER_SERVER_NAME)]
        return grpc.secure_channel(address, creds, options=named)


PLAINTEXT = ClientSecurity()
