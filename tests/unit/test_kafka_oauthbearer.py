"""SASL OAUTHBEARER on the Kafka listener: the client-first message (RFC 7628) and a connection's session.

The session is driven here with a reviewer function answering as the API server's TokenReview
does (as tests/unit/test_token_auth.py does for the cache); the real API server, broker process
and Kafka clients are in tests/k8s/test_kafka_oauthbearer.py.
"""

from __future__ import annotations

import asyncio
import base64
import json

import pytest

from sluice.broker.kafka import oauthbearer
from sluice.broker.kafka.authentication import (
    ILLEGAL_SASL_STATE,
    SASL_AUTHENTICATION_FAILED,
    UNSUPPORTED_SASL_MECHANISM,
    ReviewFailed,
    SaslSession,
    State,
)
from sluice.broker.kafka.oauthbearer import MalformedMessage, client_first, parse_client_first
from sluice.broker.kafka_wire.messages.sasl_authenticate_response import SaslAuthenticateResponse
from sluice.broker.kafka_wire.messages.sasl_handshake_response import SaslHandshakeResponse
from sluice.broker.security.tokens import Review, ReviewUnavailable, TokenAuthenticator

METADATA, PRODUCE, API_VERSIONS = 3, 0, 18


def jwt(sub: str, exp: float) -> str:
    def part(obj: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")

    return f"{part({'alg': 'ES256'})}.{part({'sub': sub, 'exp': int(exp)})}.c2ln"


def test_the_client_first_messages_kafka_clients_send_are_parsed() -> None:
    # librdkafka, kafka-python and the Java client: no authzid, then extensions if any
    assert parse_client_first(b"n,,\x01auth=Bearer abc.def-_~+/==\x01\x01") == oauthbearer.ClientFirst("abc.def-_~+/==")
    parsed = parse_client_first(b"n,,\x01auth=Bearer t0k\x01traceId=1 2\x01logicalCluster=lc\x01\x01")
    assert parsed.token == "t0k" and parsed.extensions == {"traceId": "1 2", "logicalCluster": "lc"}
    assert (
        parse_client_first(b"y,a=ServiceAccount:ns:app,\x01auth=bearer   x\x01\x01").authzid == "ServiceAccount:ns:app"
    )
    assert parse_client_first(b"n,a=a=2Cb=3Dc,\x01auth=Bearer x\x01\x01").authzid == "a,b=c"
    assert parse_client_first(client_first("x", "a,b=c", {"k": "v"})) == oauthbearer.ClientFirst(
        "x", "a,b=c", {"k": "v"}
    )


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (b"", "no GS2 header"),
        (b"\x01\x01", "no GS2 header"),
        (b"n\x01auth=Bearer x\x01\x01", "no GS2 header"),
        (b"p=tls-unique,,\x01auth=Bearer x\x01\x01", "channel binding"),
        (b"q,,\x01auth=Bearer x\x01\x01", "channel-binding flag"),
        (b"n,b=x,\x01auth=Bearer x\x01\x01", "authzid"),
        (b"n,a=x=41,\x01auth=Bearer x\x01\x01", "escape"),
        (b"n,,\x01auth=Bearer x\x01", "two kvsep"),
        (b"n,,\x01auth=Bearer x", "two kvsep"),
        (b"n,,\x01\x01", "no auth pair"),
        (b"n,,\x01k=v\x01\x01", "no auth pair"),
        (b"n,,\x01auth=Basic dXNlcjpwdw==\x01\x01", "Bearer <token>"),
        (b"n,,\x01auth=Bearer \x01\x01", "Bearer <token>"),
        (b"n,,\x01auth=Bearer a b\x01\x01", "Bearer <token>"),
        (b"n,,\x01auth=Bearer a\x01auth=Bearer b\x01\x01", "more than one"),
        (b"n,,\x01auth=Bearer a\x01k=1\x01k=2\x01\x01", "twice"),
        (b"n,,\x01auth=Bearer a\x01\x01\x01", "key=value"),
        (b"n,,\x01auth=Bearer a\x01k1=v\x01\x01", "key=value"),
        (b"n,,\x01auth=Bearer a\x01k=\x00\x01\x01", "key=value"),
        (b"n,,\x01auth=Bearer \xff\x01\x01", "UTF-8"),
        (b'{"status":"invalid_token"}', "no GS2 header"),
    ],
)
def test_malformed_client_first_messages_are_refused_without_echoing_them(message: bytes, reason: str) -> None:
    with pytest.raises(MalformedMessage, match=reason) as caught:
        parse_client_first(message)
    assert "Basic" not in str(caught.value) and "dXNl" not in str(caught.value)


def test_the_error_challenge_is_rfc_7628s() -> None:
    assert json.loads(oauthbearer.INVALID_TOKEN_CHALLENGE) == {"status": "invalid_token"}


class Clock:
    now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def session(clock: Clock, max_reauth_ms: int = 0, *, unavailable: bool = False) -> SaslSession:
    def reviewer(token: str, audience: str) -> Review:
        if unavailable:
            raise ReviewUnavailable("connection refused")
        if token.startswith("bad"):
            return Review(False, error="invalid bearer token")
        sub = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))["sub"]
        return Review(True, sub, ("sluice",))

    return SaslSession(TokenAuthenticator(reviewer, "sluice", clock=clock), max_reauth_ms, clock)


def test_a_session_serves_nothing_before_authentication_and_ends_with_its_token() -> None:
    clock = Clock()
    s = session(clock)
    assert s.admits(API_VERSIONS) is None
    assert "before SASL authentication" in (s.admits(METADATA) or "")
    assert s.handshake("OAUTHBEARER") == SaslHandshakeResponse(0, ["OAUTHBEARER"])
    assert "before SASL authentication" in (s.admits(PRODUCE) or "")
    token = jwt("system:serviceaccount:apps:copier", clock.now + 600)
    response, caller = asyncio.run(s.authenticate(client_first(token), "10.0.0.7"))
    assert isinstance(response, SaslAuthenticateResponse)
    assert (response.error_code, response.auth_bytes, response.session_lifetime_ms) == (0, b"", 600_000)
    assert caller is not None and (caller.principal, caller.host, caller.is_broker) == (
        "ServiceAccount:apps:copier",
        "10.0.0.7",
        False,
    )
    assert s.admits(METADATA) is None and s.closing is None
    # re-authentication (KIP-368): the same principal, a new token and a new lifetime
    clock.now += 500
    s.handshake("OAUTHBEARER")
    assert "re-authentication" in (s.admits(METADATA) or "")
    later = jwt("system:serviceaccount:apps:copier", clock.now + 900)
    response, caller = asyncio.run(s.authenticate(client_first(later), "10.0.0.7"))
    assert isinstance(response, SaslAuthenticateResponse) and response.session_lifetime_ms == 900_000
    clock.now += 900
    assert "expired" in (s.admits(METADATA) or "")  # the connection is closed: no re-authentication in time


def test_reauthentication_cannot_change_the_principal_and_max_reauth_bounds_the_session() -> None:
    clock = Clock()
    s = session(clock, max_reauth_ms=60_000)
    s.handshake("OAUTHBEARER")
    response, _ = asyncio.run(s.authenticate(client_first(jwt("system:serviceaccount:a:x", clock.now + 600)), "h"))
    assert isinstance(response, SaslAuthenticateResponse) and response.session_lifetime_ms == 60_000
    s.handshake("OAUTHBEARER")
    response, caller = asyncio.run(s.authenticate(client_first(jwt("system:serviceaccount:a:y", clock.now + 600)), "h"))
    assert caller is None and response == SaslAuthenticateResponse(0, None, oauthbearer.INVALID_TOKEN_CHALLENGE)
    response, _ = asyncio.run(s.authenticate(b"\x01", "h"))
    assert isinstance(response, SaslAuthenticateResponse)
    assert response.error_code == SASL_AUTHENTICATION_FAILED and "may not change the principal" in str(s.closing)


def test_refusals_follow_kafkas_exchanges() -> None:
    clock = Clock()
    # a refused token: the error challenge, the client's kvsep, then SASL_AUTHENTICATION_FAILED
    s = session(clock)
    s.handshake("OAUTHBEARER")
    response, caller = asyncio.run(s.authenticate(client_first("bad-token"), "h"))
    assert caller is None and s.closing is None and s.state is State.ACKNOWLEDGE
    assert response == SaslAuthenticateResponse(0, None, b'{"status":"invalid_token"}')
    response, caller = asyncio.run(s.authenticate(oauthbearer.KVSEP, "h"))
    assert caller is None and isinstance(response, SaslAuthenticateResponse)
    assert response.error_code == SASL_AUTHENTICATION_FAILED
    assert (
        response.error_message == "Authentication failed: the token was refused by the API server: invalid bearer token"
    )
    assert s.closing and s.admits(METADATA) is not None
    # an expired token needs no review
    s = session(clock)
    s.handshake("OAUTHBEARER")
    asyncio.run(s.authenticate(client_first(jwt("system:serviceaccount:a:x", clock.now - 1)), "h"))
    assert s.state is State.ACKNOWLEDGE
    # an authzid other than the token's principal
    s = session(clock)
    s.handshake("OAUTHBEARER")
    asyncio.run(s.authenticate(client_first(jwt("system:serviceaccount:a:x", clock.now + 60), "User:admin"), "h"))
    assert s.state is State.ACKNOWLEDGE
    # a malformed message fails at once
    s = session(clock)
    s.handshake("OAUTHBEARER")
    response, _ = asyncio.run(s.authenticate(b"n,,\x01auth=Basic x\x01\x01", "h"))
    assert isinstance(response, SaslAuthenticateResponse) and response.error_code == SASL_AUTHENTICATION_FAILED
    assert str(response.error_message).startswith("Invalid OAUTHBEARER client first message") and s.closing
    # another mechanism; SaslAuthenticate before a handshake
    s = session(clock)
    assert s.handshake("PLAIN") == SaslHandshakeResponse(UNSUPPORTED_SASL_MECHANISM, ["OAUTHBEARER"]) and s.closing
    s = session(clock)
    response, _ = asyncio.run(s.authenticate(client_first("x"), "h"))
    assert isinstance(response, SaslAuthenticateResponse) and response.error_code == ILLEGAL_SASL_STATE and s.closing
    # the API server not answering: no answer at all (the listener closes; the client retries)
    s = session(clock, unavailable=True)
    s.handshake("OAUTHBEARER")
    with pytest.raises(ReviewFailed):
        asyncio.run(s.authenticate(client_first(jwt("system:serviceaccount:a:x", clock.now + 60)), "h"))


def test_only_a_sasl_listener_serves_and_advertises_the_sasl_apis() -> None:
    from sluice.broker.kafka.handlers import build_handlers

    assert not {17, 36} & set(build_handlers())
    handlers = build_handlers(sasl=True)
    assert (handlers[17].versions.lo, handlers[17].versions.hi) == (1, 1)  # no unframed v0 exchange
    assert (handlers[36].versions.lo, handlers[36].versions.hi) == (0, 2)
    advertised = {a.api_key for a in handlers[18].advertised()}  # type: ignore[attr-defined]
    assert {17, 36} <= advertised
