"""The Spark driver of the node test, run as its own process: client mode on the host, executors
as pods that Spark's Kubernetes scheduler backend creates on the node.

It reads a topic with ``format("sluice")`` and writes the rows to another topic with the
exactly-once sink, then reports where the work ran, as Spark and the pods themselves see it:

* every executor of the application (Spark's REST API on the driver's UI): id, host:port, and
  how many tasks it ran and failed (the copy's tasks included: a driver in client mode runs
  none of them itself);
* the pod names the executors' Python workers find in their environment
  (``SPARK_EXECUTOR_POD_NAME``, which Spark's pod spec fills from the pod's own metadata).

Run with one JSON argument: ``{"conf": {...Spark settings...}, "read": {...source options...},
"write": {...sink options...}}``. Prints one JSON line at the end: ``{"ok": true, ...}`` or
``{"ok": false, "error": ...}``. The test gives it PYSPARK_PYTHON=python3 and a PATH whose
python3 has this tree's sluice: PySpark hands the executors the same command, and the image's
python3 is its own venv's.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
import urllib.request
from typing import Any

from pyspark.sql import SparkSession

import sluice.spark


def pod_name(_: int) -> str:
    return os.environ.get("SPARK_EXECUTOR_POD_NAME", "<not in a pod>")


def executors(spark: SparkSession) -> list[dict[str, Any]]:
    sc = spark.sparkContext
    url = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}/allexecutors"
    with urllib.request.urlopen(url, timeout=30) as reply:
        found: list[dict[str, Any]] = json.load(reply)
    keys = ("id", "hostPort", "totalTasks", "completedTasks", "failedTasks", "isActive")
    return [{k: e.get(k) for k in keys} for e in found]


def main() -> int:
    job = json.loads(sys.argv[1])
    builder = SparkSession.builder.appName("sluice-node-copy")
    for key, value in job["conf"].items():
        builder = builder.config(key, value)
    started = time.monotonic()
    spark = builder.getOrCreate()
    result: dict[str, Any] = {"session_s": round(time.monotonic() - started, 1)}
    try:
        spark.sparkContext.setLogLevel("WARN")
        sluice.spark.register(spark)
        began = time.monotonic()
        df = spark.read.format("sluice").options(**job["read"]).load()
        df.select("key", "value").write.format("sluice").options(**job["write"]).mode("append").save()
        result["copy_s"] = round(time.monotonic() - began, 1)
        slots = 8
        result["pods"] = sorted(set(spark.sparkContext.parallelize(range(slots), slots).map(pod_name).collect()))
        result["executors"] = executors(spark)
        result["app_id"] = spark.sparkContext.applicationId
        result["ok"] = True
    except Exception as exc:
        result.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:4000])
        traceback.print_exc()
    finally:
        spark.stop()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
