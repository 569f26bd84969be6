"""The read options of the "sluice" data source, parsed and checked once, on the driver.

The names, defaults and meanings are those of Spark's Kafka source, so a job
moves between the two by changing the format name (plus Sluice's
``isolationLevel``, read_committed by default). Kafka's spellings with the
``kafka.`` prefix are accepted too (``kafka.bootstrap.servers``,
``kafka.isolation.level``). TLS: ``security.protocol`` and the PEM locations
(:mod:`sluice.spark.security`, shared with the sink).

Every mistake is reported before any data is read, as a :class:`SluiceOptionError`
(a ``ValueError``) that names the option, what was given and what is
accepted; an unknown option is an error too (a misspelt ``startingOffset``
would otherwise silently read from the default place).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from sluice.spark.security import (
    PLAINTEXT,
    SECURITY_OPTIONS,
    SecurityOptions,
    is_security_option,
    parse_security_options,
)

__all__ = [
    "EARLIEST",
    "LATEST",
    "OffsetSpec",
    "ReadOptions",
    "SluiceOptionError",
    "parse_read_options",
]

EARLIEST = -2
LATEST = -1

# option (lower case) -> its documented spelling
_KNOWN = {
    name.lower(): name
    for name in (
        "bootstrap.servers",
        "kafka.bootstrap.servers",
        "subscribe",
        "subscribePattern",
        "assign",
        "startingOffsets",
        "endingOffsets",
        "failOnDataLoss",
        "includeHeaders",
        "isolationLevel",
        "kafka.isolation.level",
        "minPartitions",
        "maxRecordsPerPartition",
        "maxOffsetsPerTrigger",
        "pollTimeoutMs",
        "kafkaConsumer.pollTimeoutMs",
        "fetchMaxBytes",
        *SECURITY_OPTIONS,
    )
}
_STREAM_ONLY = {"maxoffsetspertrigger"}
_BATCH_ONLY = {"endingoffsets"}


class SluiceOptionError(ValueError):
    """An option of the "sluice" data source is missing, unknown or malformed."""


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """startingOffsets/endingOffsets: ``earliest``, ``latest`` or per-partition offsets (-2/-1 allowed)."""

    kind: str  # "earliest" | "latest" | "specific"
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)

    def for_partition(self, topic: str, partition: int) -> int:
        """The offset asked for one partition: -2 earliest, -1 latest or an offset."""
        if self.kind == "earliest":
            return EARLIEST
        if self.kind == "latest":
            return LATEST
        return self.offsets[(topic, partition)]


@dataclass(frozen=True, slots=True)
class ReadOptions:
    bootstrap_servers: str
    subscribe: tuple[str, ...] | None
    subscribe_pattern: str | None
    assign: dict[str, tuple[int, ...]] | None
    starting: OffsetSpec
    ending: OffsetSpec
    fail_on_data_loss: bool
    include_headers: bool
    isolation_level: str
    min_partitions: int | None
    max_records_per_partition: int | None
    max_offsets_per_trigger: int | None
    poll_timeout_ms: int
    fetch_max_bytes: int
    security: SecurityOptions = PLAINTEXT  # security.protocol, ssl.*.location (sluice.spark.security)

    @property
    def read_committed(self) -> bool:
        return self.isolation_level == "read_committed"

    def describe_subscription(self) -> str:
        if self.subscribe is not None:
            return f"subscribe={','.join(self.subscribe)}"
        if self.subscribe_pattern is not None:
            return f"subscribePattern={self.subscribe_pattern}"
        return f"assign={json.dumps({t: list(ps) for t, ps in (self.assign or {}).items()})}"


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name.lower())
    if raw is None:
        return default
    value = str(raw).strip().lower()
    if value not in ("true", "false"):
        raise SluiceOptionError(f"option {name!r} must be 'true' or 'false', not {raw!r}")
    return value == "true"


def _positive_int(options: Mapping[str, str], name: str) -> int | None:
    raw = options.get(name.lower())
    if raw is None:
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise SluiceOptionError(f"option {name!r} must be a positive integer, not {raw!r}") from None
    if value <= 0:
        raise SluiceOptionError(f"option {name!r} must be a positive integer, not {raw!r}")
    return value


def _json_object(name: str, raw: str) -> dict[str, object]:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise SluiceOptionError(
            f"option {name!r} is not valid JSON ({exc.msg} at character {exc.pos}): {raw!r}"
        ) from None
    if not isinstance(value, dict):
        raise SluiceOptionError(f"option {name!r} must be a JSON object, not {raw!r}")
    return value


def _partition_number(name: str, topic: str, key: object) -> int:
    try:
        p = int(str(key))
    except ValueError:
        p = -1
    if p < 0 or str(key).strip() != str(p):
        raise SluiceOptionError(f"option {name!r}: partition {key!r} of topic {topic!r} is not a partition number")
    return p


def _offset_spec(
    name: str, raw: str | None, default: str, *, allow: tuple[str, ...], allow_specific: set[int]
) -> OffsetSpec:
    text = (raw if raw is not None else default).strip()
    if text.lower() in ("earliest", "latest"):
        kind = text.lower()
        if kind not in allow:
            raise SluiceOptionError(f"option {name!r} cannot be {kind!r} here (allowed: {', '.join(allow)} or JSON)")
        return OffsetSpec(kind)
    if not text.startswith("{"):
        raise SluiceOptionError(
            f"option {name!r} must be 'earliest', 'latest' or JSON such as "
            f'{{"orders":{{"0":23,"1":-2}}}}, not {text!r}'
        )
    offsets: dict[tuple[str, int], int] = {}
    for topic, parts in _json_object(name, text).items():
        if not isinstance(parts, dict):
            raise SluiceOptionError(
                f"option {name!r}: the value for topic {topic!r} must be an object of partition -> offset"
            )
        for key, off in parts.items():
            p = _partition_number(name, topic, key)
            if isinstance(off, bool) or not isinstance(off, int):
                raise SluiceOptionError(f"option {name!r}: offset of {topic}-{p} must be an integer, not {off!r}")
            if off < 0 and off not in allow_specific:
                allowed = " or ".join(str(x) for x in sorted(allow_specific, reverse=True))
                raise SluiceOptionError(
                    f"option {name!r}: offset {off} of {topic}-{p} is not allowed "
                    f"(>= 0{', ' + allowed if allowed else ''})"
                )
            offsets[(topic, p)] = off
    if not offsets:
        raise SluiceOptionError(f"option {name!r} names no partition: {text!r}")
    return OffsetSpec("specific", offsets)


def parse_read_options(raw_options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    """Check the options of a batch (``streaming=False``) or streaming read; raise SluiceOptionError."""
    options = {str(k).lower(): str(v) for k, v in raw_options.items()}
    unknown = sorted(k for k in options if k not in _KNOWN and k != "path" and not is_security_option(k))
    if unknown:
        known = ", ".join(sorted(_KNOWN.values(), key=str.lower))
        raise SluiceOptionError(f"unknown option(s) {', '.join(unknown)} for the sluice source (known: {known})")
    if options.get("path"):
        raise SluiceOptionError("the sluice source takes no path: use .option('subscribe', TOPIC) and load()")
    for name in sorted(_STREAM_ONLY if not streaming else _BATCH_ONLY):
        if name in options:
            where = "streaming" if name in _STREAM_ONLY else "batch"
            raise SluiceOptionError(f"option {_KNOWN[name]!r} is only for {where} queries")

    bootstrap = options.get("bootstrap.servers") or options.get("kafka.bootstrap.servers")
    if not bootstrap or not bootstrap.strip():
        raise SluiceOptionError(
            "option 'bootstrap.servers' is required (host:port of one or more brokers, comma-separated)"
        )

    given = [name for name in ("subscribe", "subscribepattern", "assign") if options.get(name) is not None]
    if len(given) != 1:
        raise SluiceOptionError(
            "exactly one of 'subscribe', 'subscribePattern' and 'assign' must be set"
            + (f" (got {', '.join(_KNOWN[g] for g in given)})" if given else "")
        )
    subscribe: tuple[str, ...] | None = None
    pattern: str | None = None
    assign: dict[str, tuple[int, ...]] | None = None
    if given[0] == "subscribe":
        topics = tuple(t.strip() for t in options["subscribe"].split(",") if t.strip())
        if not topics:
            raise SluiceOptionError("option 'subscribe' names no topic (a comma-separated list of topics)")
        subscribe = tuple(dict.fromkeys(topics))
    elif given[0] == "subscribepattern":
        pattern = options["subscribepattern"].strip()
        if not pattern:
            raise SluiceOptionError("option 'subscribePattern' is empty (a Java/Python regular expression)")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise SluiceOptionError(f"option 'subscribePattern' is not a valid regular expression: {exc}") from None
    else:
        assign = {}
        for topic, parts in _json_object("assign", options["assign"]).items():
            if not isinstance(parts, list) or not parts:
                raise SluiceOptionError(
                    f"option 'assign': topic {topic!r} needs a non-empty list of partitions, e.g. {{\"{topic}\":[0,1]}}"
                )
            numbers = []
            for p in parts:
                if isinstance(p, bool) or not isinstance(p, int) or p < 0:
                    raise SluiceOptionError(f"option 'assign': {p!r} in topic {topic!r} is not a partition number")
                numbers.append(p)
            assign[topic] = tuple(sorted(set(numbers)))
        if not assign:
            raise SluiceOptionError("option 'assign' names no topic")

    isolation = (options.get("isolationlevel") or options.get("kafka.isolation.level") or "read_committed").strip()
    if isolation not in ("read_committed", "read_uncommitted"):
        raise SluiceOptionError(
            f"option 'isolationLevel' must be 'read_committed' or 'read_uncommitted', not {isolation!r}"
        )

    starting = _offset_spec(
        "startingOffsets",
        options.get("startingoffsets"),
        "latest" if streaming else "earliest",
        allow=("earliest", "latest") if streaming else ("earliest",),
        allow_specific={EARLIEST, LATEST} if streaming else {EARLIEST},
    )
    ending = _offset_spec(
        "endingOffsets", options.get("endingoffsets"), "latest", allow=("latest",), allow_specific={LATEST}
    )
    if assign is not None:
        wanted = {(t, p) for t, ps in assign.items() for p in ps}
        for name, spec in (("startingOffsets", starting), ("endingOffsets", ending)):
            if spec.kind == "specific" and set(spec.offsets) != wanted:
                raise SluiceOptionError(
                    f"option {name!r} must give an offset for exactly the assigned partitions "
                    f"(missing: {sorted(wanted - set(spec.offsets))}, "
                    f"not assigned: {sorted(set(spec.offsets) - wanted)})"
                )

    timeout = _positive_int(options, "pollTimeoutMs") or _positive_int(options, "kafkaConsumer.pollTimeoutMs")
    return ReadOptions(
        bootstrap_servers=bootstrap.strip(),
        subscribe=subscribe,
        subscribe_pattern=pattern,
        assign=assign,
        starting=starting,
        ending=ending,
        fail_on_data_loss=_bool(options, "failOnDataLoss", True),
        include_headers=_bool(options, "includeHeaders", False),
        isolation_level=isolation,
        min_partitions=_positive_int(options, "minPartitions"),
        max_records_per_partition=_positive_int(options, "maxRecordsPerPartition"),
        max_offsets_per_trigger=_positive_int(options, "maxOffsetsPerTrigger"),
        poll_timeout_ms=timeout or 120_000,
        fetch_max_bytes=_positive_int(options, "fetchMaxBytes") or 16 * 1024 * 1024,
        security=parse_security_options(options, SluiceOptionError),
    )
