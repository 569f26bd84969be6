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

One mapping from certificate to principal serves both protocols: :func:`principal_of_name`
turns the verified certificate's CN into ``User:<CN>`` (``User:ANONYMOUS`` without one) for a
gRPC call (:func:`principal`) and for a Kafka-listener connection
(:func:`certificate_common_name` reads the CN of the certificate the TLS handshake verified),
and :class:`Caller` carries the result to the authorizer whichever protocol asked.

A broker of this cluster is a super user (as in Kafka). On the client listener a broker's CN is
not proof of that: with ``mtls`` the clients CA is trusted there too, and whoever may get a
client certificate could have one named ``sluice-broker-0``. :class:`ClusterIdentity` therefore
also checks that one of the cluster CA's certificates (the current bundle: two during a CA
rotation) signed the certificate.

On a ``token`` client listener (:mod:`sluice.broker.security.tokens`) the principal is the
ServiceAccount a TokenReview authenticated, ``ServiceAccount:<namespace>:<name>``
(:func:`principal` reads it from the call's context); such a caller is never a broker
(:meth:`Caller.of_token`): a token proves a ServiceAccount, not a cluster-CA certificate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

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


def principal_of_name(common_name: str | None) -> str:
    """Kafka's principal for a verified certificate's CN: ``User:<CN>``, or ``User:ANONYMOUS`` without one."""
    return f"User:{common_name}" if common_name else ANONYMOUS


def principal(ctx: Ctx) -> str:
    """Kafka's principal of the caller: ``ServiceAccount:<ns>:<name>`` of the token it authenticated
    with on a token listener (:mod:`sluice.broker.security.tokens`), else ``User:<CN>`` of its
    verified certificate, else ``User:ANONYMOUS``."""
    by_token = TOKEN_PRINCIPAL.get()
    if by_token is not None:
        return by_token
    return principal_of_name(peer_common_name(ctx))


def certificate_common_name(der: bytes | None) -> str | None:
    """The CN of a DER certificate (the first, as gRPC reports it), or None (no certificate, no CN)."""
    if not der:
        return None
    attrs = x509.load_der_x509_certificate(der).subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not attrs:
        return None
    return str(attrs[0].value) or None


@dataclass(frozen=True)
class Caller:
    """Who is calling, whichever protocol carried the request: what the authorizer decides on.

    ``common_name`` is the CN of the certificate the TLS handshake verified (None: plaintext, or
    TLS without a client certificate); ``principal`` follows from it (:func:`principal_of_name`).
    """

    principal: str
    host: str
    common_name: str | None = None
    # a broker of this cluster (a broker's CN on a certificate the cluster CA signed:
    # ClusterIdentity): a super user, as in Kafka
    is_broker: bool = False

    @classmethod
    def of_certificate(cls, common_name: str | None, host: str, *, is_broker: bool = False) -> Caller:
        return cls(principal_of_name(common_name), host, common_name, is_broker)

    @classmethod
    def of_token(cls, principal: str, host: str) -> Caller:
        """A caller a token listener authenticated (``ServiceAccount:<ns>:<name>``): never a broker,
        whatever certificate its connection may carry (brokers are known by cluster-CA certificates only)."""
        return cls(principal, host, None, False)


class ClusterIdentity:
    """Whether a verified peer certificate is a broker's: a broker's CN, signed by the cluster CA.

    ``cluster_ca`` returns the cluster CA bundle in force (PEM; it changes when the certificates
    are reloaded); None (no TLS material) means no caller is a broker. Verdicts are cached per
    (certificate, bundle): a signature check per request would cost more than the request.
    """

    CACHE_SIZE = 1024

    def __init__(self, cluster_ca: Callable[[], bytes] | None) -> None:
        self._cluster_ca = cluster_ca
        self._verdicts: dict[tuple[bytes, bytes], bool] = {}

    def is_broker(self, common_name: str | None, certificate: bytes | None) -> bool:
        """``certificate``: the peer's verified certificate, DER or PEM."""
        if not is_broker_name(common_name) or not certificate or self._cluster_ca is None:
            return False
        bundle = self._cluster_ca()
        key = (certificate, bundle)
        verdict = self._verdicts.get(key)
        if verdict is None:
            verdict = _signed_by_one_of(certificate, bundle)
            if len(self._verdicts) >= self.CACHE_SIZE:
                self._verdicts.clear()
            self._verdicts[key] = verdict
        return verdict


def _signed_by_one_of(certificate: bytes, bundle: bytes) -> bool:
    try:
        pem = (
            certificate
            if certificate.lstrip().startswith(b"-----BEGIN")
            else x509.load_der_x509_certificate(certificate).public_bytes(serialization.Encoding.PEM)
        )
        cas = x509.load_pem_x509_certificates(bundle)
    except ValueError:
        return False
    return any(tls.signed_by(pem, ca.public_bytes(serialization.Encoding.PEM)) for ca in cas)


def peer_certificate(ctx: Ctx) -> bytes | None:
    """The PEM of the verified certificate the caller presented, or None."""
    if _first(ctx, "transport_security_type") != "ssl":
        return None
    for value in ctx.auth_context().get("x509_pem_cert") or ():
        return bytes(value)
    return None


def client_listener_credentials(mode: str, material: tls.TlsMaterial, clients_ca: str) -> grpc.ServerCredentials:
    """TLS of the client listener: ``tls`` (server certificate only) or ``mtls``.

    With ``mtls`` a client must present a certificate from the clients CA, or from the cluster CA
    (the brokers' and the local controller's own certificates, so health checks and cluster
    components authenticate the same way; they are principals like any other).
    """
    pair = [(material.key_pem, material.cert_pem)]
    if mode in ("tls", "token"):  # token: who the caller is comes from its token, not a certificate
        return grpc.ssl_server_credentials(pair)
    return grpc.ssl_server_credentials(
        pair, root_certificates=client_roots(material, clients_ca), require_client_auth=True
    )


def client_roots(material: tls.TlsMaterial, clients_ca: str) -> bytes:
    """The CAs client certificates are verified against on every client listener (gRPC and Kafka):
    the clients CA file, and the cluster CA (cluster components authenticate like clients)."""
    try:
        roots = open(clients_ca, "rb").read()  # noqa: SIM115 - read once at start-up
    except OSError as exc:
        raise tls.TlsError(f"cannot read --clients-ca {clients_ca}: {exc.strerror or exc}") from None
    return roots + material.ca_pem


def server_credentials(ca_pem: bytes, cert_pem: bytes, key_pem: bytes) -> grpc.ServerCredentials:
    """TLS for the inter-broker listener: present this broker's certificate, require one signed by the CA."""
    return grpc.ssl_server_credentials([(key_pem, cert_pem)], root_certificates=ca_pem, require_client_auth=True)


def channel_credentials(ca_pem: bytes, cert_pem: bytes, key_pem: bytes) -> grpc.ChannelCredentials:
    """TLS to another broker's inter-broker listener: verify it against the CA, present our certificate."""
    return grpc.ssl_channel_credentials(root_certificates=ca_pem, private_key=key_pem, certificate_chain=cert_pem)
