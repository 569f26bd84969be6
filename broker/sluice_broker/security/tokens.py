"""ServiceAccount tokens on the client listener, checked with Kubernetes' TokenReview API.

``--client-listener token`` is TLS (the broker's certificate, as ``tls``) where every call
carries the caller's Kubernetes ServiceAccount token as gRPC metadata, ``authorization: Bearer
<token>``: a Spark job or an application pod authenticates with the projected token it already
has, and no client certificate has to be issued or copied. The broker does not verify the JWT
itself (it would need the cluster's signing keys and the ServiceAccount's current state): it
asks the API server with a TokenReview, which checks the signature, the expiry, that the
ServiceAccount (and the Pod or Secret the token is bound to) still exists, and that the token
was issued for this cluster's audience (``--token-audience``, default ``sluice``). A token meant
for the API server is therefore refused here, and a token meant for Sluice is useless against
the API server: a broker that receives tokens cannot replay them anywhere else.

The principal is ``ServiceAccount:<namespace>:<name>`` (from the review's
``system:serviceaccount:<namespace>:<name>``); the authorizer then applies ACLs to it as to any
principal. Only ServiceAccount tokens are accepted; a review that authenticates another kind of
user (an OIDC user, say) is refused, since Sluice has no principal type for it.

Cost and safety: one review per distinct token, not per call. A successful review is cached
(keyed by the token's SHA-256, never the token) for at most :data:`REVIEW_TTL_S` and never past
the token's own ``exp`` claim, so an expired token is refused even while cached; a refusal is
cached for :data:`REFUSAL_TTL_S`, so a client repeating a bad token does not turn every call into
an API request. Concurrent calls with one new token share a single review. The cache is bounded
(:data:`MAX_CACHED`, oldest dropped first). When the API server cannot answer, the call fails
UNAVAILABLE (retriable: clients try again), not UNAUTHENTICATED (which is final).

The check is a gRPC server interceptor (:class:`TokenInterceptor`) on the client listener; it
runs before the request is decoded. The health service is exempt: probes carry no token, and
health says nothing about the data. The principal reaches the servicers through a context
variable that :func:`sluice.broker.security.peers.principal` reads.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import inspect
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias, cast

import grpc

log = logging.getLogger(__name__)

DEFAULT_AUDIENCE = "sluice"
REVIEW_TTL_S = 60.0
REFUSAL_TTL_S = 5.0
MAX_CACHED = 10_000
SERVICE_ACCOUNT_USER = "system:serviceaccount:"
EXEMPT_PREFIXES = ("/grpc.health.v1.Health/",)

# The principal a token authenticated for the call being served (None: no token listener).
TOKEN_PRINCIPAL: ContextVar[str | None] = ContextVar("sluice_token_principal", default=None)


class TokenRefused(Exception):
    """The token does not authenticate anyone here (final: UNAUTHENTICATED)."""


class ReviewUnavailable(Exception):
    """The API server did not answer the review (retriable: UNAVAILABLE)."""


@dataclass(frozen=True)
class Review:
    """What the API server said about a token."""

    authenticated: bool
    username: str = ""
    audiences: tuple[str, ...] = ()
    error: str = ""


class Reviewer(Protocol):
    def __call__(self, token: str, audience: str) -> Review: ...


def kubernetes_reviewer(api_client: Any) -> Reviewer:
    """A :class:`Reviewer` that creates TokenReviews through ``api_client`` (blocking: run it in a thread)."""
    from kubernetes import client

    api: Any = client.AuthenticationV1Api(api_client)

    def review(token: str, audience: str) -> Review:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": [audience]},
        }
        try:
            status = api.create_token_review(body).status
        except Exception as exc:  # ApiException, connection errors: the API server did not answer
            raise ReviewUnavailable(f"the TokenReview could not be made: {_short(exc)}") from None
        user = status.user
        return Review(
            bool(status.authenticated),
            str(getattr(user, "username", "") or ""),
            tuple(status.audiences or ()),
            str(status.error or ""),
        )

    return review


def _short(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    status = getattr(exc, "status", None)
    return f"{status} {reason}" if status else str(exc).splitlines()[0][:200]


def principal_of_username(username: str) -> str:
    """``system:serviceaccount:ns:name`` -> ``ServiceAccount:ns:name``; TokenRefused for other users."""
    if not username.startswith(SERVICE_ACCOUNT_USER):
        raise TokenRefused(f"only ServiceAccount tokens are accepted, not a token of user {username!r}")
    namespace, sep, name = username[len(SERVICE_ACCOUNT_USER) :].partition(":")
    if not sep or not namespace or not name:
        raise TokenRefused(f"malformed ServiceAccount user name {username!r}")
    return f"ServiceAccount:{namespace}:{name}"


def token_expiry(token: str) -> float | None:
    """The ``exp`` claim of a JWT, read without verifying it (only ever used to cache for less time)."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
        exp = payload.get("exp") if isinstance(payload, dict) else None
        return float(exp) if isinstance(exp, int | float) else None
    except (ValueError, UnicodeDecodeError):
        return None


class TokenAuthenticator:
    """Token -> principal, through TokenReviews, with the bounded cache the module docstring describes."""

    def __init__(
        self,
        reviewer: Reviewer,
        audience: str = DEFAULT_AUDIENCE,
        *,
        clock: Callable[[], float] = time.time,
        ttl_s: float = REVIEW_TTL_S,
        refusal_ttl_s: float = REFUSAL_TTL_S,
        max_cached: int = MAX_CACHED,
    ) -> None:
        if not audience:
            raise ValueError("the token audience must not be empty")
        self.reviewer = reviewer
        self.audience = audience
        self.clock = clock
        self.ttl_s = ttl_s
        self.refusal_ttl_s = refusal_ttl_s
        self.max_cached = max_cached
        # digest -> (until, principal or None, refusal message)
        self._cache: OrderedDict[str, tuple[float, str | None, str]] = OrderedDict()
        self._pending: dict[str, asyncio.Future[tuple[float, str | None, str]]] = {}
        self.reviews = 0  # reviews made (tests read it: the cache works)

    async def authenticate(self, token: str) -> str:
        """The principal of ``token``; TokenRefused or ReviewUnavailable."""
        if not token:
            raise TokenRefused("no token")
        now = self.clock()
        expiry = token_expiry(token)
        if expiry is not None and expiry <= now:  # refusing needs no review (a claim can only shorten trust)
            raise TokenRefused("the token has expired")
        digest = hashlib.sha256(token.encode()).hexdigest()
        cached = self._cache.get(digest)
        if cached is None or cached[0] <= now:
            cached = await self._review_once(digest, token)
        until, principal, refusal = cached
        if principal is None:
            raise TokenRefused(refusal)
        if until <= self.clock():
            raise TokenRefused("the token has expired")
        return principal

    async def _review_once(self, digest: str, token: str) -> tuple[float, str | None, str]:
        pending = self._pending.get(digest)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[tuple[float, str | None, str]] = asyncio.get_running_loop().create_future()
        self._pending[digest] = future
        try:
            verdict = await self._review(token)
            self._remember(digest, verdict)
            future.set_result(verdict)
            return verdict
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning when nobody else waited
            raise
        finally:
            del self._pending[digest]

    async def _review(self, token: str) -> tuple[float, str | None, str]:
        self.reviews += 1
        review = await asyncio.to_thread(self.reviewer, token, self.audience)
        now = self.clock()
        if not review.authenticated:
            reason = review.error or "not authenticated"
            return now + self.refusal_ttl_s, None, f"the token was refused by the API server: {reason}"
        if self.audience not in review.audiences:
            # a reviewer that ignores audiences would accept any token of the cluster: never trust that
            return now + self.refusal_ttl_s, None, f"the token is not for audience {self.audience!r}"
        try:
            principal = principal_of_username(review.username)
        except TokenRefused as exc:
            return now + self.refusal_ttl_s, None, str(exc)
        until = now + self.ttl_s
        expiry = token_expiry(token)
        if expiry is not None:
            until = min(until, expiry)
        return until, principal, ""

    def _remember(self, digest: str, verdict: tuple[float, str | None, str]) -> None:
        self._cache[digest] = verdict
        self._cache.move_to_end(digest)
        while len(self._cache) > self.max_cached:
            self._cache.popitem(last=False)


def bearer_token(metadata: Any) -> str | None:
    """The token of an ``authorization: Bearer <token>`` metadata entry, None without one."""
    for key, value in metadata or ():
        if key.lower() == "authorization":
            text = value.decode() if isinstance(value, bytes) else str(value)
            scheme, _, token = text.strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            return ""
    return None


Behavior = Callable[..., Any]


def _bound(behavior: Behavior, principal: str) -> Behavior:
    """``behavior`` run with ``principal`` as the call's token principal (each call is its own task)."""
    if inspect.isasyncgenfunction(behavior):

        async def stream(request: Any, ctx: Any) -> Any:
            TOKEN_PRINCIPAL.set(principal)
            async for item in behavior(request, ctx):
                yield item

        return stream

    async def call(request: Any, ctx: Any) -> Any:
        TOKEN_PRINCIPAL.set(principal)
        result = behavior(request, ctx)
        return await result if inspect.isawaitable(result) else result

    return call


def _refusing(code: grpc.StatusCode, message: str) -> Behavior:
    async def refuse(request: Any, ctx: Any) -> Any:
        await ctx.abort(code, message)

    return refuse


_KINDS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")


Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"  # subscriptable in the stubs only


def _replace_behaviors(handler: Any, make: Callable[[Behavior], Behavior]) -> Handler:
    changes = {kind: make(getattr(handler, kind)) for kind in _KINDS if getattr(handler, kind) is not None}
    return cast(Handler, handler._replace(**changes))  # grpc's RpcMethodHandler is a namedtuple


class TokenInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Authenticates every call but the exempt ones by its bearer token (see the module docstring)."""

    def __init__(self, authenticator: TokenAuthenticator, exempt: tuple[str, ...] = EXEMPT_PREFIXES) -> None:
        self.authenticator = authenticator
        self.exempt = exempt

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        method = str(getattr(handler_call_details, "method", "") or "")
        if handler is None or method.startswith(self.exempt):
            return handler
        token = bearer_token(getattr(handler_call_details, "invocation_metadata", None))
        if token is None:
            refuse = _refusing(grpc.StatusCode.UNAUTHENTICATED, _NO_TOKEN)
            return _replace_behaviors(handler, lambda _: refuse)
        try:
            principal = await self.authenticator.authenticate(token)
        except TokenRefused as exc:
            log.info("%s refused: %s", method, exc)
            refuse = _refusing(grpc.StatusCode.UNAUTHENTICATED, f"authentication failed: {exc}")
            return _replace_behaviors(handler, lambda _: refuse)
        except ReviewUnavailable as exc:
            log.warning("%s: %s", method, exc)
            refuse = _refusing(grpc.StatusCode.UNAVAILABLE, f"the broker cannot check tokens right now: {exc}")
            return _replace_behaviors(handler, lambda _: refuse)
        return _replace_behaviors(handler, lambda b: _bound(b, principal))


_NO_TOKEN = (
    "this listener authenticates ServiceAccount tokens: send 'authorization: Bearer <token>' "
    "(the client's sasl_oauthbearer_token_file option, docs/security.md)"
)


def reviewer_for(metadata_url: str) -> Reviewer:
    """Reviews made with the credentials the broker already uses for the API server: those of its
    ``kubernetes://`` metadata store (the pod's ServiceAccount, or the URL's kubeconfig), else the
    pod's or ``$KUBECONFIG``'s. The broker's ServiceAccount needs ``create`` on ``tokenreviews``."""
    from sluice.metadata.kubernetes import api_client, parse_url

    kubeconfig = context = None
    if metadata_url.startswith("kubernetes:"):
        _, options = parse_url(metadata_url)
        kubeconfig, context = options.get("kubeconfig"), options.get("context")
    return kubernetes_reviewer(api_client(kubeconfig, context))
