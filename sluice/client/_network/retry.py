"""Deadlines and retry delays for client calls.

A :class:`Deadline` is the point in (monotonic) time an operation must be done
by; :class:`Backoff` spaces retries (50 ms growing by 1.6x to 1 s, with
+-20% jitter so clients that failed together do not retry together);
:func:`retry` combines them: retriable :mod:`sluice.errors` wait and retry,
and when the deadline passes the last retriable error is raised as it is,
as :mod:`sluice.errors` documents.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from sluice import errors

log = logging.getLogger("sluice.client")

T = TypeVar("T")


class Deadline:
    """A point in (monotonic) time that operations must finish by."""

    __slots__ = ("at",)

    def __init__(self, seconds: float | None) -> None:
        self.at = float("inf") if seconds is None else time.monotonic() + seconds

    def remaining(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def expired(self) -> bool:
        return time.monotonic() >= self.at

    def timeout(self, cap: float) -> float:
        """A per-call timeout: what remains, at most ``cap``, at least a little."""
        return max(0.05, min(cap, self.remaining()))


class Backoff:
    """Retry delays: ``initial`` growing by ``factor`` to ``maximum``, +-20% jitter."""

    __slots__ = ("_next", "factor", "initial", "maximum")

    def __init__(self, initial: float = 0.05, maximum: float = 1.0, factor: float = 1.6) -> None:
        self.initial = initial
        self.maximum = maximum
        self.factor = factor
        self._next = initial

    def next(self) -> float:
        delay = self._next
        self._next = min(self.maximum, self._next * self.factor)
        return delay * random.uniform(0.8, 1.2)

    def reset(self) -> None:
        self._next = self.initial

    def sleep(self, deadline: Deadline | None = None) -> None:
        delay = self.next()
        if deadline is not None:
            delay = min(delay, deadline.remaining())
        if delay > 0:
            time.sleep(delay)


def retry(fn: Callable[[], T], deadline: Deadline, backoff: Backoff | None = None) -> T:
    """Call ``fn`` until it returns or raises a fatal error; retriable errors wait and retry.

    When the deadline passes, the last retriable error is raised.
    """
    backoff = backoff or Backoff()
    while True:
        try:
            return fn()
        except errors.SluiceError as exc:
            if not exc.retriable or deadline.expired():
                raise
            log.debug("retrying after %s: %s", type(exc).__name__, exc)
            backoff.sleep(deadline)
