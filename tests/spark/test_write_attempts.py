"""Several attempts of one Spark partition, through the sink's task code, against real brokers.

Spark runs speculative copies of a task only on a cluster (a local master has
no speculation scheduler), so these tests play the attempts themselves:
``write_partition`` is exactly what a task of SluiceBatchWriter runs, given
the partition id and attempt number Spark's TaskContext would give it. What
Spark adds on top (its commit coordinator lets one attempt per partition
report) is modelled by committing the message of one attempt only.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from sluice import errors
from sluice.client import Admin
from sluice.spark.writer import (
    SluiceCommitMessage,
    abort_job,
    commit_handles,
    parse_write_options,
    write_partition,
)
from sluice.testing import LocalCluster, unique_topic_name

from .write_helpers import read_values, unfinished

COLUMNS = ["key", "value"]


@pytest.fixture
def sluice_cluster(cluster: LocalCluster) -> LocalCluster:
    """The Spark tests' shared single-broker cluster (tests/spark/conftest.py)."""
    return cluster


def rows(n: int, tag: str = "") -> list[tuple[str, str]]:
    return [(str(i), f"{tag}{i}") for i in range(n)]


def setup(cluster: LocalCluster, name: str) -> tuple[str, Any]:
    topic = unique_topic_name(name)
    with Admin(bootstrap_servers=cluster.bootstrap_servers) as admin:
        admin.create_topic(topic, partitions=2, replication_factor=1)
    options = parse_write_options(
        {"bootstrap.servers": cluster.bootstrap_servers, "topic": topic, "transactionalIdPrefix": name}
    )
    return topic, options


def test_a_later_attempt_adopts_what_an_earlier_one_prepared(sluice_cluster: LocalCluster) -> None:
    bootstrap = sluice_cluster.bootstrap_servers
    topic, options = setup(sluice_cluster, "adopt")
    first = write_partition(options, COLUMNS, rows(500), "job1", 0, attempt=0)
    assert first.handle is not None and first.records == 500 and not first.adopted
    # A speculative copy (or a retry after the first attempt's message was lost) writes nothing
    # and answers the same handle: whichever message Spark keeps, one copy gets committed.
    second = write_partition(options, COLUMNS, rows(500), "job1", 0, attempt=1)
    assert second.adopted and second.handle == first.handle and second.records == 0
    assert sum(read_values(bootstrap, topic, "read_uncommitted").values()) == 500
    commit_handles(options, [second.handle])  # type: ignore[list-item]
    commit_handles(options, [first.handle])  # the same transaction: a repeated commit is fine
    assert read_values(bootstrap, topic) == Counter({str(i).encode(): 1 for i in range(500)})
    # A straggler that starts after the driver committed writes nothing at all.
    late = write_partition(options, COLUMNS, rows(500), "job1", 0, attempt=2)
    assert late.handle is None and late.records == 0
    assert sum(read_values(bootstrap, topic, "read_uncommitted").values()) == 500
    assert unfinished(bootstrap, "adopt-") == []


def test_two_attempts_writing_at_once_leave_one_copy(sluice_cluster: LocalCluster) -> None:
    """Attempt 0 is half-way through its rows when attempt 1 starts: attempt 1 fences it."""
    bootstrap = sluice_cluster.bootstrap_servers
    topic, options = setup(sluice_cluster, "race")
    started, resume = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def gated(items: list[tuple[str, str]]) -> Iterator[tuple[str, str]]:
        for i, item in enumerate(items):
            if i == 200:
                started.set()
                resume.wait(60)
            yield item

    def attempt0() -> None:
        try:
            outcome["message"] = write_partition(options, COLUMNS, gated(rows(400, "a0-")), "job2", 1, attempt=0)
        except Exception as exc:
            outcome["error"] = exc

    t = threading.Thread(target=attempt0)
    t.start()
    assert started.wait(60)
    winner: SluiceCommitMessage = write_partition(options, COLUMNS, rows(400, "a1-"), "job2", 1, attempt=1)
    resume.set()
    t.join(120)
    assert not t.is_alive()
    assert "message" not in outcome, "the fenced attempt must not prepare"
    assert isinstance(outcome["error"], errors.ProducerFencedError | errors.InvalidProducerEpochError)
    assert winner.handle is not None and winner.records == 400
    commit_handles(options, [winner.handle])
    assert read_values(bootstrap, topic) == Counter({f"a1-{i}".encode(): 1 for i in range(400)})
    assert unfinished(bootstrap, "race-") == []


def test_abort_sweeps_prepared_and_open_transactions_of_the_job(sluice_cluster: LocalCluster) -> None:
    """A failed job: one task prepared but its message never reached the driver, another is still writing."""
    bootstrap = sluice_cluster.bootstrap_servers
    topic, options = setup(sluice_cluster, "sweep")
    lost = write_partition(options, COLUMNS, rows(100, "p0-"), "job3", 0, attempt=0)
    assert lost.handle is not None
    started, resume = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def gated() -> Iterator[tuple[str, str]]:
        for i, item in enumerate(rows(100, "p1-")):
            if i == 50:
                started.set()
                resume.wait(60)
            yield item

    def zombie() -> None:
        try:
            outcome["message"] = write_partition(options, COLUMNS, gated(), "job3", 1, attempt=0)
        except Exception as exc:
            outcome["error"] = exc

    t = threading.Thread(target=zombie)
    t.start()
    assert started.wait(60)
    touched = abort_job(options, "job3", [])
    assert sorted(touched) == ["sweep-job3-0", "sweep-job3-1"]
    resume.set()
    t.join(120)
    assert isinstance(outcome.get("error"), errors.ProducerFencedError | errors.InvalidProducerEpochError)
    assert read_values(bootstrap, topic) == Counter()
    assert unfinished(bootstrap, "sweep-") == []
    # The sweep of one job never touches another job of the same prefix.
    other = write_partition(options, COLUMNS, rows(10, "j4-"), "job31", 0, attempt=0)
    assert not [t for t in abort_job(options, "job3", []) if "job31" in t]
    assert other.handle is not None
    commit_handles(options, [other.handle])
    assert read_values(bootstrap, topic) == Counter({f"j4-{i}".encode(): 1 for i in range(10)})


def test_bad_options_and_columns_are_refused_before_writing() -> None:
    from pyspark.sql.types import BinaryType, IntegerType, StringType, StructField, StructType

    from sluice.spark.writer import SluiceWriteOptionError, check_schema

    with pytest.raises(SluiceWriteOptionError, match=r"bootstrap\.servers"):
        parse_write_options({"topic": "t"})
    with pytest.raises(SluiceWriteOptionError, match="unknown write option 'topc'"):
        parse_write_options({"bootstrap.servers": "h:1", "topc": "t"})
    with pytest.raises(SluiceWriteOptionError, match=r"compression\.type"):
        parse_write_options({"bootstrap.servers": "h:1", "compression.type": "brotli"})
    ok = parse_write_options({"kafka.bootstrap.servers": "h:1", "kafka.linger.ms": "20"})
    assert (ok.bootstrap_servers, ok.linger_ms, ok.topic) == ("h:1", 20, None)
    value = StructField("value", BinaryType())
    with pytest.raises(SluiceWriteOptionError, match="no topic"):
        check_schema(StructType([value]), ok)
    with pytest.raises(SluiceWriteOptionError, match="'value' column"):
        check_schema(StructType([StructField("key", StringType()), StructField("topic", StringType())]), ok)
    with pytest.raises(SluiceWriteOptionError, match="column 'partition' must be an integer"):
        check_schema(
            StructType([value, StructField("topic", StringType()), StructField("partition", StringType())]), ok
        )
    with pytest.raises(SluiceWriteOptionError, match="not offset"):
        check_schema(StructType([value, StructField("topic", StringType()), StructField("offset", IntegerType())]), ok)
    assert check_schema(StructType([value, StructField("topic", StringType())]), ok) == ["value", "topic"]


def test_rows_and_arrow_batches_become_the_same_records() -> None:
    import pyarrow as pa
    from pyspark.sql import Row

    from sluice.spark.writer import _records

    headers_type = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array(["a", None]),
            pa.array(["k1", None]),
            pa.array([b"v1", b"v2"]),
            pa.array([1, None], pa.int32()),
            pa.array([[{"key": "h", "value": b"x"}], None], headers_type),
        ],
        names=["topic", "key", "value", "partition", "headers"],
    )
    columns = ["topic", "key", "value", "partition", "headers"]
    expected = [("a", b"k1", b"v1", 1, [("h", b"x")]), ("dflt", None, b"v2", None, None)]
    assert list(_records([batch], columns, "dflt")) == expected
    rows = [Row("a", "k1", b"v1", 1, [Row(key="h", value=b"x")]), Row(None, None, b"v2", None, None)]
    as_rows = list(_records(rows, columns, "dflt"))
    assert as_rows == [("a", "k1", b"v1", 1, [("h", b"x")]), ("dflt", None, b"v2", None, None)]
    with pytest.raises(ValueError, match="null topic"):
        list(_records([batch], columns, None))


def test_abort_after_a_partial_commit_finishes_the_commit(sluice_cluster: LocalCluster) -> None:
    """Spark calls abort() when commit() failed part-way: the decision was commit, so it is completed."""
    from pyspark.sql.types import StringType, StructField, StructType

    from sluice.spark.writer import SluiceBatchWriter

    bootstrap = sluice_cluster.bootstrap_servers
    topic, _ = setup(sluice_cluster, "partial")
    schema = StructType([StructField("key", StringType()), StructField("value", StringType())])
    writer_options = {"bootstrap.servers": bootstrap, "topic": topic, "transactionalIdPrefix": "partial"}
    writer = SluiceBatchWriter(writer_options, schema)
    messages = [write_partition(writer.options, COLUMNS, rows(50, f"p{p}-"), writer.job, p, 0) for p in range(2)]
    first = messages[0].handle
    assert first is not None
    commit_handles(writer.options, [first])  # commit() got this far, then failed
    writer.abort(list(messages))
    expected = Counter({f"p{p}-{i}".encode(): 1 for p in range(2) for i in range(50)})
    assert read_values(bootstrap, topic) == expected
    assert unfinished(bootstrap, "partial-") == []
    # A job aborted before any commit is rolled back, as always.
    other = SluiceBatchWriter(
        {"bootstrap.servers": bootstrap, "topic": topic, "transactionalIdPrefix": "partial"}, schema
    )
    more = [write_partition(other.options, COLUMNS, rows(5, "no-"), other.job, 0, 0)]
    other.abort(list(more))
    assert read_values(bootstrap, topic) == expected
    assert unfinished(bootstrap, "partial-") == []
