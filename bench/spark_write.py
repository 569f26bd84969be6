#!/usr/bin/env python3
"""Rows per second of an exactly-once Spark write: 1,000,000 records of 100 bytes on local[2].

    python bench/spark_write.py                    # a fresh single-broker LocalCluster, 3 runs
    python bench/spark_write.py --rows 100000 --runs 1
    python bench/spark_write.py --bootstrap-server 127.0.0.1:9092

The job is ``spark.range(rows)`` in ``--partitions`` Spark partitions, each row a 100-byte
value (no key), written with ``df.write.format("sluice")`` to a topic of ``--topic-partitions``
partitions: every task writes inside its own transaction and prepares it, the driver commits
them all (sluice/spark/writer.py). Timed: ``save()`` from call to return, so the tasks, their
prepares and the driver's commits are all in; the SparkSession start-up is not (it is made once,
before the first run), nor is an unrecorded warm-up write of 20,000 rows (the first job of a
session also pays for starting Spark's Python workers and compiling its code). Each run then
reads the topic back read_committed (not timed) and checks that exactly ``rows`` new records
are visible.

Results are appended to bench/results/spark_write.json (a JSON list) and printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sluice.spark
from sluice.cli.engines.bench import environment
from sluice.client import Admin, Consumer, TopicPartition
from sluice.testing import LocalCluster

RESULTS = Path(__file__).resolve().parent / "results" / "spark_write.json"
RECORD_SIZE = 100


@contextmanager
def cluster_for(bootstrap: str | None, data_dir: str | None) -> Iterator[str]:
    if bootstrap:
        yield bootstrap
        return
    with LocalCluster(brokers=1, data_dir=data_dir) as cluster:
        yield cluster.bootstrap_servers


def visible(bootstrap: str, topic: str) -> int:
    """Records a read_committed consumer sees in the topic (read to the end)."""
    with Admin(bootstrap_servers=bootstrap) as admin:
        n = len(admin.describe_topic(topic).partitions)
    tps = [TopicPartition(topic, p) for p in range(n)]
    consumer = Consumer(bootstrap_servers=bootstrap, group_id=None, isolation_level="read_committed")
    try:
        consumer.assign(tps)
        consumer.seek_to_beginning(tps)
        ends = consumer.end_offsets(tps)
        count = 0
        deadline = time.monotonic() + 600
        while any(consumer.position(tp) < ends[tp] for tp in tps) and time.monotonic() < deadline:
            count += len(consumer.poll(timeout=0.5))
        return count
    finally:
        consumer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=2, help="Spark partitions (tasks) of the job")
    parser.add_argument("--topic-partitions", type=int, default=2)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--bootstrap-server", help="an existing cluster (default: a fresh LocalCluster)")
    parser.add_argument("--data-dir", help="where the fresh cluster keeps its data (default: a temporary dir)")
    parser.add_argument("--output", default=str(RESULTS))
    args = parser.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = (
        SparkSession.builder.master(args.master)
        .appName("sluice-bench-spark-write")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    sluice.spark.register(spark)
    value = F.lpad(F.col("id").cast("string"), RECORD_SIZE, "x")  # exactly 100 bytes per record
    df = spark.range(0, args.rows, 1, args.partitions).select(value.alias("value"))

    runs: list[dict[str, Any]] = []
    with cluster_for(args.bootstrap_server, args.data_dir) as bootstrap:
        admin = Admin(bootstrap_servers=bootstrap)
        warm = f"bench-spark-write-warmup-{int(time.time())}"
        admin.create_topic(warm, partitions=args.topic_partitions, replication_factor=1)
        df.limit(20_000).write.format("sluice").mode("append").option("bootstrap.servers", bootstrap).option(
            "topic", warm
        ).save()
        admin.delete_topic(warm)
        for run in range(args.runs):
            topic = f"bench-spark-write-{int(time.time())}-{run}"
            admin.create_topic(topic, partitions=args.topic_partitions, replication_factor=1)
            load_before = os.getloadavg()[0]
            started = time.perf_counter()
            df.write.format("sluice").mode("append").option("bootstrap.servers", bootstrap).option(
                "topic", topic
            ).save()
            seconds = time.perf_counter() - started
            seen = visible(bootstrap, topic)
            if seen != args.rows:
                raise SystemExit(f"run {run}: {seen} records visible, expected {args.rows}")
            entry = {
                "run": run,
                "rows": args.rows,
                "record_size": RECORD_SIZE,
                "seconds": round(seconds, 3),
                "rows_per_s": round(args.rows / seconds),
                "mb_per_s": round(args.rows * RECORD_SIZE / seconds / 1e6, 2),
                "load_average_before": round(load_before, 2),
                "visible_read_committed": seen,
            }
            runs.append(entry)
            print(
                f"run {run}: {args.rows:,} rows in {seconds:.1f} s = {entry['rows_per_s']:,} rows/s "
                f"(load average {load_before:.1f})",
                flush=True,
            )
            admin.delete_topic(topic)
        admin.close()
    spark.stop()

    median = statistics.median(r["rows_per_s"] for r in runs)
    result = {
        "name": "spark-write-exactly-once-100B",
        "params": {
            "rows": args.rows,
            "record_size": RECORD_SIZE,
            "master": args.master,
            "spark_partitions": args.partitions,
            "topic_partitions": args.topic_partitions,
        },
        "environment": environment(),
        "runs": runs,
        "median_rows_per_s": median,
    }
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    history = json.loads(out.read_text()) if out.exists() else []
    history.append(result)
    out.write_text(json.dumps(history, indent=2) + "\n")
    print(f"median {median:,.0f} rows/s over {len(runs)} run(s); appended to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
