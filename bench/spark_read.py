#!/usr/bin/env python3
"""Rows per second of a Spark batch read of a Sluice topic (local[2], read_committed).

    python bench/spark_read.py                          # 1,000,000 records of 100 bytes, 3 timed reads
    python bench/spark_read.py --count 200000 --runs 1  # a smoke run
    python bench/spark_read.py --value-sizes 50-150     # values of varied size (mean 100 bytes)

A fresh single-broker LocalCluster gets a topic (4 partitions) filled by a transactional producer
(commits every 50,000 records, so the read is a read_committed read of transactional data). Then
a SparkSession in local[2] mode (the machine's two cores, shared with the broker) reads the whole
topic with ``spark.read.format("sluice")`` and aggregates every row:
``count(*), sum(length(value)), max(offset)`` — so every value crosses from the Python reader
into the JVM. One untimed read of a small topic first starts the JVM and the Python workers.
The time is from the action's start to its result; filling the topic is not timed.

Each run also times Spark's own ceiling on the same machine at the same moment: the same number
of rows with the same columns and value size, yielded as ready-made Arrow batches by an in-memory
Python data source with the same number of tasks. The gap between the two figures is what the sluice reader costs
(fetching, decoding); the ceiling is the Python Data Source API's own cost.

Values of one size make batches of records of one size, which the Arrow decoder recognises and
slices without a Python loop (see sluice/spark/arrow.py); ``--value-sizes 50-150`` measures the
general path. Results are appended to bench/results/spark_read.json with the machine's load
average (the machine is shared: figures vary with it).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

from sluice.cli.engines.bench import append_result, environment
from sluice.client import Admin, Producer
from sluice.testing import LocalCluster

RESULTS = Path(__file__).resolve().parent / "results" / "spark_read.json"


def values_for(sizes: str, n: int = 256, seed: int = 11) -> list[bytes]:
    lo, _, hi = sizes.partition("-")
    low, high = int(lo), int(hi or lo)
    rnd = random.Random(seed)
    alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789 ,.:"
    return [bytes(rnd.choice(alphabet) for _ in range(rnd.randint(low, high))) for _ in range(n)]


def baseline_source(rows: int, value_size: int, tasks: int, rows_per_batch: int) -> type:
    """A data source that yields ready-made Arrow batches of the same shape, from memory: Spark's own ceiling.

    Defined in __main__ so cloudpickle ships the classes to the Python workers by value.
    """
    import numpy as np
    import pyarrow as pa
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from sluice.spark.arrow import arrow_schema
    from sluice.spark.source import read_schema

    class MemoryReader(DataSourceReader):  # type: ignore[misc]
        def partitions(self) -> list[InputPartition]:
            return [InputPartition(i) for i in range(tasks)]

        def read(self, partition: InputPartition):  # type: ignore[no-untyped-def]
            schema = arrow_schema(False)
            left = rows // tasks
            while left > 0:
                n = min(rows_per_batch, left)
                left -= n
                data = np.full(n * value_size, ord("x"), dtype=np.uint8)
                offsets = np.arange(n + 1, dtype=np.int32) * value_size
                columns = [
                    pa.nulls(n, pa.binary()),
                    pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)]),
                    pa.repeat(pa.scalar("bench-read", pa.string()), n),
                    pa.array(np.full(n, partition.value, dtype=np.int32)),
                    pa.array(np.arange(n, dtype=np.int64)),
                    pa.array(np.full(n, 1_700_000_000_000_000, dtype=np.int64), pa.timestamp("us", tz="UTC")),
                    pa.array(np.zeros(n, dtype=np.int32)),
                ]
                yield pa.RecordBatch.from_arrays(columns, schema=schema)

    class MemorySource(DataSource):  # type: ignore[misc]
        @classmethod
        def name(cls) -> str:
            return "bench_memory"

        def schema(self) -> object:
            return read_schema(False)

        def reader(self, schema: object) -> MemoryReader:
            return MemoryReader()

    return MemorySource


def fill(bootstrap: str, topic: str, count: int, values: list[bytes], partitions: int) -> float:
    with Admin(bootstrap_servers=bootstrap) as admin:
        admin.create_topic(topic, partitions=partitions)
    producer = Producer(bootstrap_servers=bootstrap, transactional_id=f"bench-{topic}", linger_ms=5)
    producer.init_transactions()
    t0 = time.monotonic()
    per_txn = 50_000
    sent = 0
    while sent < count:
        producer.begin_transaction()
        n = min(per_txn, count - sent)
        for i in range(sent, sent + n):
            producer.send(topic, value=values[i % len(values)])
        producer.commit_transaction()
        sent += n
        print(f"\r  filled {sent:,}/{count:,}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    producer.close()
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=1_000_000)
    ap.add_argument("--value-sizes", default="100", help="one size (100) or a range (50-150)")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--master", default="local[2]")
    args = ap.parse_args()

    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import sluice.spark

    values = values_for(args.value_sizes)
    with LocalCluster(brokers=1) as cluster:
        bootstrap = cluster.bootstrap_servers
        print(f"filling {args.count:,} records ({args.value_sizes} bytes) ...", file=sys.stderr)
        fill_s = fill(bootstrap, "bench-read", args.count, values, args.partitions)
        fill(bootstrap, "bench-warmup", 10_000, values, args.partitions)
        spark = (
            SparkSession.builder.master(args.master)
            .appName("sluice-bench-spark-read")
            .config("spark.ui.enabled", "false")
            .config("spark.pyspark.python", sys.executable)
            .config("spark.driver.memory", "2g")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        sluice.spark.register(spark)

        def read(topic: str) -> tuple[float, int, int]:
            df = spark.read.format("sluice").option("bootstrap.servers", bootstrap).option("subscribe", topic).load()
            t0 = time.perf_counter()
            row = df.selectExpr("count(*) AS n", "sum(length(value)) AS bytes", "max(offset) AS last").collect()[0]
            return time.perf_counter() - t0, int(row["n"]), int(row["bytes"])

        read("bench-warmup")
        value_size = max(len(v) for v in values) if len(set(map(len, values))) == 1 else 100
        spark.dataSource.register(baseline_source(args.count, value_size, args.partitions, 125_000))

        def read_memory() -> float:
            df = spark.read.format("bench_memory").load()
            t0 = time.perf_counter()
            df.selectExpr("count(*)", "sum(length(value))", "max(offset)").collect()
            return time.perf_counter() - t0

        read_memory()
        runs = []
        for r in range(args.runs):
            seconds, n, nbytes = read("bench-read")
            if n != args.count:
                raise SystemExit(f"read {n} rows, expected {args.count}")
            memory_s = read_memory()
            runs.append(
                {
                    "seconds": round(seconds, 3),
                    "rows_per_s": round(n / seconds),
                    "mb_per_s": round(nbytes / seconds / 1e6, 1),
                    "spark_ceiling_rows_per_s": round(args.count / memory_s),
                }
            )
            print(
                f"  run {r + 1}: {n:,} rows in {seconds:.2f} s = {n / seconds:,.0f} rows/s "
                f"(Spark's ceiling, the same rows from memory: {args.count / memory_s:,.0f} rows/s)",
                file=sys.stderr,
            )
        spark.stop()

    median = statistics.median(r["rows_per_s"] for r in runs)
    ceiling = statistics.median(r["spark_ceiling_rows_per_s"] for r in runs)
    result = {
        "benchmark": "spark-read",
        "master": args.master,
        "records": args.count,
        "value_sizes": args.value_sizes,
        "partitions": args.partitions,
        "isolation_level": "read_committed",
        "fill_seconds": round(fill_s, 1),
        "runs": runs,
        "median_rows_per_s": median,
        "median_spark_ceiling_rows_per_s": ceiling,
        **environment(),
    }
    append_result(RESULTS, result)
    print(f"median {median:,.0f} rows/s (Spark's ceiling {ceiling:,.0f} rows/s) over {len(runs)} runs -> {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
