"""Streaming helpers for the Spark tests: a recording foreachBatch sink and query runners.

:class:`BatchRecorder` is an idempotent sink, as a real exactly-once sink is: a
micro-batch Spark replays after a restart has the same batch id and replaces
what that id wrote before. What it holds in the end is therefore what the
source delivered, batch by batch, and a record delivered twice (in two
different batches) shows up twice.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

Position = tuple[str, int, int]  # topic, partition, offset


class BatchRecorder:
    """foreachBatch sink: batch id -> [(topic, partition, offset, value)]."""

    def __init__(self) -> None:
        self.batches: dict[int, list[tuple[str, int, int, bytes | None]]] = {}
        self._lock = threading.Lock()

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        rows = [
            (r.topic, r.partition, r.offset, r.value)
            for r in df.select("topic", "partition", "offset", "value").collect()
        ]
        with self._lock:
            self.batches[batch_id] = rows

    def records(self) -> list[tuple[str, int, int, bytes | None]]:
        with self._lock:
            return [r for rows in self.batches.values() for r in rows]

    def positions(self) -> Counter[Position]:
        return Counter((t, p, o) for t, p, o, _v in self.records())

    def count(self) -> int:
        return len(self.records())


def stream(spark: SparkSession, bootstrap: str, **options: str) -> DataFrame:
    reader = spark.readStream.format("sluice").option("bootstrap.servers", bootstrap)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


# Spark gives the Python process that plans a streaming source 10 s (hard-coded) to start and
# connect back; on a machine busy with other work that is sometimes too short. Such a query never
# got to read anything, so it is started again from the same checkpoint (a bounded number of times).
_WORKER_START_FAILURE = "Python worker failed to connect back"
_START_ATTEMPTS = 3


def _start_failed(query: StreamingQuery) -> bool:
    exc = query.exception()
    return exc is not None and _WORKER_START_FAILURE in str(exc)


def start(df: DataFrame, sink: BatchRecorder, checkpoint: str, **trigger: Any) -> StreamingQuery:
    """Start a foreachBatch query and wait (bounded) until its source is up or it has finished."""
    for attempt in range(1, _START_ATTEMPTS + 1):
        query = df.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint).trigger(**trigger).start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and query.isActive and query.lastProgress is None:
            time.sleep(0.2)
        if not _start_failed(query) or attempt == _START_ATTEMPTS:
            return query
    raise AssertionError("unreachable")


def run_available_now(df: DataFrame, sink: BatchRecorder, checkpoint: str, timeout: float = 240.0) -> None:
    """Run a query with Trigger.AvailableNow to its end (bounded) and check it ended cleanly."""
    query = start(df, sink, checkpoint, availableNow=True)
    finished = query.awaitTermination(timeout)
    if not finished:
        query.stop()
        raise AssertionError(f"the availableNow query did not finish in {timeout} s")
    exc = query.exception()
    assert exc is None, f"the query failed: {exc}"


def wait_until(check: Any, timeout: float, what: str, query: StreamingQuery | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if query is not None and query.exception() is not None:
            raise AssertionError(f"the query failed while waiting for {what}: {query.exception()}")
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
