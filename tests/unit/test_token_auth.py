"""ServiceAccount tokens: the broker's TokenReview cache and principal mapping, the client's token file.

The broker side is tested here against a reviewer function that answers as the API server's
TokenReview does (the real API server is in tests/k8s/test_tokenreview.py); what matters here is
what the authenticator does with the answers: principals, audiences, expiry, how often it asks.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
from pathlib import Path

import pytest

from sluice.broker.security.tokens import (
    Review,
    TokenAuthenticator,
    TokenRefused,
    bearer_token,
    principal_of_username,
    token_expiry,
)
from sluice.client._network.security import ClientSecurity
from sluice.client._network.token_credentials import TokenFile


def jwt(exp: float | None) -> str:
    def part(obj: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")

    claims: dict[str, object] = {"sub": "system:serviceaccount:apps:copier"}
    if exp is not None:
        claims["exp"] = int(exp)
    return f"{part({'alg': 'ES256'})}.{part(claims)}.c2ln"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_principals_are_service_accounts_only() -> None:
    assert principal_of_username("system:serviceaccount:apps:copier") == "ServiceAccount:apps:copier"
    with pytest.raises(TokenRefused, match="only ServiceAccount tokens"):
        principal_of_username("alice@example.com")
    with pytest.raises(TokenRefused, match="malformed"):
        principal_of_username("system:serviceaccount:apps")


def test_bearer_metadata_and_expiry_claims() -> None:
    assert bearer_token((("authorization", "Bearer abc"),)) == "abc"
    assert bearer_token((("Authorization", "bearer  abc "),)) == "abc"
    assert bearer_token((("authorization", "Basic abc"),)) == ""  # present but unusable: refused, not anonymous
    assert bearer_token((("x-other", "1"),)) is None
    assert token_expiry(jwt(1234)) == 1234.0
    assert token_expiry(jwt(None)) is None and token_expiry("not-a-jwt") is None


def test_reviews_are_cached_bounded_by_the_token_expiry_and_refusals_briefly() -> None:
    clock = Clock()
    calls: list[tuple[str, str]] = []

    def reviewer(token: str, audience: str) -> Review:
        calls.append((token, audience))
        if token.startswith("bad"):
            return Review(False, error="invalid bearer token")
        return Review(True, "system:serviceaccount:apps:copier", ("sluice",))

    auth = TokenAuthenticator(reviewer, "sluice", clock=clock, ttl_s=60, refusal_ttl_s=5)
    good = jwt(clock.now + 30)  # expires before the cache's own 60 s

    async def scenario() -> None:
        # concurrent calls with one new token share one review
        got = await asyncio.gather(*(auth.authenticate(good) for _ in range(5)))
        assert got == ["ServiceAccount:apps:copier"] * 5
        assert calls == [(good, "sluice")]
        clock.now += 29
        assert await auth.authenticate(good) == "ServiceAccount:apps:copier"
        assert len(calls) == 1
        clock.now += 2  # past its exp: refused, though the review is still cached
        with pytest.raises(TokenRefused, match="expired"):
            await auth.authenticate(good)
        assert len(calls) == 1
        for _ in range(3):
            with pytest.raises(TokenRefused, match="invalid bearer token"):
                await auth.authenticate("bad-token")
        assert len(calls) == 2  # one review for three attempts
        clock.now += 6
        with pytest.raises(TokenRefused):
            await auth.authenticate("bad-token")
        assert len(calls) == 3
        later = jwt(clock.now + 3600)  # cached for the authenticator's own 60 s, then reviewed again
        await auth.authenticate(later)
        clock.now += 61
        await auth.authenticate(later)
        assert len(calls) == 5
        with pytest.raises(TokenRefused, match="no token"):
            await auth.authenticate("")

    asyncio.run(scenario())


def test_a_review_without_our_audience_or_of_another_user_is_refused() -> None:
    answers = {
        "other-aud": Review(True, "system:serviceaccount:apps:copier", ("https://kubernetes.default.svc",)),
        "a-person": Review(True, "alice", ("sluice",)),
    }
    auth = TokenAuthenticator(lambda token, audience: answers[token], "sluice")

    async def scenario() -> None:
        with pytest.raises(TokenRefused, match="not for audience 'sluice'"):
            await auth.authenticate("other-aud")
        with pytest.raises(TokenRefused, match="only ServiceAccount tokens"):
            await auth.authenticate("a-person")

    asyncio.run(scenario())


def test_the_cache_is_bounded() -> None:
    auth = TokenAuthenticator(lambda t, a: Review(True, f"system:serviceaccount:ns:{t}", ("sluice",)), max_cached=3)

    async def scenario() -> None:
        for i in range(10):
            assert await auth.authenticate(f"t{i}") == f"ServiceAccount:ns:t{i}"

    asyncio.run(scenario())
    assert len(auth._cache) == 3 and auth.reviews == 10


def test_the_token_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first\n")
    source = TokenFile(str(path))
    assert source.token() == "first"
    # the kubelet's rotation: a new file swapped in by rename (a new inode)
    new = tmp_path / "token.new"
    new.write_text("second")
    os.replace(new, path)
    assert source.token() == "second"
    path.write_text("")
    with pytest.raises(ValueError, match="is empty"):
        source.token()
    with pytest.raises(ValueError, match=r"sasl_oauthbearer_token_file '/nonexistent/t' cannot be read"):
        TokenFile("/nonexistent/t")


def test_sasl_ssl_settings_are_checked_by_name(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("x")
    with pytest.raises(ValueError, match="needs sasl_oauthbearer_token_file"):
        ClientSecurity.build("SASL_SSL")
    with pytest.raises(ValueError, match="tokens go over TLS only"):
        ClientSecurity.build("SASL_PLAINTEXT", sasl_oauthbearer_token_file=str(token))
    with pytest.raises(ValueError, match="given with security_protocol='SSL': use 'SASL_SSL'"):
        ClientSecurity.build("SSL", sasl_oauthbearer_token_file=str(token))
    with pytest.raises(ValueError, match="must be OAUTHBEARER"):
        ClientSecurity.build("SASL_SSL", sasl_mechanism="PLAIN", sasl_oauthbearer_token_file=str(token))
    sec = ClientSecurity.build("sasl_ssl", sasl_mechanism="oauthbearer", sasl_oauthbearer_token_file=str(token))
    assert sec.protocol == "SASL_SSL" and sec.token is not None and sec.token.token() == "x"


def test_spark_options_take_the_token_file(tmp_path: Path) -> None:
    from sluice.spark.security import parse_security_options

    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text("x")
    ca.write_bytes(b"-----BEGIN CERTIFICATE-----\n")
    opts = {
        "kafka.security.protocol": "SASL_SSL",
        "ssl.ca.location": str(ca),
        "sasl.oauthbearer.token.file": str(token),
    }
    settings = parse_security_options(opts, ValueError)
    assert settings.client_kwargs()["sasl_oauthbearer_token_file"] == str(token)
    with pytest.raises(ValueError, match=r"need 'security\.protocol' SASL_SSL"):
        parse_security_options({"sasl.oauthbearer.token.file": str(token)}, ValueError)
    with pytest.raises(ValueError, match="needs sasl_oauthbearer_token_file"):
        parse_security_options({"security.protocol": "SASL_SSL", "ssl.ca.location": str(ca)}, ValueError)
