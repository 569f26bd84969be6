"""SASL OAUTHBEARER's messages (RFC 7628, as Kafka uses it: KIP-255), parsed and built.

The client speaks first, in one message (RFC 7628 section 3.1)::

    gs2-header  kvsep  *(key "=" value kvsep)  kvsep        kvsep = %x01
    gs2-header = ("n" | "y") "," ["a=" authzid] ","

with the bearer token in the ``auth`` pair, ``auth=Bearer <token>``, and any other pairs SASL
extensions (KIP-342). librdkafka, kafka-python and the Java client all send
``n,,\\x01auth=Bearer <token>\\x01\\x01`` plus extensions. Channel binding (``p=``) is refused:
the token is the credential, and the TLS session underneath is not bound to it.

A token the server refuses is not refused at once: the server answers with an error challenge,
the JSON document ``{"status":"invalid_token"}`` (section 3.2.2), the client acknowledges it with
a lone kvsep, and only then does the server fail the exchange. Kafka's broker and clients follow
that dance, so this listener does too (:mod:`sluice.broker.kafka.authentication`). A message
that is not a client-first message at all fails at once, as in Kafka.

Nothing here logs or formats the token: errors name what is wrong with the message, never its
content.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

MECHANISM = "OAUTHBEARER"
KVSEP = b"\x01"
# RFC 7628 3.2.2's error challenge; a scope or an openid-configuration URL would be optional
INVALID_TOKEN_CHALLENGE = json.dumps({"status": "invalid_token"}, separators=(",", ":")).encode()

_KEY = re.compile(r"[A-Za-z]+")
# RFC 7628 3.1: value = *(VCHAR / SP / HTAB / CR / LF)
_VALUE = re.compile(r"[\x21-\x7e \t\r\n]*")
# RFC 6750 2.1's b64token; the scheme is case-insensitive (RFC 7235)
_BEARER = re.compile(r"[Bb][Ee][Aa][Rr][Ee][Rr] +([A-Za-z0-9\-._~+/]+=*)")


class MalformedMessage(ValueError):
    """The bytes are not an OAUTHBEARER client-first message (the reason names no token content)."""


@dataclass(frozen=True)
class ClientFirst:
    token: str
    authzid: str = ""  # the identity the client asks to act as ("" when it asks for none)
    extensions: dict[str, str] = field(default_factory=dict)


def _saslname(text: str) -> str:
    """RFC 5801's saslname: ``=2C`` is a comma and ``=3D`` an equals sign, and no other ``=``."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "=":
            escape = text[i : i + 3]
            if escape not in ("=2C", "=3D"):
                raise MalformedMessage("an authzid with a bad escape")
            out.append("," if escape == "=2C" else "=")
            i += 3
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _gs2_header(header: str) -> str:
    """The authzid of ``<flag>,[a=<authzid>],`` (the trailing comma already split off)."""
    flag, sep, authz = header.partition(",")
    if not sep or "," in authz:
        raise MalformedMessage("no GS2 header")
    if flag.startswith("p="):
        raise MalformedMessage("channel binding is not supported")
    if flag not in ("n", "y"):
        raise MalformedMessage("a bad GS2 channel-binding flag")
    if not authz:
        return ""
    if not authz.startswith("a=") or len(authz) == 2:
        raise MalformedMessage("a bad authzid in the GS2 header")
    return _saslname(authz[2:])


def parse_client_first(message: bytes) -> ClientFirst:
    """The token, authzid and extensions of a client-first message; MalformedMessage otherwise."""
    try:
        text = message.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedMessage("not UTF-8") from None
    header, sep, rest = text.partition("\x01")
    if not sep or not header.endswith(","):
        raise MalformedMessage("no GS2 header")
    authzid = _gs2_header(header[:-1])
    if not rest.endswith("\x01\x01") and rest != "\x01":
        raise MalformedMessage("not terminated by two kvsep bytes")
    pairs = rest[:-2].split("\x01") if rest != "\x01" else []
    token: str | None = None
    extensions: dict[str, str] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not _KEY.fullmatch(key) or not _VALUE.fullmatch(value):
            raise MalformedMessage("a malformed key=value pair")
        if key == "auth":
            if token is not None:
                raise MalformedMessage("more than one auth pair")
            bearer = _BEARER.fullmatch(value)
            if bearer is None:
                raise MalformedMessage("the auth pair is not 'Bearer <token>'")
            token = bearer.group(1)
        elif key in extensions:
            raise MalformedMessage(f"the extension {key!r} appears twice")
        else:
            extensions[key] = value
    if token is None:
        raise MalformedMessage("no auth pair (no bearer token)")
    return ClientFirst(token, authzid, extensions)


def client_first(token: str, authzid: str = "", extensions: dict[str, str] | None = None) -> bytes:
    """The client-first message a client sends (used by tests and tools speaking the protocol by hand)."""
    authz = "a=" + authzid.replace("=", "=3D").replace(",", "=2C") if authzid else ""
    pairs = "".join(f"{k}={v}\x01" for k, v in (extensions or {}).items())
    return f"n,{authz},\x01auth=Bearer {token}\x01{pairs}\x01".encode()
