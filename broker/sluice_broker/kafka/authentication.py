"""SASL on the Kafka listener: OAUTHBEARER with Kubernetes ServiceAccount tokens.

With ``--client-listener token`` the Kafka listener is Kafka's SASL_SSL listener with the one
mechanism OAUTHBEARER: TLS with the broker's certificate (:mod:`~sluice.broker.kafka.transport`),
then SaslHandshake v1 and SaslAuthenticate v0-v2 (KIP-152), the bearer token of the client-first
message (:mod:`~sluice.broker.kafka.oauthbearer`) checked by the gRPC token listener's own
:class:`~sluice.broker.security.tokens.TokenAuthenticator` (one object per broker: one cache of
reviews, one review per distinct token whichever protocol brought it; the review runs in a
thread, never on the event loop). The principal is ``ServiceAccount:<namespace>:<name>`` and the
ACLs apply to it as to any principal.

Each connection has a :class:`SaslSession`, a small state machine the listener consults before
serving a request (:meth:`SaslSession.admits`) and after answering one
(:attr:`SaslSession.closing`), as Kafka's SaslServerAuthenticator does:

* before authentication only ApiVersions, SaslHandshake and SaslAuthenticate are served; any
  other request closes the connection, so nothing is served to an unauthenticated client; and a
  frame larger than ``sasl.server.max.receive.size`` (512 KiB) closes it before it is read;
* a handshake for another mechanism is UNSUPPORTED_SASL_MECHANISM (the list says OAUTHBEARER),
  SaslAuthenticate before a handshake ILLEGAL_SASL_STATE; both close the connection;
* a message that is not a client-first message is SASL_AUTHENTICATION_FAILED at once;
* a token refused (forged, expired, another audience, not a ServiceAccount) is answered with the
  RFC 7628 error challenge ``{"status":"invalid_token"}``; the client acknowledges it with
  ``\\x01`` and gets SASL_AUTHENTICATION_FAILED with the reason (Kafka's OAuthBearerSaslServer
  and every client follow this exchange). The connection is then closed;
* the API server not answering the review closes the connection without an answer: the client
  reconnects and tries again (SASL_AUTHENTICATION_FAILED would be final for it);
* success answers ``session_lifetime_ms`` (SaslAuthenticate v1+): until the token's ``exp``,
  and no longer than ``connections.max.reauth.ms`` when that is set (Kafka's key; 0, the
  default, sets no bound of its own). A client re-authenticates before then on the same
  connection (KIP-368: a new handshake and token, for the same principal); a request after the
  session ended closes the connection. An expired token is thus refused on a connection too, as
  the gRPC listener refuses it on every call.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from sluice.broker.kafka import oauthbearer
from sluice.broker.kafka_wire.codec import Message
from sluice.broker.kafka_wire.messages.sasl_authenticate_response import SaslAuthenticateResponse
from sluice.broker.kafka_wire.messages.sasl_handshake_response import SaslHandshakeResponse
from sluice.broker.security.peers import Caller
from sluice.broker.security.tokens import (
    SERVICE_ACCOUNT_USER,
    ReviewUnavailable,
    TokenAuthenticator,
    TokenRefused,
    token_expiry,
)

log = logging.getLogger(__name__)

API_VERSIONS_KEY = 18
SASL_HANDSHAKE_KEY = 17
SASL_AUTHENTICATE_KEY = 36
# Kafka's error codes (not in records.proto's ErrorCode: the gRPC API never needed the first two)
UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
SASL_AUTHENTICATION_FAILED = 58
_SASL_KEYS = frozenset({API_VERSIONS_KEY, SASL_HANDSHAKE_KEY, SASL_AUTHENTICATE_KEY})


class ReviewFailed(Exception):
    """The token could not be checked now (the API server did not answer): close, the client retries."""


class State(enum.Enum):
    HANDSHAKE = "awaiting SaslHandshake"
    CLIENT_FIRST = "awaiting the client-first message"
    ACKNOWLEDGE = "awaiting the client's acknowledgement of the error challenge"
    AUTHENTICATED = "authenticated"


@dataclass
class SaslSession:
    """One connection's authentication (see the module docstring). ``caller`` is the connection's
    caller before authentication (anonymous, with its host); :meth:`authenticate` returns the
    authenticated one for the listener to put in the connection's context."""

    authenticator: TokenAuthenticator
    max_reauth_ms: int = 0
    clock: Callable[[], float] = time.time
    state: State = State.HANDSHAKE
    principal: str | None = None  # set once authenticated; a re-authentication must keep it
    session_end: float | None = None  # wall-clock end of the session (None: unbounded)
    closing: str | None = None  # set: close the connection after the response, for this reason
    _refusal: str = ""

    def admits(self, api_key: int) -> str | None:
        """None when a request of ``api_key`` may be served now, else why the connection is closed."""
        if api_key in _SASL_KEYS:
            return None
        if self.state is not State.AUTHENTICATED:
            if self.principal is not None:
                return "a request during re-authentication"
            return f"a request before SASL authentication ({self.state.value})"
        if self.session_end is not None and self.clock() >= self.session_end:
            return "the SASL session expired without re-authentication (its token's lifetime)"
        return None

    def handshake(self, mechanism: str) -> Message:
        if self.state not in (State.HANDSHAKE, State.AUTHENTICATED):
            self.closing = f"SaslHandshake while {self.state.value}"
            return SaslHandshakeResponse(ILLEGAL_SASL_STATE, [oauthbearer.MECHANISM])
        if mechanism != oauthbearer.MECHANISM:
            self.closing = f"unsupported SASL mechanism {mechanism!r} (OAUTHBEARER only)"
            return SaslHandshakeResponse(UNSUPPORTED_SASL_MECHANISM, [oauthbearer.MECHANISM])
        self.state = State.CLIENT_FIRST
        return SaslHandshakeResponse(0, [oauthbearer.MECHANISM])

    async def authenticate(self, auth_bytes: bytes, host: str) -> tuple[Message, Caller | None]:
        """The SaslAuthenticate response, and the connection's new caller when it authenticated."""
        if self.state is State.ACKNOWLEDGE:
            # whatever the client sent (it should be a lone kvsep), the exchange fails now
            return self._failed(f"Authentication failed: {self._refusal}"), None
        if self.state is not State.CLIENT_FIRST:
            self.closing = f"SaslAuthenticate while {self.state.value}"
            return SaslAuthenticateResponse(ILLEGAL_SASL_STATE, f"SaslAuthenticate while {self.state.value}"), None
        try:
            message = oauthbearer.parse_client_first(auth_bytes)
        except oauthbearer.MalformedMessage as exc:
            return self._failed(f"Invalid OAUTHBEARER client first message: {exc}"), None
        try:
            principal = await self.authenticator.authenticate(message.token)
            if message.authzid and message.authzid not in (principal, _username(principal)):
                raise TokenRefused("the authorization id is not the token's principal")
            if self.principal is not None and principal != self.principal:
                raise TokenRefused(f"re-authentication may not change the principal (was {self.principal})")
        except TokenRefused as exc:
            log.info("kafka listener: a SASL OAUTHBEARER token from %s was refused: %s", host, exc)
            self._refusal = str(exc)
            self.state = State.ACKNOWLEDGE
            return SaslAuthenticateResponse(0, None, oauthbearer.INVALID_TOKEN_CHALLENGE), None
        except ReviewUnavailable as exc:
            raise ReviewFailed(str(exc)) from None
        lifetime_ms = self._lifetime_ms(message.token)
        self.principal, self.state = principal, State.AUTHENTICATED
        self.session_end = None if lifetime_ms is None else self.clock() + lifetime_ms / 1000
        return SaslAuthenticateResponse(0, None, b"", lifetime_ms or 0), Caller.of_token(principal, host)

    def _failed(self, message: str) -> Message:
        self.closing = message
        return SaslAuthenticateResponse(SASL_AUTHENTICATION_FAILED, message)

    def _lifetime_ms(self, token: str) -> int | None:
        bounds = []
        expiry = token_expiry(token)
        if expiry is not None:
            bounds.append(max(1, int((expiry - self.clock()) * 1000)))
        if self.max_reauth_ms > 0:
            bounds.append(self.max_reauth_ms)
        return min(bounds) if bounds else None


def _username(principal: str) -> str:
    """``ServiceAccount:ns:name`` -> ``system:serviceaccount:ns:name`` (an authzid may name either)."""
    return SERVICE_ACCOUNT_USER + principal.partition(":")[2]
