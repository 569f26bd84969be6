"""Writing test data for the Spark tests: committed, aborted and open transactions, and what they hold.

Every record written is returned as a :class:`Written` (its partition and offset as the broker
assigned them, key, value, headers, timestamp), so a test compares what Spark read with exactly
what was committed.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from sluice.client import Admin, Producer

_ids = itertools.count()


@dataclass(frozen=True)
class Written:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp: int


def create_topic(bootstrap: str, topic: str, partitions: int, replication_factor: int | None = None) -> None:
    with Admin(bootstrap_servers=bootstrap) as admin:
        admin.create_topic(topic, partitions=partitions, replication_factor=replication_factor)


def transaction(
    producer: Producer,
    topic: str,
    values: list[bytes],
    *,
    commit: bool | None = True,
    partition: int | None = None,
    headers: list[tuple[str, bytes]] | None = None,
) -> list[Written]:
    """Send ``values`` (key b"k-" + value) in one transaction: commit (True), abort (False) or leave open (None)."""
    producer.begin_transaction()
    futures = [(v, producer.send(topic, value=v, key=b"k-" + v, partition=partition, headers=headers)) for v in values]
    producer.flush()
    out = []
    for v, f in futures:
        md = f.result(30)
        out.append(Written(topic, md.partition, md.offset, b"k-" + v, v, tuple(headers or ()), md.timestamp))
    if commit is True:
        producer.commit_transaction()
    elif commit is False:
        producer.abort_transaction()
    return out


def transactional_producer(bootstrap: str, prefix: str = "spark-test", timeout_ms: int = 60_000) -> Producer:
    producer = Producer(
        bootstrap_servers=bootstrap,
        transactional_id=f"{prefix}-{next(_ids)}",
        linger_ms=2,
        transaction_timeout_ms=timeout_ms,
    )
    producer.init_transactions()
    return producer
