"""The Kafka listener's transport security: TLS and client certificates, as on the gRPC client listener.

The Kafka listener has no security setting of its own: it follows ``--client-listener``, with
the same files and the same trust as the gRPC client port beside it
(:func:`sluice.broker.security.peers.client_roots`). One setting for a broker's client doors
means the Kafka port can never be the weaker door around a secured gRPC port, and a client
certificate means the same principal on both:

* ``plaintext``: no TLS; every caller is ``User:ANONYMOUS`` (with the authorizer on, ACLs for
  ``User:ANONYMOUS`` decide, as on a Kafka PLAINTEXT listener);
* ``tls``: the broker presents its certificate (``--broker-tls-dir``); no client certificate is
  asked for, so callers are ``User:ANONYMOUS`` (Kafka's SSL listener with
  ``ssl.client.auth=none``);
* ``mtls``: a certificate signed by the clients CA (or the cluster CA) is required, else the
  handshake fails and no request is read (``ssl.client.auth=required``); the principal is
  ``User:<CN>``, by the same mapping as gRPC's (:class:`~sluice.broker.security.peers.Caller`);
* ``token``: TLS as with ``tls`` (no client certificate asked for), and then SASL OAUTHBEARER
  with the client's ServiceAccount token before any other request is served (Kafka's SASL_SSL;
  :mod:`~sluice.broker.kafka.authentication`); the principal is ``ServiceAccount:<ns>:<name>``.

The handshake is made by the connection's own task (``StreamWriter.start_tls``) rather than by
the server, so a failed one is logged once with the peer and the reason (a plaintext client,
no certificate, a certificate from another CA) and is bounded by :data:`HANDSHAKE_TIMEOUT_S`.
It must be the connection's first await: bytes read from the socket before it would be lost
to the TLS layer.

Certificates renewed or a CA rotated while the broker runs (sluice.broker.security.reload):
:class:`ServerContexts` makes a new context when the broker's TLS files were reloaded, so new
connections get the new certificate and trust (open ones keep theirs), as on the gRPC listeners.
The material is read as the broker reads it (``broker-<id>.crt`` in the operator's Secret).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from pathlib import Path

from sluice import tls
from sluice.broker.config import BrokerConfig
from sluice.broker.security.peers import Caller, ClusterIdentity, certificate_common_name, client_roots
from sluice.broker.security.reload import files_for

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 30.0  # a client that connects and never completes a handshake is dropped
_NOT_TLS = {
    "WRONG_VERSION_NUMBER",
    "HTTP_REQUEST",
    "UNKNOWN_PROTOCOL",
    "RECORD_LAYER_FAILURE",
    "PACKET_LENGTH_TOO_LONG",
}


def server_context(config: BrokerConfig, material: tls.TlsMaterial | None = None) -> ssl.SSLContext | None:
    """The listener's TLS context for the broker's ``--client-listener`` mode (None: plaintext).

    TlsError when the material cannot be read (the broker stops at start, naming the file).
    """
    if config.client_listener == "plaintext":
        return None
    material = material or tls.load_dir(config.tls_dir, config.broker_id)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    directory = Path(config.tls_dir)
    _ca_file, cert_file, key_file = tls.material_files(config.tls_dir, config.broker_id)
    try:
        context.load_cert_chain(cert_file, key_file)
        if config.client_listener == "mtls":
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cadata=client_roots(material, config.clients_ca).decode("ascii"))
    except (ssl.SSLError, ValueError) as exc:
        raise tls.TlsError(f"the Kafka listener cannot use the TLS material of {directory}: {exc}") from None
    return context


class ServerContexts:
    """The listener's TLS context, made again after the broker reloaded its TLS files."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self._files = files_for(config) if config.client_listener != "plaintext" else None
        self._version = self._files.loaded.version if self._files is not None else 0
        self._context = server_context(config, self._files.material if self._files is not None else None)

    def current(self) -> ssl.SSLContext | None:
        """The context for a new connection (None: plaintext)."""
        if self._files is not None and self._files.loaded.version != self._version:
            loaded = self._files.loaded
            try:
                self._context = server_context(self.config, loaded.material)
            except tls.TlsError as exc:  # files moving again under us: keep the current context, try later
                log.warning("kafka listener: keeping its TLS context for now: %s", exc)
                return self._context
            self._version = loaded.version
        return self._context


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"the client certificate was refused: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError):
        if exc.reason == "PEER_DID_NOT_RETURN_A_CERTIFICATE":
            return "no client certificate (this listener requires one)"
        if exc.reason in _NOT_TLS:
            return f"not a TLS handshake (a plaintext client on a TLS listener?): {exc.reason}"
        return f"{exc.reason or exc}"
    return str(exc) or type(exc).__name__


async def handshake(writer: asyncio.StreamWriter, context: ssl.SSLContext) -> bool:
    """Upgrade the connection to TLS; False (one log line naming the peer and why) when it fails."""
    try:
        await writer.start_tls(context, ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S)
    except OSError as exc:  # ssl.SSLError, ConnectionError, the handshake timeout
        log.warning("kafka listener: TLS handshake with %s failed: %s", writer.get_extra_info("peername"), _reason(exc))
        return False
    return True


def connection_caller(writer: asyncio.StreamWriter, identity: ClusterIdentity) -> Caller:
    """Who is at the other end: ``User:<CN>`` of the certificate the handshake verified, else anonymous."""
    peer = writer.get_extra_info("peername")
    host = str(peer[0]) if isinstance(peer, tuple) and peer else ""
    ssl_object = writer.get_extra_info("ssl_object")
    der = ssl_object.getpeercert(binary_form=True) if isinstance(ssl_object, ssl.SSLObject) else None
    name = certificate_common_name(der)
    return Caller.of_certificate(name, host, is_broker=identity.is_broker(name, der))
