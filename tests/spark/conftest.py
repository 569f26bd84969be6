"""Fixtures of the Spark tests: one SparkSession (local[2]) per test session, real broker processes.

* ``spark``: a SparkSession in local mode with two cores and the "sluice" data
  source registered (``sluice.spark.register``), shared by every Spark test:
  starting the JVM costs seconds. Python workers run this interpreter (so
  they import this tree's ``sluice``), shuffles use 2 partitions, no UI.
  Spark's own Kafka connector (spark-sql-kafka-0-10 for this pyspark, fetched
  once from Maven Central: tests/support/spark_kafka, which says which version)
  is on ``spark.jars`` for test_kafka_connector.py; a session's jars are fixed
  when it starts.
* ``cluster``, ``fresh_cluster``, ``unique_topic``: the integration tests'
  fixtures (:mod:`tests.integration.conftest`): a shared single-broker
  :class:`~sluice.testing.LocalCluster` brought back to health before each
  test, clusters of a test's own, and topic names no other test uses; broker
  logs are attached to failing tests' reports.
* ``produce``: writes records to a topic, committed or in a transaction left
  to the caller, and returns what was written.

Both the read tests (test_read*.py) and the write tests (test_write*.py) use them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

import sluice.spark
from tests.integration.conftest import (  # noqa: F401  (fixtures and the report hook, shared)
    _session_cluster,
    cluster,
    fresh_cluster,
    pytest_runtest_makereport,
    unique_topic,
)
from tests.support.spark_kafka import connector_jars


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """The session's SparkSession: local[2], the sluice source registered."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    warehouse: Path = tmp_path_factory.mktemp("spark-warehouse")
    session = (
        SparkSession.builder.master("local[2]")
        .appName("sluice-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.warehouse.dir", str(warehouse))
        .config("spark.pyspark.python", sys.executable)
        .config("spark.driver.memory", "2g")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .config("spark.jars", ",".join(str(j) for j in connector_jars()))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("WARN")
    sluice.spark.register(session)
    try:
        yield session
    finally:
        session.stop()
