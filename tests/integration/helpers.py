"""Small helpers shared by the integration tests: reading a topic to its end, bounded waits."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from sluice.client import Admin, Consumer, TopicPartition

T = TypeVar("T")


def read_topic(
    bootstrap: str,
    topic: str,
    isolation_level: str = "read_committed",
    idle_s: float = 1.5,
    limit_s: float = 60.0,
) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """(partition, offset, key, value) of every visible record, read by an assign() consumer to the end."""
    admin = Admin(bootstrap_servers=bootstrap)
    partitions = len(admin.describe_topic(topic).partitions)
    admin.close()
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    consumer = Consumer(bootstrap_servers=bootstrap, group_id=None, isolation_level=isolation_level)
    consumer.assign(tps)
    ends = consumer.end_offsets(tps)
    out: list[tuple[int, int, bytes | None, bytes | None]] = []
    deadline = time.monotonic() + limit_s
    last_data = time.monotonic()
    while time.monotonic() < deadline:
        records = consumer.poll(timeout=0.5)
        if records:
            last_data = time.monotonic()
            out.extend((r.partition, r.offset, r.key, r.value) for r in records)
            continue
        at_end = all(consumer.position(tp) >= ends[tp] for tp in tps)
        if at_end and time.monotonic() - last_data > idle_s / 3:
            break
        if time.monotonic() - last_data > idle_s:
            break
    consumer.close()
    return out


def values(records: list[tuple[int, int, bytes | None, bytes | None]]) -> list[bytes | None]:
    return [r[3] for r in records]


def wait_for(check: Callable[[], T | None], timeout: float = 30.0, interval: float = 0.1, what: str = "") -> T:
    """Poll ``check`` until it returns something truthy; bounded in time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or check}")
