"""Who is calling: principals from a call's TLS auth context, and the inter-broker door.

A gRPC call's auth context (filled by the TLS handshake) names the verified peer certificate's
common name. On the inter-broker listener the handshake already required a certificate signed
by the cluster CA, which signs broker certificates only; :func:`require_broker` checks again,
per call and before the request is looked at, that the certificate is a broker's (its CN is
``sluice-broker-<id>`` or ``sluice-broker``), so a listener set up by mistake with a CA that
also signs clients still refuses clients.

On the client listener the inter-broker methods exist only to refuse:
:data:`CLIENT_LISTENER_REFUSAL` is what a caller gets there (PERMISSION_DENIED), whatever it
sent and whoever it is; nothing is decoded.
"""

from __future__ import annotations

from typing import Any

import grpc

from sluice import tls
from sluice.broker.security.tokens import TOKEN_PRINCIPAL
from sluice.tls import BROKER_CN_PREFIX

Ctx = grpc.aio.ServicerContext[Any, Any]

CLIENT_LISTENER_REFUSAL = (
    "inter-broker RPCs are served only on a broker's inter-broker listener, to peers presenting a "
    "broker certificate of this cluster (mutual TLS with the cluster CA); clients never need them"
)


def _first(ctx: Ctx, key: str) -> str | None:
    for value in ctx.auth_context().get(key) or ():
        return value.decode("utf-8", "replace")
    return None


def peer_common_name(ctx: Ctx) -> str | None:
    """The CN of the verified certificate the caller presented, or None (no TLS, no certificate)."""
    if _first(ctx, "transport_security_type") != "ssl":
        return None
    return _first(ctx, "x509_common_name")


def is_broker_name(common_name: str | None) -> bool:
    if not common_name:
        return False
    return common_name == BROKER_CN_PREFIX or (
        common_name.startswith(BROKER_CN_PREFIX + "-") and common_name[len(BROKER_CN_PREFIX) + 1 :].isdigit()
    )


async def require_broker(ctx: Ctx) -> str:
    """The calling broker's CN; aborts the call UNAUTHENTICATED (no certificate) or PERMISSION_DENIED."""
    name = peer_common_name(ctx)
    if name is None:
        await ctx.abort(grpc.StatusCode.UNAUTHENTICATED, "inter-broker RPCs need a broker certificate (mutual TLS)")
    if not is_broker_name(name):
        await ctx.abort(
            grpc.StatusCode.PERMISSION_DENIED, f"User:{name} is not a broker of this cluster: inter-broker RPCs refused"
        )
    assert name is not None
    return name


ANONYMOUS = "User:ANONYMOUS"


def principal(ctx: Ctx) -> str:
    """Kafka's principal of the caller: ``ServiceAccount:<ns>:<name>`` of the token it authenticated
    with on a token listener (:mod:`sluice.broker.security.tokens`), else ``User:<CN>`` of its
    verified certificate, else ``User:ANONYMOUS``."""
    by_token = TOKEN_PRINCIPAL.get()
    if by_token is not None:
        return by_token
    name = peer_common_name(ctx)
    return f"User:{name}" if name else ANONYMOUS


def client_listener_credentials(mode: str, material: tls.TlsMaterial, clients_ca: str) -> grpc.ServerCredentials:
    """TLS of the client listener: ``tls`` (server certificate only) or ``mtls``.

    With ``mtls`` a client must present a certificate from the clients CA, or from the cluster CA
    (the brokers' and the local controller's own certificates, so health checks and cluster
    components authenticate the same way; they are principals like any other).
    """
    pair = [(material.key_pem, material.cert_pem)]
    if mode in ("tls", "token"):  # token: who the caller is comes from its token, not a certificate
        return grpc.ssl_server_credentials(pair)
    try:
        roots = open(clients_ca, "rb").read()  # noqa: SIM115 - read once at start-up
    except OSError as exc:
        raise tls.TlsError(f"cannot read --clients-ca {clients_ca}: {exc.strerror or exc}") from None
    return grpc.ssl_server_credentials(pair, root_certificates=roots + material.ca_pem, require_client_auth=True)


def server_credentials(ca_pem: bytes, cert_pem: bytes, key_pem: bytes) -> grpc.ServerCredentials:
    """TLS for the inter-broker listener: present this broker's certificate, require one signed by the CA."""
    return grpc.ssl_server_credentials([(key_pem, cert_pem)], root_certificates=ca_pem, require_client_auth=True)


def channel_credentials(ca_pem: bytes, cert_pem: bytes, key_pem: bytes) -> grpc.ChannelCredentials:
    """TLS to another broker's inter-broker listener: verify it against the CA, present our certificate."""
    return grpc.ssl_channel_credentials(root_certificates=ca_pem, private_key=key_pem, certificate_chain=cert_pem)
