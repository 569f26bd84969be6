"""The PySpark data source "sluice": batch and streaming reads (and the writers, from sluice.spark.writer).

Spark's Python Data Source API (PySpark 4) splits a read into a driver part
and an executor part:

* :class:`SluiceDataSource` is created from the options on the driver;
  ``schema()`` is the fixed schema of Spark's Kafka source (headers only with
  ``includeHeaders``), and a user-given schema is refused, as there.
* :class:`SluiceBatchReader` plans on the driver (``partitions()``: the offset
  ranges, see :mod:`sluice.spark.planning`) and reads on the executors
  (``read()``: one range, Arrow batches, see :mod:`sluice.spark.fetch`).
* :class:`SluiceStreamReader` is a ``DataSourceStreamReader``: Spark keeps it
  in one long-lived Python process on the driver and asks it for the
  ``initialOffset`` (from startingOffsets), then, per micro-batch, for the
  ``latestOffset`` given the previous end and a read limit
  (``maxOffsetsPerTrigger``), and for the ``partitions`` of a batch's
  ``[start, end)``. Offsets are Kafka's JSON (next offset per partition) and
  Spark checkpoints them, so a restarted query plans the same ranges again
  and continues exactly where the last committed batch ended. The latest
  offset is the last stable offset for read_committed: a batch never
  contains anything a later transaction outcome could change. Partitions
  added to a subscribed topic (or topics matching a pattern) are picked up by
  the next ``latestOffset`` and read from their beginning.
  ``Trigger.AvailableNow`` is supported (the end is fixed when the query starts).

Readers are pickled to the executors, so they hold no connection when they
are: clients are opened lazily and dropped from the pickled state.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from sluice.spark.arrow import arrow_schema
from sluice.spark.fetch import DataLossError, RangeReader
from sluice.spark.options import ReadOptions, SluiceOptionError, parse_read_options
from sluice.spark.planning import Catalog, OffsetRange, PartitionOffsets, from_json, rate_limit, split_ranges, to_json

if TYPE_CHECKING:
    from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter

__all__ = ["SluiceBatchReader", "SluiceDataSource", "SluiceStreamReader", "read_schema"]

log = logging.getLogger("sluice.spark")

HEADERS = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))


def read_schema(include_headers: bool) -> StructType:
    """The columns of a read: those of Spark's Kafka source."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        fields.append(StructField("headers", HEADERS))
    return StructType(fields)


def _check_schema(options: ReadOptions, schema: StructType) -> None:
    expected = read_schema(options.include_headers)
    if schema != expected:
        raise SluiceOptionError(
            "the sluice source has a fixed schema and does not take a user-specified one "
            f"(expected {expected.simpleString()}, got {schema.simpleString()})"
        )


def _read_range(options: ReadOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    if not isinstance(partition, OffsetRange):
        return  # Spark's placeholder partition of a read with no range at all
    with RangeReader(
        options.bootstrap_servers,
        read_committed=options.read_committed,
        fail_on_data_loss=options.fail_on_data_loss,
        poll_timeout_ms=options.poll_timeout_ms,
        fetch_max_bytes=options.fetch_max_bytes,
        schema=arrow_schema(options.include_headers),
        security=options.security,
    ) as reader:
        yield from reader.read(partition.topic, partition.partition, partition.start, partition.end)


class SluiceDataSource(DataSource):  # type: ignore[misc]
    """``spark.read.format("sluice")`` / ``readStream`` / ``write`` / ``writeStream``."""

    @classmethod
    def name(cls) -> str:
        return "sluice"

    def schema(self) -> StructType:
        include_headers = str(self.options.get("includeHeaders", "false")).strip().lower() == "true"
        return read_schema(include_headers)

    def reader(self, schema: StructType) -> DataSourceReader:
        options = parse_read_options(self.options, streaming=False)
        _check_schema(options, schema)
        return SluiceBatchReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = parse_read_options(self.options, streaming=True)
        _check_schema(options, schema)
        return SluiceStreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        # Imported here: the writer (transactions, prepared commits) is not needed to read.
        from sluice.spark.writer import SluiceBatchWriter  # type: ignore[import-not-found,unused-ignore]

        return SluiceBatchWriter(self.options, schema)  # type: ignore[no-any-return,unused-ignore]

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from sluice.spark.writer import SluiceStreamWriter  # type: ignore[import-not-found,unused-ignore]

        return SluiceStreamWriter(self.options, schema)  # type: ignore[no-any-return,unused-ignore]


class SluiceBatchReader(DataSourceReader):  # type: ignore[misc]
    """A batch read: ranges planned once on the driver, read by one task each."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        catalog = Catalog(self.options)
        try:
            ranges: list[InputPartition] = list(catalog.batch_ranges())
        finally:
            catalog.close()
        return ranges

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_range(self.options, partition)


class SluiceStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    """A streaming read: offsets per partition, micro-batches bounded by the LSO (read_committed)."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._catalog: Catalog | None = None
        self._target: PartitionOffsets | None = None  # Trigger.AvailableNow: where the query stops

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_catalog"] = None
        return state

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = Catalog(self.options)
        return self._catalog

    def initialOffset(self) -> dict[str, Any]:
        c = self.catalog
        tps = c.partitions()
        earliest = c.earliest(tps)
        latest = c.latest(tps)
        return to_json(c.resolve(self.options.starting, tps, "startingOffsets", earliest, latest))

    def _current(self) -> PartitionOffsets:
        """The latest offset of every partition of the subscription now (new partitions included)."""
        c = self.catalog
        return c.latest(c.partitions())

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadMaxRows(limit) if limit is not None else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._current()

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return to_json(self._current())

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = from_json(start)
        latest = self._current()
        if self._target is not None:
            latest = {tp: min(off, self._target[tp]) for tp, off in latest.items() if tp in self._target}
        gone = sorted(tp for tp in begin if tp not in latest and (self._target is None or tp not in self._target))
        if gone:
            self._data_loss(f"partitions {', '.join(map(str, gone))} no longer exist")
        # A new partition (not in ``begin``) is read from its beginning: earliest is its start.
        new = [tp for tp in latest if tp not in begin]
        known = dict(begin)
        known.update(self.catalog.earliest(new))
        end: PartitionOffsets = {}
        for tp, off in latest.items():
            if off < known[tp]:
                self._data_loss(f"{tp} ends at {off}, before offset {known[tp]} that was already read")
                off = known[tp]
            end[tp] = off
        if isinstance(limit, ReadMaxRows):
            end = rate_limit(known, end, limit.max_rows)
        # keep partitions that disappeared (failOnDataLoss=false) at their last offset
        for tp, off in begin.items():
            end.setdefault(tp, off)
        return to_json(end)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        begin = from_json(start)
        stop = from_json(end)
        new = [tp for tp in stop if tp not in begin]
        first = dict(begin)
        if new:
            first.update(self.catalog.earliest(new))
        ranges = [
            OffsetRange(tp.topic, tp.partition, first[tp], stop[tp]) for tp in sorted(stop) if stop[tp] > first[tp]
        ]
        out: list[InputPartition] = list(
            split_ranges(ranges, self.options.min_partitions, self.options.max_records_per_partition)
        )
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_range(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the offsets live in Spark's checkpoint (no group offsets are committed)."""

    def stop(self) -> None:
        if self._catalog is not None:
            self._catalog.close()
            self._catalog = None

    def _data_loss(self, message: str) -> None:
        if self.options.fail_on_data_loss:
            raise DataLossError(
                f"{self.options.describe_subscription()}: {message}. Set failOnDataLoss=false to go on."
            )
        log.warning("%s (failOnDataLoss=false: going on)", message)
