"""Optional OpenTelemetry spans in the client: records sent, polls, transactions ended.

Off unless the application turns it on, and free when off::

    from sluice.client import tracing
    tracing.enable(tracer_provider)   # an opentelemetry.sdk.trace.TracerProvider (or any API one)

Until then :data:`tracer` is None and each hook in the producer and the consumer is one
attribute test. OpenTelemetry is an optional dependency (the ``otel`` extra of ``sluice-broker``),
imported only by :func:`enable`.

Spans follow OpenTelemetry's messaging semantic conventions for Kafka (``messaging.system`` =
``kafka``):

* ``send {topic}`` (kind PRODUCER, ``messaging.operation.type`` ``send``): one per record, from
  ``Producer.send()`` to its acknowledgement, with ``messaging.destination.name``,
  ``messaging.destination.partition.id`` and, once stored, ``messaging.kafka.offset``; a record
  that fails ends its span with status ERROR.
* ``poll {topic}`` (kind CLIENT, ``receive``): one per ``Consumer.poll()`` that returned records,
  with ``messaging.batch.message_count`` (the topic only when all records share it, else
  ``poll``). A poll that returned nothing records no span: an idle consumer would otherwise fill
  the trace with empty polls.
* ``commit`` / ``abort`` (kind CLIENT, ``settle``): a transaction's end to end, from
  ``commit_transaction()`` (flush of its records included) to the coordinator's answer, with
  ``sluice.transactional_id``.

Context is not propagated into records' headers or to the broker yet: a broker's spans
(``sluice broker --tracing``) are separate traces.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

INSTRUMENTATION = "sluice.client"

tracer: Any = None  # an opentelemetry Tracer while tracing is on

_R = TypeVar("_R")


def enable(tracer_provider: Any = None) -> None:
    """Trace with ``tracer_provider`` (default: OpenTelemetry's global one)."""
    global tracer
    try:
        from opentelemetry import trace
    except ImportError as exc:
        raise ImportError(
            "tracing needs OpenTelemetry: pip install opentelemetry-api opentelemetry-sdk"
            f" (the otel extra of sluice-broker) ({exc})"
        ) from None
    provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
    tracer = provider.get_tracer(INSTRUMENTATION)


def disable() -> None:
    global tracer
    tracer = None


def _base(operation_type: str, operation_name: str) -> dict[str, Any]:
    return {
        "messaging.system": "kafka",
        "messaging.operation.type": operation_type,
        "messaging.operation.name": operation_name,
    }


def sent(topic: str, partition: int, future: Future[Any]) -> None:
    """A record queued by ``Producer.send()``: its span ends with the future."""
    t = tracer
    if t is None:
        return
    from opentelemetry.trace import SpanKind, Status, StatusCode

    attributes = _base("send", "send")
    attributes["messaging.destination.name"] = topic
    attributes["messaging.destination.partition.id"] = str(partition)
    span = t.start_span(f"send {topic}", kind=SpanKind.PRODUCER, attributes=attributes)

    def done(f: Future[Any]) -> None:
        exc = f.exception()
        if exc is not None:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, str(exc)))
        else:
            offset = getattr(f.result(), "offset", None)
            if offset is not None:
                span.set_attribute("messaging.kafka.offset", offset)
        span.end()

    future.add_done_callback(done)


@contextlib.contextmanager
def settle(operation: str, transactional_id: str) -> Iterator[None]:
    """A transaction's end (``commit`` or ``abort``) as one span; a no-op while tracing is off."""
    t = tracer
    if t is None:
        yield
        return
    from opentelemetry.trace import SpanKind

    attributes = _base("settle", f"{operation}_transaction")
    attributes["sluice.transactional_id"] = transactional_id
    with t.start_as_current_span(operation, kind=SpanKind.CLIENT, attributes=attributes):
        yield


def polled(poll: Callable[[float, int | None], Sequence[_R]], timeout: float, max_records: int | None) -> Sequence[_R]:
    """``poll(timeout, max_records)`` with a span when it returned records."""
    t = tracer
    if t is None:
        return poll(timeout, max_records)
    from opentelemetry.trace import SpanKind

    start = _now_ns()
    records = poll(timeout, max_records)
    if records:
        topics = {getattr(r, "topic", "") for r in records}
        attributes = _base("receive", "poll")
        attributes["messaging.batch.message_count"] = len(records)
        name = "poll"
        if len(topics) == 1:
            (topic,) = topics
            attributes["messaging.destination.name"] = topic
            name = f"poll {topic}"
        t.start_span(name, kind=SpanKind.CLIENT, attributes=attributes, start_time=start).end()
    return records


def _now_ns() -> int:
    import time

    return time.time_ns()
