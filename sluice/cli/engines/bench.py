"""The benchmark engine behind ``sluice bench`` and ``bench/run_all.py``.

Each benchmark runs against a cluster given by its bootstrap servers (or a
fresh single-broker :class:`LocalCluster` in a temporary directory), on a
fresh topic it creates and deletes, and returns a :class:`BenchResult`:
records, bytes, seconds, throughput and, where measured, latency percentiles,
with the parameters and the machine it ran on. Results are appended to a JSON
file (a list of results) so runs over time can be compared.

What is timed, so numbers mean the same thing from run to run:

* produce / transactions: from the first ``send`` until every record is
  acknowledged (``flush``, and the last ``commit_transaction``).
  Producer start-up (``init_transactions``, first metadata) is excluded.
* consume: from the first ``poll`` until the expected number of records has
  been returned. Filling the topic beforehand is not timed.
* latency: records sent at a steady rate; each record's latency is from
  ``send`` to its acknowledgement (the future completing).

Values are compressible the way real payloads are (a counter, then text from
a small alphabet), so compression results are not meaningless; they are
generated once up front so generating them is never what is measured.

A cluster is a :data:`Target`: its bootstrap servers, or the client keyword arguments
(``LocalCluster.client_config(name)``: servers and TLS files) when it runs with TLS clients;
``bench_cluster(secure=True)`` runs the fresh cluster with mutual TLS and the authorizer
(``LocalCluster(secure=True)``) and measures as its super user, so the same benchmark run
with and without it gives the cost of TLS.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import os
import platform
import random
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sluice
from sluice.cli.engines.progress import Progress
from sluice.cli.engines.target import Target, client_kwargs

if TYPE_CHECKING:
    from sluice.client import RecordMetadata

DEFAULT_RESULTS = Path("bench") / "results" / "results.json"


@dataclass
class BenchResult:
    name: str
    kind: str
    params: dict[str, Any]
    records: int = 0
    bytes: int = 0
    seconds: float = 0.0
    records_per_s: float = 0.0
    mb_per_s: float = 0.0
    latency_ms: dict[str, float] | None = None
    errors: int = 0
    error: str = ""
    notes: str = ""
    started_at: str = ""
    environment: dict[str, Any] = field(default_factory=dict)

    def finish(self, records: int, nbytes: int, seconds: float) -> BenchResult:
        self.records, self.bytes, self.seconds = records, nbytes, seconds
        self.records_per_s = records / seconds if seconds > 0 else 0.0
        self.mb_per_s = nbytes / seconds / 1e6 if seconds > 0 else 0.0
        return self

    def summary(self) -> str:
        line = (
            f"{self.name}: {self.records:,} records, {self.bytes / 1e6:,.1f} MB in {self.seconds:.2f}s: "
            f"{self.records_per_s:,.0f} records/s, {self.mb_per_s:,.2f} MB/s"
        )
        if self.latency_ms:
            lat = self.latency_ms
            line += f"; latency ms p50 {lat['p50']:.1f} p95 {lat['p95']:.1f} p99 {lat['p99']:.1f} max {lat['max']:.1f}"
        if self.errors:
            line += f"; {self.errors} errors"
        if self.error:
            line += f"; FAILED: {self.error}"
        if self.notes:
            line += f" ({self.notes})"
        return line


def environment() -> dict[str, Any]:
    # SLUICE_BENCH_COMMIT names the commit when the code measured is not the checkout in the
    # current directory (an exported tree, a patched copy).
    commit = os.environ.get("SLUICE_BENCH_COMMIT", "")
    if not commit:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            commit = subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5, check=False
            ).stdout.strip()
    load: tuple[float, ...] = ()
    with contextlib.suppress(OSError, AttributeError):
        load = tuple(round(x, 2) for x in os.getloadavg())
    return {
        "load_average": load,  # other work on the machine skews the figures: recorded to judge them
        "sluice": sluice.__version__,
        "git_commit": commit,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }


def percentiles(samples_ms: list[float]) -> dict[str, float]:
    if not samples_ms:
        return {"p50": 0.0, "p95": 0.0, "p99": 0.0, "max": 0.0, "mean": 0.0}
    s = sorted(samples_ms)

    def pick(q: float) -> float:
        return s[min(len(s) - 1, max(0, round(q * len(s)) - 1))]

    return {"p50": pick(0.50), "p95": pick(0.95), "p99": pick(0.99), "max": s[-1], "mean": sum(s) / len(s)}


def make_values(record_size: int, n: int = 64, seed: int = 7) -> list[bytes]:
    """``n`` distinct values of ``record_size`` bytes, compressible like text."""
    rnd = random.Random(seed)
    alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789 ,.:"
    return [bytes(rnd.choice(alphabet) for _ in range(record_size)) for _ in range(n)]


def append_result(path: str | os.PathLike[str], result: BenchResult | dict[str, Any]) -> Path:
    """Append to a JSON list in ``path`` (created with its directories if needed); atomic rename."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    runs: list[Any] = []
    if out.exists():
        try:
            loaded = json.loads(out.read_text())
            runs = loaded if isinstance(loaded, list) else [loaded]
        except ValueError:
            out.rename(out.with_suffix(out.suffix + ".corrupt"))
    runs.append(asdict(result) if isinstance(result, BenchResult) else result)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(runs, indent=2) + "\n")
    os.replace(tmp, out)
    return out


@contextlib.contextmanager
def bench_cluster(
    bootstrap_servers: str | None,
    *,
    brokers: int = 1,
    config: dict[str, str] | None = None,
    secure: bool = False,
    security: Mapping[str, Any] | None = None,
) -> Iterator[Target]:
    """The given cluster, or a fresh LocalCluster of ``brokers`` in a temporary directory.

    With 3 brokers, topics get LocalCluster's defaults: replication factor 3 and
    min.insync.replicas 2, so acks=all waits for a follower. ``secure``: the fresh cluster runs
    mutual TLS clients and the authorizer, and the benchmark connects as its super user.
    ``security``: the client TLS settings for the given cluster (``--command-config``).
    """
    if bootstrap_servers:
        yield {"bootstrap_servers": bootstrap_servers, **security} if security else bootstrap_servers
        return
    from sluice.testing import LocalCluster

    with LocalCluster(brokers=brokers, config=config, secure=secure) as cluster:
        yield cluster.client_config("admin") if secure else cluster.bootstrap_servers


class _Acks:
    """Counts acknowledgements and failures: ``delivered`` is send()'s ``callback`` (what Kafka's
    ProducerPerformance gives its send()), ``__call__`` a future's done-callback.

    Called once per record, so it stays cheap: each thread counts successes in
    its own cell (no lock; the producer runs callbacks on its I/O threads, or
    on the sending thread for a record refused at once), failures take a lock.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.failed = 0
        self.first_error = ""
        self._local = threading.local()
        self._cells: list[list[int]] = []

    @property
    def acked(self) -> int:
        return sum(cell[0] for cell in self._cells)

    def _cell(self) -> list[int]:
        cell = [0]
        with self.lock:
            self._cells.append(cell)
        self._local.cell = cell
        return cell

    def __call__(self, fut: Future[RecordMetadata]) -> None:
        self.delivered(None, fut.exception())

    def delivered(self, _metadata: RecordMetadata | None, exc: BaseException | None) -> None:
        if exc is None:
            try:
                self._local.cell[0] += 1
            except AttributeError:
                self._cell()[0] += 1
            return
        with self.lock:
            self.failed += 1
            if not self.first_error:
                self.first_error = f"{type(exc).__name__}: {exc}"


@contextlib.contextmanager
def _topic(bootstrap: Target, prefix: str, partitions: int, keep: bool) -> Iterator[str]:
    from sluice.client import Admin

    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin = Admin(**client_kwargs(bootstrap))
    # the cluster's default replication factor: 1 on one broker, 3 on a LocalCluster of three
    admin.create_topic(name, partitions=partitions, replication_factor=None)
    try:
        yield name
    finally:
        if not keep:
            with contextlib.suppress(Exception):
                admin.delete_topic(name)
        with contextlib.suppress(Exception):
            admin.close()


def _new_result(name: str, kind: str, params: dict[str, Any]) -> BenchResult:
    return BenchResult(
        name=name,
        kind=kind,
        params=params,
        started_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        environment=environment(),
    )


def produce(
    bootstrap: Target,
    *,
    name: str = "produce",
    record_size: int = 1024,
    count: int = 100_000,
    max_seconds: float = 120.0,
    acks: str = "all",
    idempotent: bool = True,
    compression: str | None = None,
    linger_ms: int = 5,
    batch_size: int = 262144,
    partitions: int = 3,
    commit_interval_ms: int | None = None,
    topic: str | None = None,
    progress: bool = True,
    keep_topic: bool = False,
) -> BenchResult:
    """Produce ``count`` records (or for ``max_seconds``); transactional when ``commit_interval_ms`` is set."""
    from sluice.client import Producer

    transactional = commit_interval_ms is not None
    params: dict[str, Any] = {
        "record_size": record_size, "count": count, "acks": acks, "idempotent": idempotent or transactional,
        "compression": compression, "linger_ms": linger_ms, "batch_size": batch_size,
        "partitions": partitions, "commit_interval_ms": commit_interval_ms, "max_seconds": max_seconds,
    }  # fmt: skip
    result = _new_result(name, "transactions" if transactional else "produce", params)
    values = make_values(record_size)
    nvalues = len(values)
    acked = _Acks()
    topic_cm = contextlib.nullcontext(topic) if topic else _topic(bootstrap, f"bench-{name}", partitions, keep_topic)
    with topic_cm as topic_name:
        assert topic_name is not None
        producer = Producer(
            **client_kwargs(bootstrap),
            transactional_id=f"bench-{uuid.uuid4().hex[:8]}" if transactional else None,
            acks=acks,
            enable_idempotence=idempotent or transactional,
            linger_ms=linger_ms,
            batch_size=batch_size,
            compression=compression,
        )
        bar = Progress(name, count, enabled=progress)
        commits = 0
        sent = 0
        start = time.perf_counter()
        try:
            if transactional:
                producer.init_transactions()
                producer.begin_transaction()
            interval_s = (commit_interval_ms or 0) / 1000.0
            start = time.perf_counter()
            next_commit = start + interval_s
            deadline = start + max_seconds
            send, delivered = producer.send, acked.delivered
            while sent < count:
                # Check the clock every 256 records: cheap, and fine-grained enough for 100 ms commits.
                for _ in range(min(256, count - sent)):
                    send(topic_name, value=values[sent % nvalues], callback=delivered)
                    sent += 1
                now = time.perf_counter()
                if transactional and now >= next_commit:
                    producer.commit_transaction()
                    commits += 1
                    producer.begin_transaction()
                    next_commit = now + interval_s
                if now >= deadline:
                    result.notes = f"stopped after max_seconds={max_seconds}"
                    break
                bar.update(acked.acked, f"{acked.acked * record_size / 1e6 / max(now - start, 1e-9):.1f} MB/s")
            if transactional:
                producer.commit_transaction()
                commits += 1
            producer.flush()
            elapsed = time.perf_counter() - start
        except Exception as exc:
            result.error = f"{type(exc).__name__}: {exc}"
            elapsed = time.perf_counter() - start if sent else 0.0
        finally:
            bar.close()
            with contextlib.suppress(Exception):
                producer.close()
    result.errors = acked.failed
    if acked.first_error and not result.error:
        result.error = acked.first_error
    if transactional:
        result.params["transactions"] = commits
    return result.finish(acked.acked, acked.acked * record_size, elapsed)


def fill(
    bootstrap: Target,
    topic: str,
    *,
    record_size: int,
    count: int,
    commit_interval_ms: int | None = 100,
    progress: bool = True,
) -> BenchResult:
    """Write ``count`` records into ``topic`` (transactionally by default) for the consume benchmark."""
    return produce(
        bootstrap,
        name="fill",
        record_size=record_size,
        count=count,
        max_seconds=3600.0,
        commit_interval_ms=commit_interval_ms,
        topic=topic,
        progress=progress,
    )


def consume(
    bootstrap: Target,
    *,
    name: str = "consume",
    record_size: int = 1024,
    count: int = 100_000,
    isolation_level: str = "read_committed",
    transactional_data: bool = True,
    partitions: int = 3,
    max_poll_records: int = 500,
    max_seconds: float = 120.0,
    progress: bool = True,
) -> BenchResult:
    """Fill a fresh topic with ``count`` records (untimed), then time reading them all back."""
    from sluice.client import Consumer, TopicPartition

    params: dict[str, Any] = {
        "record_size": record_size, "count": count, "isolation_level": isolation_level,
        "transactional_data": transactional_data, "partitions": partitions,
        "max_poll_records": max_poll_records, "max_seconds": max_seconds,
    }  # fmt: skip
    result = _new_result(name, "consume", params)
    with _topic(bootstrap, f"bench-{name}", partitions, keep=False) as topic:
        filled = fill(
            bootstrap,
            topic,
            record_size=record_size,
            count=count,
            commit_interval_ms=100 if transactional_data else None,
            progress=progress,
        )
        if filled.error or filled.records < count:
            result.error = f"filling the topic failed: {filled.error or f'{filled.records} of {count} written'}"
            return result
        consumer = Consumer(
            **client_kwargs(bootstrap),
            group_id=f"bench-{uuid.uuid4().hex[:8]}",
            isolation_level=isolation_level,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            max_poll_records=max_poll_records,
        )
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        bar = Progress(name, count, enabled=progress)
        records = nbytes = 0
        start = time.perf_counter()
        try:
            consumer.assign(tps)
            for tp, offset in consumer.beginning_offsets(tps).items():
                consumer.seek(tp, offset)
            start = time.perf_counter()
            deadline = start + max_seconds
            while records < count and time.perf_counter() < deadline:
                for rec in consumer.poll(timeout=1.0):
                    records += 1
                    nbytes += len(rec.value or b"")
                bar.update(records, f"{nbytes / 1e6 / max(time.perf_counter() - start, 1e-9):.1f} MB/s")
            if records < count:
                result.error = f"read {records} of {count} records in {max_seconds}s"
        except Exception as exc:
            result.error = f"{type(exc).__name__}: {exc}"
        finally:
            elapsed = time.perf_counter() - start
            bar.close()
            with contextlib.suppress(Exception):
                consumer.close()
    return result.finish(records, nbytes, elapsed)


def latency(
    bootstrap: Target,
    *,
    name: str = "latency",
    record_size: int = 1024,
    rate_mb_s: float = 10.0,
    seconds: float = 30.0,
    acks: str = "all",
    linger_ms: int = 5,
    partitions: int = 3,
    warmup_seconds: float = 2.0,
    progress: bool = True,
) -> BenchResult:
    """Send at a steady ``rate_mb_s`` for ``seconds``; per-record latency from send to acknowledgement.

    The first ``warmup_seconds`` are sent at the same rate but not counted
    (connection set-up, first metadata, producer id).
    """
    from sluice.client import Producer

    params: dict[str, Any] = {
        "record_size": record_size, "rate_mb_s": rate_mb_s, "seconds": seconds, "acks": acks,
        "linger_ms": linger_ms, "partitions": partitions, "warmup_seconds": warmup_seconds,
    }  # fmt: skip
    result = _new_result(name, "latency", params)
    rate = rate_mb_s * 1e6 / record_size  # records per second
    values = make_values(record_size)
    samples: list[float] = []
    lock = threading.Lock()
    acked = _Acks()
    with _topic(bootstrap, f"bench-{name}", partitions, keep=False) as topic:
        producer = Producer(**client_kwargs(bootstrap), acks=acks, enable_idempotence=True, linger_ms=linger_ms)
        total = int(rate * (seconds + warmup_seconds))
        bar = Progress(name, total, enabled=progress)
        sent = 0
        start = time.perf_counter()
        measure_from = start + warmup_seconds

        def on_done(metadata: RecordMetadata, exc: BaseException | None, t0: float) -> None:
            t1 = time.perf_counter()
            acked.delivered(metadata, exc)
            if t0 >= measure_from and exc is None:
                with lock:
                    samples.append((t1 - t0) * 1000.0)

        try:
            end = start + warmup_seconds + seconds
            # Bounded: one iteration per millisecond tick at most, until `end`.
            for _ in range(int((seconds + warmup_seconds) * 2000) + 10):
                now = time.perf_counter()
                if now >= end:
                    break
                due = min(total, int((now - start) * rate) + 1)
                while sent < due:
                    t0 = time.perf_counter()
                    producer.send(topic, value=values[sent % len(values)], callback=functools.partial(on_done, t0=t0))
                    sent += 1
                bar.update(sent, f"{acked.acked} acked")
                time.sleep(0.0005)
            producer.flush()
        except Exception as exc:
            result.error = f"{type(exc).__name__}: {exc}"
        finally:
            bar.close()
            with contextlib.suppress(Exception):
                producer.close()
    measured = len(samples)
    result.latency_ms = percentiles(samples)
    result.errors = acked.failed
    achieved = measured * record_size / 1e6 / seconds if seconds else 0.0
    if achieved < 0.9 * rate_mb_s:
        result.notes = f"target rate not reached: {achieved:.2f} of {rate_mb_s} MB/s"
    return result.finish(measured, measured * record_size, seconds)
