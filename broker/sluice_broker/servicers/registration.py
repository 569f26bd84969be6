"""Registering a service's handlers: decoding, guarding, serializing, shared by every service.

Handlers are registered by hand (not with the generated ``add_*_to_server``)
so that a request that is not a valid protobuf at all reaches us as bytes and
is answered with INVALID_ARGUMENT and a message, instead of a generic INTERNAL
from the gRPC runtime. A handler that raises
:class:`~sluice.errors.InvalidArgumentError` (a request that decodes but makes
no sense, such as a negative size) answers INVALID_ARGUMENT too. A handler that
fails unexpectedly answers INTERNAL with the error text and is logged; the
broker keeps serving either way. Handlers are shielded from the cancellation of
their call: a request is finished even when its client went away. Every call is
timed here, once for all services, into the broker's :class:`BrokerEvents`
(request count, latency and gRPC-level failures by method name: the request
metrics of the metrics endpoint).

A bidirectional stream that answers each request with one response (the
follower's ReplicaFetchStream) is registered with :func:`service`'s ``streams``:
its check runs once when the stream opens, then each request goes through the
same decoding, error mapping and timing as a unary call, counted under the
name of the unary method it stands for, so the request metrics stay
comparable. A request that fails ends the stream with its status; a stopping
server ends its streams (``Stream.ending``) before their next request. Stream
requests are not shielded from cancellation: a stream ends when its peer goes,
and its handler must leave nothing half-done when cancelled (ReplicaFetch's
bookkeeping is synchronous; only its long poll awaits).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn

import grpc
from google.protobuf.message import DecodeError, Message

from sluice.broker import tracing
from sluice.broker.errors import InvalidArgumentError
from sluice.broker.events import BrokerEvents

log = logging.getLogger(__name__)

Ctx = grpc.aio.ServicerContext[Any, Any]
Handler = Callable[[Any, Ctx], Awaitable[Message | bytes]]
Methods = dict[str, tuple[Handler, type[Message]]]  # method name -> (handler, request class)
StreamOpen = Callable[[Ctx], Awaitable[object]]  # checks the caller once, when a stream opens (aborts to refuse)


class Stream:
    """A bidirectional stream answering each request with one response, as unary method ``counted_as`` would."""

    def __init__(
        self,
        opened: StreamOpen,
        handler: Handler,
        request: type[Message],
        counted_as: str,
        ending: Callable[[], bool] = lambda: False,
    ) -> None:
        self.opened = opened
        self.handler = handler
        self.request = request
        self.counted_as = counted_as
        # True once the server is stopping: the stream ends (OK) before its next request instead of
        # holding the server's graceful stop for its whole grace period.
        self.ending = ending


class _Malformed:
    def __init__(self, error: str) -> None:
        self.error = error


def _parser(cls: type[Message]) -> Callable[[bytes], Message | _Malformed]:
    def parse(data: bytes) -> Message | _Malformed:
        try:
            return cls.FromString(data)
        except (DecodeError, RuntimeError, ValueError) as exc:
            return _Malformed(f"cannot decode {cls.DESCRIPTOR.name}: {exc}")

    return parse


def _guard(name: str, handler: Handler, events: BrokerEvents | None) -> Handler:
    # One coroutine per call, timing included: a separate timing wrapper around the guard cost a
    # second coroutine frame on every request, the produce path's included.
    async def run(request: Any, context: Ctx) -> Message | bytes:
        started = time.perf_counter()
        failed = True
        try:
            if isinstance(request, _Malformed):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.error)
            try:
                # Shielded: a client that disconnects (or is killed) cancels its call, but what the
                # broker started (a state write waiting for replication, markers) must run to its end,
                # or in-memory state is left half-changed.
                response = await asyncio.shield(handler(request, context))
            except grpc.aio.AbortError:
                raise
            except Exception as exc:
                await _abort_for(name, exc, context)
            failed = False
            return response
        finally:
            if events is not None:
                events.request(name, (time.perf_counter() - started) * 1000, failed)

    return run


async def _abort_for(name: str, exc: Exception, context: Ctx) -> NoReturn:
    """Answer a handler's failure, for calls and stream requests alike (called from its ``except``):
    INVALID_ARGUMENT for a request that makes no sense, else INTERNAL with the error, logged."""
    if isinstance(exc, InvalidArgumentError):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: {exc}")
    else:
        log.exception("%s failed", name)
        await context.abort(grpc.StatusCode.INTERNAL, f"{name}: {type(exc).__name__}: {exc}")
    raise AssertionError("unreachable") from None


async def _answer(name: str, handler: Handler, request: Any, context: Ctx) -> Message | bytes:
    """``handler``'s response to one stream request; a malformed or refused one aborts the stream."""
    if isinstance(request, _Malformed):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.error)
    try:
        return await handler(request, context)
    except grpc.aio.AbortError:
        raise
    except Exception as exc:
        await _abort_for(name, exc, context)


def _stream(
    method: str, stream: Stream, events: BrokerEvents | None
) -> Callable[[Any, Ctx], AsyncIterator[Message | bytes]]:
    name = stream.counted_as
    handler = tracing.wrap(name, stream.handler)

    async def run(requests: AsyncIterator[Any], context: Ctx) -> AsyncIterator[Message | bytes]:
        started = time.perf_counter()
        try:
            await stream.opened(context)
        except grpc.aio.AbortError:
            # a refused stream counts as one failed request, as the unary call would
            if events is not None:
                events.request(name, (time.perf_counter() - started) * 1000, True)
            raise
        if events is not None:
            events.stream_opened(method)
        try:
            async for request in requests:
                if stream.ending():
                    return
                started = time.perf_counter()
                failed = True
                try:
                    response = await _answer(name, handler, request, context)
                    failed = False
                finally:
                    if events is not None:
                        events.request(name, (time.perf_counter() - started) * 1000, failed)
                yield response
        finally:
            if events is not None:
                events.stream_closed(method)

    return run


def _serialize(message: Message | bytes) -> bytes:
    # Fetch answers with the response already serialized (see ReplicaManager._fetch_once)
    return message if isinstance(message, bytes) else message.SerializeToString()


def service(
    full_name: str, methods: Methods, events: BrokerEvents | None = None, streams: dict[str, Stream] | None = None
) -> grpc.GenericRpcHandler[Any, Any]:
    """The generic handler of service ``full_name`` (e.g. "sluice.v1.Broker") for ``methods`` and ``streams``.

    Every call (every request of a stream) is counted and timed into ``events`` (when given).
    """
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        name: grpc.unary_unary_rpc_method_handler(
            _guard(name, tracing.wrap(name, fn), events),  # spans only when tracing is configured
            request_deserializer=_parser(req_cls),
            response_serializer=_serialize,
        )
        for name, (fn, req_cls) in methods.items()
    }
    for name, stream in (streams or {}).items():
        handlers[name] = grpc.stream_stream_rpc_method_handler(
            _stream(name, stream, events), request_deserializer=_parser(stream.request), response_serializer=_serialize
        )
    return grpc.method_handlers_generic_handler(full_name, handlers)


def nonneg(value: int, what: str) -> None:
    """Refuse a negative size or timeout as malformed (INVALID_ARGUMENT)."""
    if value < 0:
        raise InvalidArgumentError(f"{what} must be >= 0, not {value}")
