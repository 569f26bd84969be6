"""What the exactly-once write tests check: the values a consumer sees, and what is left unfinished."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from sluice.client import Admin, Consumer, TopicPartition


def read_values(bootstrap: str, topic: str, isolation_level: str = "read_committed") -> Counter[bytes]:
    """How often each value is visible, read to the end of every partition."""
    with Admin(bootstrap_servers=bootstrap) as admin:
        n = len(admin.describe_topic(topic).partitions)
    tps = [TopicPartition(topic, p) for p in range(n)]
    consumer = Consumer(bootstrap_servers=bootstrap, group_id=None, isolation_level=isolation_level)
    try:
        consumer.assign(tps)
        consumer.seek_to_beginning(tps)
        ends = consumer.end_offsets(tps)
        seen: Counter[bytes] = Counter()
        deadline = time.monotonic() + 120
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise AssertionError("reading the topic to its end took too long")
            for r in consumer.poll(timeout=0.5):
                assert r.value is not None
                seen[r.value] += 1
        return seen
    finally:
        consumer.close()


def unfinished(bootstrap: str, prefix: str) -> list[Any]:
    """Transactions of a writer prefix that are still open or prepared (they would hold the LSO)."""
    with Admin(bootstrap_servers=bootstrap) as admin:
        return [
            t
            for t in admin.list_transactions()
            if t.transactional_id.startswith(prefix) and t.state not in ("CompleteCommit", "CompleteAbort", "Empty")
        ]
