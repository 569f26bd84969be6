"""Optional OpenTelemetry spans around the broker's Produce, Fetch and EndTxn (issue 14, item 5).

Off unless configured (``sluice broker --tracing EXPORTER``), and then free when off: the spans
are added by wrapping the three handlers once, when the service is registered
(:func:`wrap`, called by ``servicers.registration.service``); without tracing the handlers are
registered unwrapped, so the request path runs no tracing code at all, not even a check.
OpenTelemetry itself is an optional dependency (the ``otel`` extra of ``sluice-broker``):
imported only when tracing is configured, with a clear error when it is missing.

Spans follow OpenTelemetry's messaging semantic conventions for Kafka, from the broker's side
(kind SERVER: the broker serves the producer's send and the consumer's receive):

* ``send {topic}`` for a Produce (``messaging.operation.type`` ``send``),
* ``receive {topic}`` for a consumer Fetch (``receive``; followers' replica fetches are not
  traced: they are replication, not messaging),
* ``commit`` / ``abort`` for an EndTxn (``settle``): the transaction's end as its coordinator
  runs it (PrepareCommit logged, markers written, CompleteCommit).

with ``messaging.system`` = ``kafka``, ``messaging.operation.name`` (the RPC),
``messaging.destination.name`` and ``messaging.destination.partition.id`` when the request is for
one topic (and one partition), ``messaging.batch.message_count`` of a Produce, and
what the conventions define nothing for under ``sluice.*`` (the transactional id, the broker
id). A request for several topics is named by its
operation alone (``send``), as the conventions say for several destinations. An RPC that fails
sets the span's status to ERROR with the exception.

Exporters: ``otlp`` (OTLP over HTTP, configured by the standard ``OTEL_EXPORTER_OTLP_*``
variables; needs ``opentelemetry-exporter-otlp-proto-http``), ``console`` (JSON on stderr) and
``file:PATH`` (JSON, one span after the other, appended to PATH: what the tests read).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

from sluice.broker.config import ConfigError

TRACED = {"Produce", "Fetch", "EndTxn"}
INSTRUMENTATION = "sluice.broker"

Handler = Callable[[Any, Any], Awaitable[Any]]

_tracer: Any = None  # an opentelemetry Tracer once configured
_broker_id: int = -1
_provider: Any = None
_out: TextIO | None = None


def enabled() -> bool:
    return _tracer is not None


def configure(exporter: str, broker_id: int, service_name: str = "sluice-broker") -> None:
    """Set up an SDK TracerProvider with ``exporter`` (``otlp``, ``console`` or ``file:PATH``).

    Raises ConfigError for an unknown exporter or a missing OpenTelemetry package."""
    global _tracer, _broker_id, _provider, _out
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
    except ImportError as exc:
        raise ConfigError(
            "--tracing needs OpenTelemetry: pip install opentelemetry-api opentelemetry-sdk"
            f" (the otel extra of sluice-broker) ({exc})"
        ) from None
    span_exporter: SpanExporter
    if exporter == "console":
        span_exporter = ConsoleSpanExporter()
    elif exporter.startswith("file:") and len(exporter) > len("file:"):
        _out = open(exporter[len("file:") :], "a", encoding="utf-8")  # noqa: SIM115 (closed by shutdown())
        span_exporter = ConsoleSpanExporter(out=_out)
    elif exporter == "otlp":
        try:  # by name: the OTLP exporter is not a dependency of ours (see the module docstring)
            otlp = importlib.import_module("opentelemetry.exporter.otlp.proto.http.trace_exporter")
        except ImportError as exc:
            raise ConfigError(
                f"--tracing otlp needs opentelemetry-exporter-otlp-proto-http: pip install it ({exc})"
            ) from None
        span_exporter = otlp.OTLPSpanExporter()
    else:
        raise ConfigError(f"--tracing must be otlp, console or file:PATH, not {exporter!r}")
    resource = Resource.create({"service.name": service_name, "service.instance.id": str(broker_id)})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(span_exporter))
    configure_provider(provider, broker_id)


def configure_provider(provider: Any, broker_id: int) -> None:
    """Trace with an existing TracerProvider (the SDK's; a test's with an in-memory exporter)."""
    global _tracer, _broker_id, _provider
    _provider = provider
    _tracer = provider.get_tracer(INSTRUMENTATION)
    _broker_id = broker_id


def shutdown() -> None:
    """Flush and stop (at broker shutdown); tracing is off afterwards."""
    global _tracer, _provider, _out
    if _provider is not None and hasattr(_provider, "shutdown"):
        _provider.shutdown()
    if _out is not None:
        _out.close()
    _tracer = _provider = _out = None


def wrap(name: str, handler: Handler) -> Handler:
    """``handler`` with a span per call when tracing is on and ``name`` is traced; else ``handler`` itself."""
    if _tracer is None or name not in TRACED:
        return handler
    tracer = _tracer

    @functools.wraps(handler)
    async def traced(request: Any, context: Any) -> Any:
        from opentelemetry.trace import SpanKind, Status, StatusCode

        span_name, attributes = describe(name, request)
        if span_name is None:  # a follower's replica fetch: replication, not messaging
            return await handler(request, context)
        with tracer.start_as_current_span(
            span_name, kind=SpanKind.SERVER, attributes=attributes, record_exception=True, set_status_on_exception=True
        ) as span:
            response = await handler(request, context)
            code = getattr(response, "error_code", None)
            if name == "EndTxn" and code:
                span.set_status(Status(StatusCode.ERROR, str(getattr(response, "error_message", ""))))
            return response

    return traced


def describe(name: str, request: Any) -> tuple[str | None, dict[str, str | int | bool]]:
    """The span name and attributes of one request (None: not traced)."""
    attributes: dict[str, str | int | bool] = {
        "messaging.system": "kafka",
        "messaging.operation.name": name,
        "sluice.broker.id": _broker_id,
    }
    if name == "EndTxn":
        attributes["messaging.operation.type"] = "settle"
        attributes["sluice.transactional_id"] = request.transactional_id
        attributes["sluice.transaction.committed"] = bool(request.committed)
        return ("commit" if request.committed else "abort"), attributes
    if name == "Fetch" and request.replica_id >= 0:
        return None, attributes
    operation = "send" if name == "Produce" else "receive"
    attributes["messaging.operation.type"] = operation
    topics = [t.name for t in request.topics]
    partitions = [p.partition for t in request.topics for p in t.partitions]
    if name == "Produce":
        attributes["messaging.batch.message_count"] = sum(
            p.batch.record_count for t in request.topics for p in t.partitions
        )
        if request.transactional_id:
            attributes["sluice.transactional_id"] = request.transactional_id
    if len(set(topics)) == 1:
        attributes["messaging.destination.name"] = topics[0]
        if len(partitions) == 1:
            attributes["messaging.destination.partition.id"] = str(partitions[0])
        return f"{operation} {topics[0]}", attributes
    return operation, attributes
