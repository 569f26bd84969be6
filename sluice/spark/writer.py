"""The write side of the "sluice" Spark data source: exactly once, through prepared transactions.

``df.write.format("sluice")`` and ``df.writeStream.format("sluice")`` take the
columns of Spark's Kafka sink (``value`` required; ``key``, ``topic``,
``partition``, ``headers`` optional; the ``topic`` option when there is no
topic column). Spark's own Kafka sink is at least once; this one is exactly
once, with two-phase commit over Sluice's prepared transactions (the idea of
Kafka's KIP-939; see ``broker/sluice_broker/txn/state.py``):

1. Every task writes its rows inside one transaction whose transactional id
   is derived from the write and the Spark partition, never from the attempt:
   ``{prefix}-{job}-{partition}``. ``job`` is a fresh uuid per batch write
   (made on the driver when Spark asks for the writer), or
   ``{queryId}-{batchId}`` for a streaming micro-batch (the query id survives
   restarts from a checkpoint, so a replayed batch gets the same ids).
2. The task does not commit: it PREPARES the transaction and returns its
   handle (id, producer id, epoch) in its commit message. The coordinator
   then keeps it whatever the transaction timeout.
3. The driver's ``commit()`` commits the handles of the messages Spark hands
   it; ``abort()`` aborts them and then every other transaction of the job
   (see :func:`abort_job`), so a failed job leaves nothing visible and
   nothing open that would hold back the LSO of the partitions it wrote.
   Spark also calls ``abort()`` when ``commit()`` failed part-way; once one
   transaction of the job is committed the decision was commit, and
   ``abort()`` commits the rest instead (two-phase commit never reverses a
   decision; the job is then reported failed with all its rows visible).

Why one transactional id per partition and not per attempt: every attempt of
a partition (a retry, a speculative copy) initializes the same id, and the
coordinator makes them take turns:

* the previous attempt is still writing (Ongoing): the new attempt's
  InitProducerId aborts that transaction and fences its producer, so the
  older attempt fails at its next request and can never prepare;
* the previous attempt already prepared: ``keep_prepared_txn`` hands the new
  attempt that transaction's handle, and it returns it without writing a
  row. Both attempts answer with the same handle, so whichever of them Spark
  lets commit, exactly one copy is committed;
* the transaction of the partition is already committed (a streaming batch
  replayed after the driver crashed between committing to Sluice and
  recording the batch in its checkpoint, or a straggler started after the
  driver committed): the task writes nothing. The committed batch is
  recorded where a restart finds it: in ``__transaction_state`` itself, as
  the CompleteCommit state of the batch's transactional ids.

That relies on what Spark guarantees for exactly-once sinks: a replayed
streaming batch has the same rows in the same partition ids (a deterministic
query). Transactional ids are kept by the coordinator until
``transactional.id.expiration.ms`` (7 days by default) after their last use,
which bounds how late a replay is recognized.

Test-only option ``sluice.test.failTask``: ``afterPrepare`` makes the first
attempt of every task fail right after it prepared, ``midWrite`` after it
wrote its first rows, ``both`` the one in even and the other in odd
partitions (the fault tests of tests/spark/). Test-only options
``sluice.test.hangAfterCommit`` (a batch id) and ``sluice.test.hangMarker``
(a file path) make the driver's streaming commit of that batch create the
file once the batch is committed to Sluice and then wait, so a test can
kill the driver exactly between the two commits.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamWriter, WriterCommitMessage
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

from sluice import errors
from sluice.client import Admin, PreparedTransaction, Producer
from sluice.spark.security import (
    PLAINTEXT,
    SECURITY_OPTIONS,
    SecurityOptions,
    is_security_option,
    parse_security_options,
)

_StreamBase: type[Any]
try:  # PySpark 4.1+: the streaming writer can take Arrow batches too
    from pyspark.sql.datasource import DataSourceStreamArrowWriter

    _StreamBase = DataSourceStreamArrowWriter
except ImportError:  # pragma: no cover - PySpark 4.0
    _StreamBase = DataSourceStreamWriter

log = logging.getLogger("sluice.spark.writer")

__all__ = [
    "SluiceBatchWriter",
    "SluiceCommitMessage",
    "SluiceStreamWriter",
    "SluiceWriteOptionError",
    "WriteOptions",
    "abort_job",
    "commit_handles",
    "parse_write_options",
]

DEFAULT_PREFIX = "sluice-spark"
DEFAULT_TRANSACTION_TIMEOUT_MS = 300_000
COMMITTED_STATES = ("PrepareCommit", "CompleteCommit")
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
FAIL_TASK_MODES = ("afterPrepare", "midWrite", "both")
MID_WRITE_ROWS = 10  # rows a "midWrite" test failure writes first


class SluiceWriteOptionError(ValueError):
    """A write option or an input column that the sink cannot use (raised before anything is written)."""


class InjectedTaskFailure(RuntimeError):
    """The failure ``sluice.test.failTask`` asked for."""


@dataclass(frozen=True, slots=True)
class WriteOptions:
    bootstrap_servers: str
    topic: str | None
    transactional_id_prefix: str
    transaction_timeout_ms: int
    linger_ms: float
    batch_size: int
    compression: str | None
    request_timeout_ms: int
    fail_task: str | None
    hang_after_commit: int | None
    hang_marker: str | None
    security: SecurityOptions = PLAINTEXT  # security.protocol, ssl.*.location (sluice.spark.security)


# option (lower case) -> documented spelling; Kafka's "kafka."-prefixed names are accepted too
_KNOWN = {
    n.lower(): n
    for n in (
        "bootstrap.servers",
        "topic",
        "transactionalIdPrefix",
        "transaction.timeout.ms",
        "linger.ms",
        "batch.size",
        "compression.type",
        "request.timeout.ms",
        "sluice.test.failTask",
        "sluice.test.hangAfterCommit",
        "sluice.test.hangMarker",
        # read options a user may leave on a shared options map; ignored by the writer
        "includeHeaders",
        "checkpointLocation",
        "path",
        *SECURITY_OPTIONS,
    )
}


def _int(opts: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SluiceWriteOptionError(f"option {name!r} must be an integer, not {raw!r}") from None
    if value < minimum:
        raise SluiceWriteOptionError(f"option {name!r} must be >= {minimum}, not {value}")
    return value


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    """The writer's options, checked; an unknown option or a bad value is a SluiceWriteOptionError."""
    opts: dict[str, str] = {}
    for key, value in options.items():
        k = key.lower()
        if k.startswith("kafka."):
            k = k[len("kafka.") :]
        if k not in _KNOWN and not is_security_option(k):
            raise SluiceWriteOptionError(
                f"unknown write option {key!r}; the sluice sink takes: {', '.join(sorted(_KNOWN.values()))}"
            )
        opts[k] = str(value)
    bootstrap = opts.get("bootstrap.servers", "").strip()
    if not bootstrap:
        raise SluiceWriteOptionError("option 'bootstrap.servers' is required (host:port[,host:port...])")
    prefix = opts.get("transactionalidprefix", DEFAULT_PREFIX)
    if not prefix or any(c.isspace() for c in prefix):
        raise SluiceWriteOptionError(f"option 'transactionalIdPrefix' must be a non-empty word, not {prefix!r}")
    fail = opts.get("sluice.test.failtask")
    if fail is not None and fail not in FAIL_TASK_MODES:
        raise SluiceWriteOptionError(f"option 'sluice.test.failTask' must be one of {FAIL_TASK_MODES}, not {fail!r}")
    compression = opts.get("compression.type")
    if compression in ("none", ""):
        compression = None
    if compression is not None and compression not in ("gzip", "snappy", "lz4", "zstd"):
        raise SluiceWriteOptionError(
            f"option 'compression.type' must be none, gzip, snappy, lz4 or zstd, not {compression!r}"
        )
    hang = opts.get("sluice.test.hangaftercommit")
    return WriteOptions(
        bootstrap_servers=bootstrap,
        topic=opts.get("topic") or None,
        transactional_id_prefix=prefix,
        transaction_timeout_ms=_int(opts, "transaction.timeout.ms", DEFAULT_TRANSACTION_TIMEOUT_MS, 1),
        linger_ms=_int(opts, "linger.ms", 5, 0),
        batch_size=_int(opts, "batch.size", 262_144, 1),
        compression=compression,
        request_timeout_ms=_int(opts, "request.timeout.ms", 30_000, 1),
        fail_task=fail,
        hang_after_commit=_int(opts, "sluice.test.hangAfterCommit", 0, 0) if hang is not None else None,
        hang_marker=opts.get("sluice.test.hangmarker"),
        security=parse_security_options(opts, SluiceWriteOptionError),
    )


# -- the input columns -----------------------------------------------------------------------------

_BYTES_OR_TEXT = (BinaryType, StringType)
_INTEGERS = (IntegerType, LongType, ShortType)


def _is_headers_type(t: DataType) -> bool:
    if not isinstance(t, ArrayType) or not isinstance(t.elementType, StructType):
        return False
    fields = {f.name: f.dataType for f in t.elementType.fields}
    return (
        set(fields) == {"key", "value"}
        and isinstance(fields["key"], StringType)
        and isinstance(fields["value"], _BYTES_OR_TEXT)
    )


def check_schema(schema: StructType, options: WriteOptions) -> list[str]:
    """The column names in the order (topic, key, value, partition, headers) the writer reads; None-safe.

    Raises SluiceWriteOptionError for a missing value column, a column of a
    type the sink cannot write, or no topic at all. Other columns are an
    error too, as in Spark's Kafka sink.
    """
    by_name = {f.name.lower(): f for f in schema.fields}
    allowed = {"topic", "key", "value", "partition", "headers"}
    extra = sorted(set(by_name) - allowed)
    if extra:
        raise SluiceWriteOptionError(
            f"the sluice sink writes the columns topic, key, value, partition, headers; not {', '.join(extra)}"
        )
    if "value" not in by_name:
        raise SluiceWriteOptionError("the sluice sink needs a 'value' column (binary or string)")
    for name in ("key", "value", "topic"):
        f = by_name.get(name)
        ok = (StringType,) if name == "topic" else _BYTES_OR_TEXT
        if f is not None and not isinstance(f.dataType, ok):
            wanted = " or ".join(t.typeName() for t in ok)
            raise SluiceWriteOptionError(f"column {name!r} must be {wanted}, not {f.dataType.simpleString()}")
    if "partition" in by_name and not isinstance(by_name["partition"].dataType, _INTEGERS):
        got = by_name["partition"].dataType.simpleString()
        raise SluiceWriteOptionError(f"column 'partition' must be an integer, not {got}")
    if "headers" in by_name and not _is_headers_type(by_name["headers"].dataType):
        raise SluiceWriteOptionError(
            "column 'headers' must be array<struct<key:string,value:binary>>, not "
            f"{by_name['headers'].dataType.simpleString()}"
        )
    if "topic" not in by_name and options.topic is None:
        raise SluiceWriteOptionError("no topic: give the 'topic' option or a 'topic' column")
    return [f.name for f in schema.fields]


Record = tuple[str, Any, Any, int | None, list[tuple[str, Any]] | None]
ROWS_PER_CHUNK = 4096  # Spark Rows (not Arrow batches) are turned into columns this many at a time


def _arrow_values(column: Any, as_bytes: bool) -> list[Any]:
    """A column as Python values; with ``as_bytes``, text as UTF-8 bytes cast by Arrow (no encode per row)."""
    import pyarrow as pa

    if as_bytes and (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        column = column.cast(pa.binary())
    values: list[Any] = column.to_pylist()
    return values


def _records(iterator: Iterable[Any], columns: list[str], default_topic: str | None) -> Iterator[Record]:
    """(topic, key, value, partition, headers) per input row, from Arrow batches or Spark Rows."""
    lower = [c.lower() for c in columns]
    idx = {n: lower.index(n) if n in lower else -1 for n in ("topic", "key", "value", "partition", "headers")}

    def make(values: list[list[Any]], n: int) -> Iterator[Record]:
        none = [None] * n

        def col(name: str) -> list[Any]:
            i = idx[name]
            return values[i] if i >= 0 else none

        topics, keys, vals, parts, hdrs = col("topic"), col("key"), col("value"), col("partition"), col("headers")
        for j in range(n):
            topic = topics[j] if topics[j] is not None else default_topic
            if topic is None:
                raise SluiceWriteOptionError("a row has a null topic and there is no 'topic' option")
            h = hdrs[j]
            headers = None
            if h:
                headers = [(x["key"], x["value"]) if isinstance(x, dict) else (x[0], x[1]) for x in h]
            yield topic, keys[j], vals[j], parts[j], headers

    for values, n in _column_chunks(iterator, lower):
        yield from make(values, n)


def _column_chunks(iterator: Iterable[Any], lower: list[str]) -> Iterator[tuple[list[list[Any]], int]]:
    """The input as columns of Python values (key and value as bytes), and how many rows: an Arrow
    batch at a time, or ROWS_PER_CHUNK Spark Rows at a time."""
    rows: list[Any] = []
    for item in iterator:
        if hasattr(item, "num_rows") and hasattr(item, "column"):  # a pyarrow.RecordBatch
            values = [_arrow_values(item.column(i), name in ("key", "value")) for i, name in enumerate(lower)]
            yield values, item.num_rows
        else:
            rows.append(item)
            if len(rows) >= ROWS_PER_CHUNK:
                yield [list(c) for c in zip(*rows, strict=True)], len(rows)
                rows = []
    if rows:
        yield [list(c) for c in zip(*rows, strict=True)], len(rows)


def _send_values(producer: Producer, topic: str, rows: Iterable[Any]) -> int:
    """Rows of a value column only (Arrow batches, or Spark Rows) sent with ``send_many``: no
    per-row Python in the writer or in the producer's send. The number of rows."""
    count = 0
    for (values,), n in _column_chunks(rows, ["value"]):
        producer.send_many(topic, values)
        count += n
    return count


# -- the commit message ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SluiceCommitMessage(WriterCommitMessage):  # type: ignore[misc]
    """What a task tells the driver: the handle of its prepared transaction.

    ``handle`` is None when the partition's transaction was committed before
    (a replayed streaming batch): there is nothing left to commit.
    """

    job: str
    transactional_id: str
    partition_id: int
    attempt: int
    handle: PreparedTransaction | None
    records: int
    adopted: bool = False  # the handle is a prepared transaction of an earlier attempt


def _client(options: WriteOptions) -> dict[str, Any]:
    """The servers and TLS settings every client of the sink connects with."""
    return {"bootstrap_servers": options.bootstrap_servers, **options.security.client_kwargs()}


def transactional_id(prefix: str, job: str, partition_id: int) -> str:
    return f"{prefix}-{job}-{partition_id}"


def job_prefix(prefix: str, job: str) -> str:
    """Every transactional id of one job starts with this (the trailing dash keeps job 1 apart from 10)."""
    return f"{prefix}-{job}-"


# -- the task side ---------------------------------------------------------------------------------


def write_partition(
    options: WriteOptions, columns: list[str], rows: Iterable[Any], job: str, partition_id: int, attempt: int
) -> SluiceCommitMessage:
    """Write one Spark partition in its own transaction and prepare it (see the module docstring)."""
    tid = transactional_id(options.transactional_id_prefix, job, partition_id)
    admin = Admin(**_client(options), request_timeout_ms=options.request_timeout_ms)
    try:
        try:
            (described,) = admin.describe_transactions([tid])
            if described.state in COMMITTED_STATES:
                log.info("%s: already committed (a replayed batch): nothing to write", tid)
                return SluiceCommitMessage(job, tid, partition_id, attempt, None, 0)
        except errors.TransactionalIdNotFoundError:
            pass
    finally:
        admin.close()
    producer = Producer(
        **_client(options),
        transactional_id=tid,
        transaction_timeout_ms=options.transaction_timeout_ms,
        linger_ms=options.linger_ms,
        batch_size=options.batch_size,
        compression=options.compression,
        request_timeout_ms=options.request_timeout_ms,
        client_id=f"sluice-spark-{tid}-{attempt}",
    )
    try:
        kept = producer.init_transactions(keep_prepared_txn=True)
        if kept is not None:
            log.info("%s: attempt %d adopts the transaction an earlier attempt prepared", tid, attempt)
            return SluiceCommitMessage(job, tid, partition_id, attempt, kept, 0, adopted=True)
        if producer.previous_transaction_state in COMMITTED_STATES:
            # Committed between our describe and our init (the driver finished meanwhile).
            return SluiceCommitMessage(job, tid, partition_id, attempt, None, 0)
        fail = options.fail_task if attempt == 0 else None
        if fail == "both":
            fail = "midWrite" if partition_id % 2 == 0 else "afterPrepare"
        producer.begin_transaction()
        if fail != "midWrite" and options.topic is not None and [c.lower() for c in columns] == ["value"]:
            count = _send_values(producer, options.topic, rows)  # values only: in bulk
        else:
            send = producer.send
            count = 0
            for topic, key, value, partition, headers in _records(rows, columns, options.topic):
                send(topic, value=value, key=key, partition=partition, headers=headers)
                count += 1
                if fail == "midWrite" and count == MID_WRITE_ROWS:
                    producer.flush()
                    raise InjectedTaskFailure(
                        f"sluice.test.failTask=midWrite: {tid} attempt 0 fails after {count} rows"
                    )
        handle = producer.prepare_transaction()
        if fail == "afterPrepare":
            raise InjectedTaskFailure(f"sluice.test.failTask=afterPrepare: {tid} attempt 0 fails after preparing")
        return SluiceCommitMessage(job, tid, partition_id, attempt, handle, count)
    finally:
        producer.close()


def _task_identity() -> tuple[int, int, Any]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        raise RuntimeError("the sluice writer runs inside Spark tasks only (no TaskContext)")
    return ctx.partitionId(), ctx.attemptNumber(), ctx


# -- the driver side -------------------------------------------------------------------------------


def commit_handles(options: WriteOptions, handles: list[PreparedTransaction], parallelism: int = 8) -> None:
    """Commit prepared transactions (a retried commit of a committed one is fine)."""
    if not handles:
        return
    admin = Admin(**_client(options), request_timeout_ms=options.request_timeout_ms)
    try:
        with ThreadPoolExecutor(max_workers=min(parallelism, len(handles))) as pool:
            for _ in pool.map(lambda h: admin.commit_prepared_transaction(h, timeout=120), handles):
                pass
    finally:
        admin.close()


def abort_job(options: WriteOptions, job: str, handles: list[PreparedTransaction]) -> list[str]:
    """Abort the handles, then every other unfinished transaction of the job; the ids touched.

    The sweep finds the job's transactional ids by prefix on every broker
    (ListTransactions). A Prepared one (an attempt that prepared but whose
    message never reached the driver) is aborted with its listed handle;
    an Ongoing or idle one is fenced with an InitProducerId that aborts what
    is open, so an attempt still running cannot prepare later. Ids whose
    transaction ended (aborted, or committed) are left alone (a streaming batch partly committed
    before a crash: its replay skips them).
    """
    admin = Admin(**_client(options), request_timeout_ms=options.request_timeout_ms)
    touched: list[str] = []
    try:
        for h in handles:
            try:
                admin.abort_prepared_transaction(h, timeout=60)
                touched.append(h.transactional_id)
            except errors.InvalidTxnStateError as exc:
                log.warning("%s: not aborted: %s", h.transactional_id, exc)
        start = job_prefix(options.transactional_id_prefix, job)
        for t in admin.list_transactions(timeout=60):
            if not t.transactional_id.startswith(start) or t.state in (*COMMITTED_STATES, "CompleteAbort"):
                continue
            if t.state == "Prepared":
                try:
                    admin.abort_prepared_transaction(t.handle, timeout=60)
                    touched.append(t.transactional_id)
                    continue
                except (errors.InvalidTxnStateError, errors.ProducerFencedError) as exc:
                    log.info("%s changed while aborting (%s): fencing it", t.transactional_id, exc)
            fence = Producer(
                **_client(options),
                transactional_id=t.transactional_id,
                transaction_timeout_ms=options.transaction_timeout_ms,
            )
            try:
                fence.init_transactions(abort_prepared_txn=True, timeout=60)
                touched.append(t.transactional_id)
            finally:
                fence.close()
    finally:
        admin.close()
    return touched


def committed_any(options: WriteOptions, handles: list[PreparedTransaction]) -> bool:
    """Did the commit of any of these prepared transactions begin (PrepareCommit or CompleteCommit)?"""
    if not handles:
        return False
    with Admin(**_client(options), request_timeout_ms=options.request_timeout_ms) as admin:
        for h in handles:
            try:
                (d,) = admin.describe_transactions([h.transactional_id], timeout=60)
            except errors.TransactionalIdNotFoundError:
                continue
            if d.state in COMMITTED_STATES and (d.producer_id, d.producer_epoch) == (h.producer_id, h.producer_epoch):
                return True
    return False


def _handles(messages: Iterable[Any]) -> list[PreparedTransaction]:
    out: dict[str, PreparedTransaction] = {}
    for m in messages:
        if isinstance(m, SluiceCommitMessage) and m.handle is not None:
            out[m.handle.transactional_id] = m.handle
    return sorted(out.values())


class SluiceBatchWriter(DataSourceArrowWriter):  # type: ignore[misc]
    """``df.write.format("sluice")``: one prepared transaction per task, committed by the driver."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.options = parse_write_options(options)
        self.columns = check_schema(schema, self.options)
        self.job = uuid.uuid4().hex  # made once on the driver; tasks and commit() see the same one

    def write(self, iterator: Iterator[Any]) -> SluiceCommitMessage:
        partition_id, attempt, _ = _task_identity()
        return write_partition(self.options, self.columns, iterator, self.job, partition_id, attempt)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        handles = _handles(messages)
        commit_handles(self.options, handles)
        log.info("job %s committed: %d prepared transaction(s)", self.job, len(handles))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        handles = _handles(messages)
        if committed_any(self.options, handles):
            # Spark aborts after a commit() that failed part-way. A transaction of the job is
            # committed already, so the decision was commit: finish it (two-phase commit never
            # goes back on a decision), rather than leave the job half visible.
            log.error("job %s: abort after a partial commit: committing the rest of its transactions", self.job)
            commit_handles(self.options, handles)
            return
        touched = abort_job(self.options, self.job, handles)
        log.warning("job %s aborted: %d transaction(s) aborted or fenced", self.job, len(touched))


class SluiceStreamWriter(_StreamBase):  # type: ignore[misc,valid-type]
    """``df.writeStream.format("sluice")``: each micro-batch exactly once, replays included.

    The job of a micro-batch is ``{queryId}-{batchId}``, read in the tasks
    from the local properties Spark sets for streaming jobs, and in
    commit()/abort() from Spark's batch id and the query id the tasks put in
    their messages' transactional ids.
    """

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.options = parse_write_options(options)
        self.columns = check_schema(schema, self.options)

    def write(self, iterator: Iterator[Any]) -> SluiceCommitMessage:
        partition_id, attempt, ctx = _task_identity()
        query_id = ctx.getLocalProperty(QUERY_ID_PROPERTY)
        batch_id = ctx.getLocalProperty(BATCH_ID_PROPERTY)
        if not query_id or batch_id is None:
            raise RuntimeError(
                f"the streaming sluice writer needs Spark's {QUERY_ID_PROPERTY} and {BATCH_ID_PROPERTY} task properties"
            )
        job = f"{query_id}-{batch_id}"
        return write_partition(self.options, self.columns, iterator, job, partition_id, attempt)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        handles = _handles(messages)
        commit_handles(self.options, handles)
        log.info("micro-batch %d committed: %d prepared transaction(s)", batchId, len(handles))
        if self.options.hang_after_commit == batchId and self.options.hang_marker:
            with open(self.options.hang_marker, "w") as f:
                f.write(str(batchId))
            time.sleep(3600)  # the test kills the driver here

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # The job (query id and batch id) is known from the messages of the tasks that finished.
        # With none, there is nothing prepared to abort: transactions of failed tasks are open (the
        # timeout aborts them) or prepared (a restart replays the batch and adopts them).
        jobs = sorted({m.job for m in messages if isinstance(m, SluiceCommitMessage)})
        handles = _handles(messages)
        for job in jobs:
            start = job_prefix(self.options.transactional_id_prefix, job)
            abort_job(self.options, job, [h for h in handles if h.transactional_id.startswith(start)])
        log.warning("micro-batch %d aborted (%d job(s) swept)", batchId, len(jobs))
