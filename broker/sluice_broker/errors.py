"""Broker-side errors: every refusal is a :mod:`sluice.errors` class, answered as its Kafka code.

There is one error table, :mod:`sluice.errors`: one class per Kafka error code,
with its name and whether a client may retry. The broker has no exception types
of its own for refusals. Code anywhere in the broker (a partition log, the
replica manager, topic administration, the coordinators) raises the class of
the code it means, ``errors.NotLeaderOrFollowerError("...")``, or
``errors.error_for(code, message)`` when the code is only known at run time (a
verdict handed back by another component). Whoever answers the request catches
:class:`~sluice.errors.SluiceError` and puts it into the response with
:func:`answer`, the one place an exception becomes a response's
``error_code`` and ``error_message``; per-partition results do the same with
``exc.code`` and ``exc.message``.

Two kinds of failure are not a Kafka code: a request that is malformed
(negative sizes, an undecodable message) raises
:class:`~sluice.errors.InvalidArgumentError`, which the servicer answers with
gRPC INVALID_ARGUMENT; anything unexpected is a bug, answered with gRPC INTERNAL
and logged (``server._guard``).
"""

from __future__ import annotations

from typing import Protocol

from sluice.errors import ErrorCode, InvalidArgumentError, SluiceError, error_for

__all__ = ["ErrorFields", "InvalidArgumentError", "SluiceError", "answer", "error_for"]


class ErrorFields(Protocol):
    """A response (or part of one) with Kafka's error fields."""

    error_code: ErrorCode
    error_message: str


def answer(target: ErrorFields, exc: SluiceError) -> None:
    """Put a refusal into a response's error fields: its wire code and its message."""
    target.error_code = exc.code
    target.error_message = exc.message
