#!/usr/bin/env python3
"""Example Spark job: order totals per customer, read from one Sluice topic, written to another exactly once.

It reads every committed order from the ``orders`` topic (JSON values such as
``{"customer": "c-7", "amount": 12.5}``), aggregates them per customer, and writes one record
per customer (key: the customer, value: ``{"customer", "orders", "total"}`` as JSON) to
``order-totals``. The read is read_committed (the default): orders of aborted or still open
transactions are not counted. The write is exactly once: each Spark task writes inside its own
transaction and only prepares it, and the driver commits them all when Spark commits the job.

    # against a running cluster (sluice dev up, or the brokers' service on Kubernetes)
    spark-submit examples/spark/order_totals.py --bootstrap-servers 127.0.0.1:9092

    # self-contained, in local mode: starts a local cluster, writes sample orders (some in an
    # aborted transaction), runs the job, reads the totals back and checks them
    python examples/spark/order_totals.py --demo

The same file is the job of manifests/spark/ (SparkApplication and spark-submit on Kubernetes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import sluice.spark

ORDER_SCHEMA = "customer STRING, amount DOUBLE"


def order_totals(orders: DataFrame) -> DataFrame:
    """Rows of the Kafka-source schema in, rows of the Kafka-sink schema (key, value) out."""
    parsed = orders.select(F.from_json(F.col("value").cast("string"), ORDER_SCHEMA).alias("o")).select("o.*")
    totals = (
        parsed.where(F.col("customer").isNotNull())
        .groupBy("customer")
        .agg(F.count("*").alias("orders"), F.round(F.sum("amount"), 2).alias("total"))
    )
    return totals.select(
        F.col("customer").alias("key"),
        F.to_json(F.struct("customer", "orders", "total")).alias("value"),
    )


def run(spark: SparkSession, bootstrap: str, source: str, sink: str) -> None:
    orders = (
        spark.read.format("sluice")
        .option("bootstrap.servers", bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
    )
    (
        order_totals(orders)
        .write.format("sluice")
        .option("bootstrap.servers", bootstrap)
        .option("topic", sink)
        .mode("append")
        .save()
    )


def demo() -> int:
    """Local mode end to end: a LocalCluster, sample orders, the job, and a check of its output."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from sluice.client import Admin, Consumer, Producer, TopicPartition
    from sluice.testing import LocalCluster

    with LocalCluster(brokers=1) as cluster:
        bootstrap = cluster.bootstrap_servers
        with Admin(bootstrap_servers=bootstrap) as admin:
            admin.create_topic("orders", partitions=3)
            admin.create_topic("order-totals", partitions=3)
        producer = Producer(bootstrap_servers=bootstrap, transactional_id="order-feed")
        producer.init_transactions()
        expected: dict[str, tuple[int, float]] = {}
        for txn in range(10):
            producer.begin_transaction()
            for i in range(100):
                customer, amount = f"c-{(txn * 100 + i) % 13}", float(i % 17) + 0.5
                producer.send("orders", key=customer, value=json.dumps({"customer": customer, "amount": amount}))
                if txn != 4:
                    n, total = expected.get(customer, (0, 0.0))
                    expected[customer] = (n + 1, total + amount)
            if txn == 4:
                producer.abort_transaction()  # these orders must not be counted
            else:
                producer.commit_transaction()
        producer.close()

        spark = (
            SparkSession.builder.master("local[2]")
            .appName("order-totals-demo")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "3")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("WARN")
        sluice.spark.register(spark)
        run(spark, bootstrap, "orders", "order-totals")
        spark.stop()

        consumer = Consumer(bootstrap_servers=bootstrap)  # read_committed
        consumer.assign([TopicPartition("order-totals", p) for p in range(3)])
        got: dict[str, tuple[int, float]] = {}
        for _ in range(50):
            for record in consumer.poll(timeout=0.5):
                row = json.loads(record.value or b"{}")
                if row["customer"] in got:
                    raise SystemExit(f"customer {row['customer']} written twice")
                got[row["customer"]] = (row["orders"], row["total"])
            if len(got) == len(expected):
                break
        consumer.close()
    want = {c: (n, round(t, 2)) for c, (n, t) in expected.items()}
    for customer in sorted(got):
        print(f"{customer}: {got[customer][0]} orders, total {got[customer][1]}")
    if got != want:
        raise SystemExit(f"the totals differ from what was committed: {got} != {want}")
    print(f"ok: {len(got)} customers, every committed order counted once, the aborted ones not at all")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description="Order totals per customer, from one Sluice topic to another.")
    ap.add_argument("--bootstrap-servers", help="host:port[,host:port...] of the Sluice brokers")
    ap.add_argument("--input", default="orders")
    ap.add_argument("--output", default="order-totals")
    ap.add_argument("--demo", action="store_true", help="run locally against a LocalCluster with sample data")
    args = ap.parse_args()
    if args.demo:
        return demo()
    if not args.bootstrap_servers:
        ap.error("--bootstrap-servers is required (or --demo)")
    spark = SparkSession.builder.appName("order-totals").getOrCreate()
    sluice.spark.register(spark)
    run(spark, args.bootstrap_servers, args.input, args.output)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
