"""Waiting in tests: the one ``wait_for`` (threads, processes, clusters) and the one ``until`` (a running loop).

Every wait in a test is bounded in time and says what it waited for when it gives up, with what
helps to see why: the last error ``check`` raised (when ``tolerate`` lets it retry through
errors, as a resource that is not there yet raises) and whatever ``logs()`` returns (a
cluster's logs).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    check: Callable[[], T | None],
    timeout: float = 30.0,
    what: str = "",
    *,
    interval: float = 0.1,
    tolerate: tuple[type[BaseException], ...] = (),
    logs: Callable[[], str] | None = None,
) -> T:
    """Call ``check`` every ``interval`` s until it returns something true, and return that.

    An exception of a type in ``tolerate`` counts as "not yet"; any other fails at once. After
    ``timeout`` s, AssertionError naming ``what``, the last tolerated error and ``logs()``.
    """
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            result = check()
            if result:
                return result
        except tolerate as exc:
            last = exc
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    message = f"timed out after {timeout} s waiting for {what or check}"
    if last is not None:
        message += f" (last error: {last!r})"
    if logs is not None:
        message += "\n" + logs()
    raise AssertionError(message)


async def until(check: Callable[[], object], what: str, timeout: float = 10.0, interval: float = 0.01) -> None:
    """Wait, on the running loop, until ``check()`` is true; AssertionError naming ``what`` after ``timeout`` s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(interval)
