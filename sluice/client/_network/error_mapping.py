"""From failures to :mod:`sluice.errors`: gRPC status codes, and error codes inside responses.

* :func:`map_rpc_error` turns a failed gRPC call into the exception of its
  status: UNAVAILABLE is :class:`~sluice.errors.BrokerNotAvailableError`
  (retriable: try another broker), DEADLINE_EXCEEDED is a retriable
  :class:`~sluice.errors.RequestTimedOutError`, INVALID_ARGUMENT is
  :class:`~sluice.errors.InvalidArgumentError`. RESOURCE_EXHAUSTED is a message
  too large, or, when it names ``max.connections``, a connection the broker
  refused (a retriable BrokerNotAvailableError, as Kafka clients take a
  connection the broker closed). UNAUTHENTICATED (a token listener refused the
  caller's token) is the final :class:`~sluice.errors.SaslAuthenticationFailedError`.
* Error *codes* inside responses are turned into exceptions by the callers,
  with :func:`sluice.errors.error_for`; :func:`response_error` and
  :func:`first_error` pick the code to act on, and the two code sets say
  which ones send the client back to its metadata or coordinator lookup.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import grpc

from sluice import errors
from sluice.api.v1 import records_pb2

# Codes after which the partition's leader must be looked up again.
METADATA_REFRESH_CODES = frozenset(
    {
        records_pb2.NOT_LEADER_OR_FOLLOWER,
        records_pb2.UNKNOWN_TOPIC_OR_PARTITION,
        records_pb2.LEADER_NOT_AVAILABLE,
        records_pb2.FENCED_LEADER_EPOCH,
        records_pb2.UNKNOWN_LEADER_EPOCH,
        records_pb2.KAFKA_STORAGE_ERROR,
    }
)
# Codes after which the coordinator must be found again.
COORDINATOR_MOVED_CODES = frozenset({records_pb2.NOT_COORDINATOR, records_pb2.COORDINATOR_NOT_AVAILABLE})


def map_rpc_error(exc: grpc.RpcError, addr: str, method: str) -> errors.SluiceError:
    """The :mod:`sluice.errors` exception for a failed gRPC call."""
    code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
    details = (exc.details() if isinstance(exc, grpc.Call) else None) or str(exc)
    where = f"{method} to {addr}"
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return errors.InvalidArgumentError(f"{where}: {details}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return errors.RequestTimedOutError(f"{where} timed out: {details}")
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return errors.BrokerNotAvailableError(f"{where}: broker not available: {details}")
    if code == grpc.StatusCode.UNAUTHENTICATED:  # a token listener refused the token (or there was none)
        return errors.SaslAuthenticationFailedError(f"{where}: {details}")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        if "max.connections" in details:  # the broker refused this connection: as a closed one, retriable
            return errors.BrokerNotAvailableError(f"{where}: the broker refused the connection: {details}")
        return errors.MessageTooLargeError(f"{where}: {details}")
    return errors.UnknownServerError(f"{where} failed with gRPC {code.name}: {details}")


class TopLevelError(Protocol):
    """A response with one top-level error (most coordinator responses)."""

    @property
    def error_code(self) -> int: ...

    @property
    def error_message(self) -> str: ...


def response_error(response: TopLevelError) -> tuple[int, str]:
    """The ``error_of`` of coordinator_call() for responses with one top-level error_code/error_message."""
    return response.error_code, response.error_message


def first_error(codes: Iterable[tuple[int, str]]) -> tuple[int, str]:
    """The error to act on among per-item results: a fatal one first, then a retriable one, else NONE."""
    retriable: tuple[int, str] | None = None
    for code, message in codes:
        if code == records_pb2.NONE:
            continue
        if not errors.error_class(code).retriable:
            return code, message
        if retriable is None:
            retriable = (code, message)
    return retriable or (records_pb2.NONE, "")
