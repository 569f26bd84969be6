"""Spark driver programs of the exactly-once write tests, run as their own process.

Each test starts this script with a JSON job description: a driver of its own
means a SparkContext with the test's settings (task retries, speculation,
which a shared session cannot change) and a driver the test can kill
(SIGKILL of its process group: the JVM, the Python workers, everything).

Modes:

* ``batch``: ``spark.range(rows)`` in ``partitions`` partitions, key and value
  the row number as text, written with ``df.write.format("sluice")``.
  ``fail_partition`` makes every attempt of that partition fail after its
  first rows (the job fails as a whole); ``slow_first_attempt`` makes the
  first attempt of partition 0 sleep that many seconds before its rows
  (a straggler for speculation).
* ``stream``: JSON files of ``input_dir`` (one file per micro-batch) written
  with ``df.writeStream.format("sluice")``, a checkpoint and the availableNow
  trigger: it stops once every file is processed.

Prints one JSON line at the end: ``{"ok": true}`` or ``{"ok": false, "error": ...}``.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from typing import Any

from pyspark.sql import SparkSession

import sluice.spark


def session(job: dict[str, Any]) -> SparkSession:
    builder = SparkSession.builder.master(job.get("master", "local[2]")).appName(job.get("name", "sluice-write"))
    conf = {
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        **job.get("conf", {}),
    }
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    sluice.spark.register(spark)
    return spark


def run_batch(spark: SparkSession, job: dict[str, Any]) -> None:
    from pyspark.sql import functions as F

    df = spark.range(0, int(job["rows"]), 1, int(job["partitions"]))
    value = F.col("id").cast("string")
    fail = job.get("fail_partition")
    if fail is not None:
        # Every attempt of that partition dies after its first rows: the job fails as a whole.
        value = F.when(
            (F.spark_partition_id() == int(fail)) & (F.col("id") % 1000 == 999), F.raise_error(F.lit("planned failure"))
        ).otherwise(value)
    slow = job.get("slow_first_attempt")
    if slow:
        seconds = float(slow)

        @F.udf("string")  # type: ignore[misc]
        def straggle(v: str) -> str:
            from pyspark import TaskContext

            ctx = TaskContext.get()
            if ctx is not None and ctx.partitionId() == 0 and ctx.attemptNumber() == 0 and v == "0":
                time.sleep(seconds)
            return v

        value = straggle(value)
    if job.get("value_only"):  # the writer's bulk path (Producer.send_many)
        out = df.select(value.alias("value"))
    else:
        out = df.select(F.col("id").cast("string").alias("key"), value.alias("value"))
    writer = out.write.format("sluice").mode("append")
    for k, v in job["options"].items():
        writer = writer.option(k, v)
    writer.save()


def run_stream(spark: SparkSession, job: dict[str, Any]) -> None:
    df = spark.readStream.schema("key STRING, value STRING").option("maxFilesPerTrigger", 1).json(job["input_dir"])
    writer = df.writeStream.format("sluice").option("checkpointLocation", job["checkpoint"])
    for k, v in job["options"].items():
        writer = writer.option(k, v)
    query = writer.trigger(availableNow=True).start()
    if not query.awaitTermination(float(job.get("limit_s", 240))):
        query.stop()
        raise TimeoutError("the stream did not process every file in time")
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))


def main() -> int:
    job = json.loads(sys.argv[1])
    spark = session(job)
    try:
        if job["mode"] == "batch":
            run_batch(spark, job)
        else:
            run_stream(spark, job)
        result: dict[str, Any] = {"ok": True}
    except Exception as exc:
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:4000]}
        traceback.print_exc()
    finally:
        spark.stop()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
