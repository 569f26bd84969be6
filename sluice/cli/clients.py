"""The typed seam between the commands and :mod:`sluice.client`.

Every command reaches the client through the functions here, and every one of them is typed
with the client's own classes (``Admin``, ``Producer``, ``Consumer``, ``TopicDescription`` ...),
so mypy checks each call a command makes against the client's signatures; nothing at this seam
is ``Any``. Every client is made from a :class:`~sluice.cli.bootstrap.Connection` (servers and
security settings), so no command can forget ``--command-config``; a client that refuses its
TLS files (a missing file) is a one-line usage error.

The client is imported inside the functions, not at the top: ``sluice --help`` and ``sluice
broker`` must not pay for grpc and the client, and the top-level names below exist for the
type checker only (``TYPE_CHECKING``). A client that cannot be imported (a broken install) is a
one-line :class:`~sluice.cli.exits.CliError`, not a traceback.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from sluice.cli.exits import USAGE, CliError
from sluice.cli.output import close_quietly

if TYPE_CHECKING:
    from sluice.cli.bootstrap import Connection
    from sluice.client import (
        Admin,
        Consumer,
        PartitionDescription,
        PreparedTransaction,
        Producer,
        TopicDescription,
        TopicPartition,
    )


@contextlib.contextmanager
def _importing_the_client() -> Iterator[None]:
    try:
        yield
    except ImportError as exc:
        raise CliError(f"the Sluice client cannot be imported ({exc}); is the package installed?") from exc


@contextlib.contextmanager
def _reading_tls_files() -> Iterator[None]:
    try:
        yield
    except ValueError as exc:  # the clients name a TLS file they cannot read
        raise CliError(str(exc), USAGE) from None


def open_admin(conn: Connection) -> Admin:
    with _importing_the_client():
        from sluice.client import Admin
    with _reading_tls_files():
        return Admin(**conn.kwargs())


def open_producer(
    conn: Connection,
    *,
    transactional_id: str | None,
    acks: str,
    enable_idempotence: bool,
    linger_ms: int,
    compression: str | None,
    properties: Sequence[tuple[str, str]] = (),
) -> Producer:
    with _importing_the_client():
        from sluice.client import Producer
    extra = client_properties(Producer, properties, "--producer-property")
    settings: dict[str, Any] = {
        "transactional_id": transactional_id,
        "acks": acks,
        "enable_idempotence": enable_idempotence,
        "linger_ms": linger_ms,
        "compression": compression,
    }
    with _reading_tls_files():
        return Producer(**conn.kwargs(), **(settings | extra))  # a property given overrides the option


def open_consumer(
    conn: Connection,
    *,
    group_id: str,
    isolation_level: str,
    auto_offset_reset: str,
    enable_auto_commit: bool,
    properties: Sequence[tuple[str, str]] = (),
) -> Consumer:
    with _importing_the_client():
        from sluice.client import Consumer
    extra = client_properties(Consumer, properties, "--consumer-property")
    settings: dict[str, Any] = {
        "group_id": group_id,
        "isolation_level": isolation_level,
        "auto_offset_reset": auto_offset_reset,
        "enable_auto_commit": enable_auto_commit,
    }
    with _reading_tls_files():
        return Consumer(**conn.kwargs(), **(settings | extra))


# Kafka's client property names whose Sluice keyword is not the name with '.' -> '_'.
PROPERTY_ALIASES = {
    "compression.type": "compression",
    "max.in.flight.requests.per.connection": "max_in_flight",
}
# Settings the commands own, by keyword prefix, and the option that sets each.
_OWNED = {
    "bootstrap_servers": "--bootstrap-server",
    "security_protocol": "--command-config",
    "ssl_": "--command-config",
    "sasl_": "--command-config",
    "group_id": "--group",
    "transactional_id": "--transactional-id",
}
_NOT_PROPERTIES = tuple(_OWNED)


def client_properties(cls: type, properties: Sequence[tuple[str, str]], option: str) -> dict[str, Any]:
    """``--producer-property``/``--consumer-property`` KEY=VALUE pairs, Kafka's names, as ``cls`` keywords.

    Kafka's console tools take any client setting this way; here a Kafka name maps to the
    client's keyword (``linger.ms`` -> ``linger_ms``), typed as the keyword's default is. The
    values are Any at this seam (the one place): each name was checked against ``cls``'s
    signature, and the client validates the values (a ValueError is a one-line usage error).
    """
    params = inspect.signature(cls).parameters
    known = sorted(n.replace("_", ".") for n, p in params.items() if _settable(n, p))
    out: dict[str, Any] = {}
    for key, raw in properties:
        name = PROPERTY_ALIASES.get(key, key.replace(".", "_").replace("-", "_"))
        param = params.get(name)
        if param is None or not _settable(name, param):
            owned = next((f" (use {opt})" for prefix, opt in _OWNED.items() if name.startswith(prefix)), "")
            raise CliError(f"{option} {key}: not a {cls.__name__} setting{owned}; known: {', '.join(known)}", USAGE)
        out[name] = _typed(option, key, raw, param.default, name)
    return out


def _settable(name: str, param: inspect.Parameter) -> bool:
    return param.kind is inspect.Parameter.KEYWORD_ONLY and not name.startswith(_NOT_PROPERTIES)


def _typed(option: str, key: str, raw: str, default: object, name: str) -> object:
    text = raw.strip()
    if isinstance(default, bool):
        if text.lower() not in ("true", "false"):
            raise CliError(f"{option} {key}={raw}: expected true or false", USAGE)
        return text.lower() == "true"
    if isinstance(default, int) or (default is None and name.endswith(("_ms", "_bytes", "_size"))):
        try:
            return int(text)
        except ValueError:
            raise CliError(f"{option} {key}={raw}: expected an integer", USAGE) from None
    return None if text.lower() == "null" and default is None else raw


def topic_partition(topic: str, partition: int) -> TopicPartition:
    with _importing_the_client():
        from sluice.client import TopicPartition
    return TopicPartition(topic, partition)


def prepared_transaction(transactional_id: str, producer_id: int, producer_epoch: int) -> PreparedTransaction:
    with _importing_the_client():
        from sluice.client import PreparedTransaction
    return PreparedTransaction(transactional_id, producer_id, producer_epoch)


def describe_existing_topic(admin: Admin, topic: str, *, hint_create: bool = True) -> TopicDescription:
    """The topic's description, or a one-line error if there is none (with the command that creates
    it, unless the caller is about to delete it)."""
    from sluice import errors

    try:
        return admin.describe_topic(topic)
    except errors.UnknownTopicOrPartitionError:
        hint = f" (create it with `sluice topics create {topic}`)" if hint_create else ""
        raise CliError(f"unknown topic {topic!r}{hint}") from None


def check_partition(conn: Connection, topic: str, partition: int | None) -> None:
    """That ``topic`` exists and, when a partition is named, has it: what produce and consume check
    before they start, as one-line errors."""
    admin = open_admin(conn)
    try:
        desc = describe_existing_topic(admin, topic)
    finally:
        close_quietly(admin)
    count = len(desc.partitions)
    if partition is not None and partition >= count:
        raise CliError(f"topic {topic!r} has no partition {partition} (it has {count})")


def partitions_of(desc: TopicDescription) -> list[PartitionDescription]:
    """The topic's partitions in partition order."""
    return sorted(desc.partitions, key=lambda p: p.partition)
