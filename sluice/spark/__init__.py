"""Sluice for Apache Spark: the PySpark data source "sluice" (PySpark 4, Python Data Source API).

::

    from pyspark.sql import SparkSession
    import sluice.spark

    spark = SparkSession.builder.getOrCreate()
    sluice.spark.register(spark)

    orders = (spark.read.format("sluice")
              .option("bootstrap.servers", "sluice:9092")
              .option("subscribe", "orders")
              .load())                      # key, value, topic, partition, offset, timestamp, timestampType

Reads (batch and streaming) take the options of Spark's Kafka source plus
``isolationLevel`` (read_committed by default); see docs/spark.md.
Modules: ``source`` (the data source and its readers), ``options``,
``planning`` (partitions, offsets, task ranges), ``fetch`` (a task's gRPC
reads), ``arrow`` (wire batches to Arrow), ``writer`` (exactly-once writes).

Installing: the ``spark`` extra of the ``sluice-broker`` distribution (pyspark, pyarrow, numpy):
``pip install -e '.[spark]'`` in a clone, or a wheel's ``[spark]`` (docs/spark.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sluice.spark.source import SluiceDataSource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["SluiceDataSource", "register"]


def register(spark: SparkSession) -> None:
    """Make ``format("sluice")`` known to ``spark`` (once per session; again is harmless)."""
    spark.dataSource.register(SluiceDataSource)
