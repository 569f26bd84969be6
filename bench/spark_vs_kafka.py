#!/usr/bin/env python3
"""Spark side by side: ``format("sluice")`` against Spark's own Kafka connector, on Sluice and on Kafka.

    python bench/spark_vs_kafka.py                    # 5,000,000 rows of 100 B, 5 runs per job, medians
    python bench/spark_vs_kafka.py --value-sizes 100,1024
    python bench/spark_vs_kafka.py --smoke            # tiny counts, once: proves the harness end to end

One SparkSession (``local[2]``, started once, not timed) carries both data sources: Sluice's
``format("sluice")`` (registered with ``sluice.spark.register``) and Spark's own Kafka connector,
``format("kafka")`` (spark-sql-kafka-0-10 for the installed pyspark, fetched once from Maven Central
by ``tests/support/spark_kafka``, the fetcher the Spark tests use, and put on ``spark.jars``). The
same rows go through three routes, one broker at a time, never two at once:

* ``sluice``: ``df.write.format("sluice")``, the **exactly-once** sink (every task writes in its
  own transaction and prepares it, the driver commits them all when Spark commits the job), and
  ``spark.read.format("sluice")`` (read_committed, Arrow batches over gRPC), against a fresh
  single-broker ``sluice.testing.LocalCluster(kafka_listener=True)``;
* ``kafka-sluice``: ``format("kafka")`` against that same broker's Kafka-protocol listener (the
  connector's idempotent producer, **at least once**; its JVM consumer, read_committed);
* ``kafka-kafka``: ``format("kafka")`` against Apache Kafka 4.3.1, one combined KRaft node started
  by ``bench/kafka/cluster.py`` after the Sluice cluster is stopped.

The middle route runs the same connector against both brokers, so ``kafka-sluice`` against
``kafka-kafka`` compares the brokers; ``sluice`` against ``kafka-sluice`` is the exactly-once sink's
cost next to Kafka's at-least-once sink on the same broker.

The rows: ``spark.range(rows)`` in ``--spark-partitions`` partitions, each row a value of exactly
``--value-sizes`` bytes (the id left-padded, as binary; no key), written to a fresh topic of
``--topic-partitions`` partitions (created untimed: Sluice's Admin over gRPC, Kafka's own
``TopicCommand``). Both sinks' producers batch alike: the Kafka sink is given ``acks=all``,
idempotence, ``linger.ms=5`` and ``batch.size=262144``, the Sluice sink's defaults. Each run of a
route writes its topic (timed: ``save()``, call to return, so the tasks and, for the exactly-once
sink, the prepares and the driver's commits are in) and then reads it back (timed: the action,
call to return; planning, which looks the offsets up, happens inside it) with the same route's
reader, ``startingOffsets`` earliest, ``endingOffsets`` latest, read_committed. The read
aggregates every row (``count(*)``, ``sum(length(value))``, ``max(offset)``), so every value
crosses into the JVM on both sides, and the count and the bytes must be exactly what was written:
a run whose figures disagree is an **error**, reported and left out of the medians, never a figure.

Not timed: the SparkSession's start-up, the clusters' start-up, topic creation and deletion, and an
unrecorded warm-up (a small write and read through every route of the system, which starts Spark's
Python workers, loads the connector's classes and warms the JIT) before each system's runs.

For every run the harness records, from /proc (``bench/sysstat.py``): the 1-minute load average
before it, the broker processes' CPU seconds (Sluice: broker and local controller; Kafka: the node's
JVM) and the CPU other processes took meanwhile. ``bench/verdict.py`` judges them as
``compare_kafka.py`` does: a run during which other processes took more than 10% of the machine,
or a comparison that started at a load average above 0.5 per core, is **not valid**; its figures
are printed and saved, marked so, and the last line says ``VERDICT: NOT VALID``.

Output: progress lines while it runs; the table on stdout and in
``bench/results/spark-vs-kafka.md``, every run in ``spark-vs-kafka.json`` (and appended to
``spark-vs-kafka-runs.json``), the bar chart in ``spark-vs-kafka.png`` (matplotlib, the ``bench``
extra). ``--smoke`` writes ``spark-vs-kafka-smoke.*`` instead, so a smoke run never overwrites a
measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":
    # Run as a file, Python puts bench/ first on the path, where bench/kafka would shadow any package
    # named kafka; the harness imports itself as bench.* (and the jar fetcher as tests.support.*) from
    # the repository root instead.
    sys.path[0] = str(ROOT)

from bench import sysstat, verdict  # noqa: E402
from bench.kafka.fetch import DEFAULT_VERSION, FetchError, ensure_jars  # noqa: E402
from sluice.cli.engines.bench import append_result, environment  # noqa: E402

RESULTS = ROOT / "bench" / "results"
STEM = "spark-vs-kafka"

ROUTES = ("sluice", "kafka-sluice", "kafka-kafka")
ROUTE_LABEL = {
    "sluice": 'format("sluice") on Sluice',
    "kafka-sluice": 'format("kafka") on Sluice\'s Kafka listener',
    "kafka-kafka": 'format("kafka") on Apache Kafka',
}
SEMANTICS = {
    ("write", "sluice"): "exactly once (prepared transactions)",
    ("write", "kafka-sluice"): "at least once (idempotent producer)",
    ("write", "kafka-kafka"): "at least once (idempotent producer)",
    ("read", "sluice"): "read_committed, Arrow over gRPC",
    ("read", "kafka-sluice"): "read_committed, JVM consumer",
    ("read", "kafka-kafka"): "read_committed, JVM consumer",
}
# The Kafka sink's producer, set to batch as the Sluice sink does by default (sluice/spark/writer.py).
KAFKA_SINK_OPTIONS = {
    "kafka.acks": "all",
    "kafka.enable.idempotence": "true",
    "kafka.linger.ms": "5",
    "kafka.batch.size": "262144",
    "kafka.compression.type": "none",
}


# -- results: pure functions over runs (tests/unit/test_bench_spark_vs_kafka.py) ----------------------


@dataclass
class Run:
    """One timed Spark job: a write or a read of ``rows`` values of ``value_size`` bytes by one route."""

    route: str  # one of ROUTES
    direction: str  # "write" or "read"
    value_size: int
    run: int
    rows: int
    seconds: float = 0.0
    load_1m_before: float = 0.0
    load_1m_after: float = 0.0
    broker_cpu_s: float = 0.0
    own_cpu_s: float = 0.0  # this process's tree: Spark's JVM, its Python workers, the brokers
    foreign_share: float = 0.0
    valid: bool = True
    reasons: list[str] = field(default_factory=list)
    error: str = ""
    topic: str = ""

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 and not self.error else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.rows_per_s * self.value_size / 1e6

    def record(self) -> dict[str, Any]:
        return {**asdict(self), "rows_per_s": round(self.rows_per_s), "mb_per_s": round(self.mb_per_s, 2)}


def job_name(direction: str, value_size: int) -> str:
    size = f"{value_size // 1024} KiB" if value_size % 1024 == 0 else f"{value_size} B"
    return f"{direction} {size}"


def jobs(runs: Sequence[Run]) -> list[tuple[str, int]]:
    """(direction, value size) of the runs, writes before reads, in size order."""
    return sorted({(r.direction, r.value_size) for r in runs}, key=lambda j: (j[1], j[0] != "write"))


def of(runs: Sequence[Run], direction: str, value_size: int, route: str) -> list[Run]:
    return [r for r in runs if (r.direction, r.value_size, r.route) == (direction, value_size, route)]


def median_run(runs: Sequence[Run]) -> Run | None:
    """The run with the median rows/s among those without an error (of an even number, the lower
    middle, as compare_kafka reports); None when every run failed."""
    ok = sorted((r for r in runs if not r.error), key=lambda r: r.rows_per_s)
    return ok[(len(ok) - 1) // 2] if ok else None


def cpu_per_gb(runs: Sequence[Run]) -> float | None:
    """Broker CPU seconds per GB (10^9 value bytes) over the runs without an error: total over total."""
    ok = [r for r in runs if not r.error]
    gb = sum(r.rows * r.value_size for r in ok) / 1e9
    return sum(r.broker_cpu_s for r in ok) / gb if gb > 0 else None


def rising(cpu_s: Sequence[float]) -> float:
    """CPU seconds a process tree used over consecutive samples of its running total, counting only
    the increases. The total of a tree drops when CPU leaves it: a process re-parented out of the tree
    (its parent died before reaping it) takes all its CPU along. A smoke run saw Spark's tree lose 4 s
    in one read, about a minute after the last Python task, when Spark stops idle Python workers; a
    plain last-minus-first made that negative CPU for the harness and 165% "other processes"."""
    return sum(max(0.0, b - a) for a, b in itertools.pairwise(cpu_s))


def ratio(a: Run | None, b: Run | None) -> float | None:
    return a.rows_per_s / b.rows_per_s if a and b and b.rows_per_s > 0 else None


def _fmt(x: float | None, spec: str = ",.0f") -> str:
    return "" if x is None else format(x, spec)


def table(runs: Sequence[Run]) -> str:
    """The markdown table: per job and route the median run, the ratio to Kafka's connector on Apache
    Kafka, every run's rows/s, load averages before, broker CPU per GB and how many runs were valid."""
    head = ("| job | route | semantics | rows/s (median) | MB/s | vs format(\"kafka\") on Apache Kafka "
            "| runs, rows/s | load avg before | broker CPU s/GB | runs valid |")  # fmt: skip
    lines = [head, "|---|---|---|---:|---:|---:|---|---|---:|---|"]
    for direction, size in jobs(runs):
        base = median_run(of(runs, direction, size, "kafka-kafka"))
        for route in ROUTES:
            rs = of(runs, direction, size, route)
            if not rs:
                continue
            m = median_run(rs)
            each = " / ".join("error" if r.error else f"{r.rows_per_s:,.0f}" for r in rs)
            loads = ", ".join(f"{r.load_1m_before:.1f}" for r in rs)
            valid = sum(1 for r in rs if r.valid and not r.error)
            vs = "1.00" if route == "kafka-kafka" and m else _fmt(ratio(m, base), ".2f")
            lines.append(
                f"| {job_name(direction, size)} | {ROUTE_LABEL[route]} | {SEMANTICS[(direction, route)]} "
                f"| {_fmt(m.rows_per_s if m else None)} | {_fmt(m.mb_per_s if m else None, '.1f')} | {vs} "
                f"| {each} | {loads} | {_fmt(cpu_per_gb(rs), '.1f')} | {valid}/{len(rs)} |"
            )
    return "\n".join(lines)


def eos_cost(runs: Sequence[Run]) -> list[str]:
    """Sentences on the exactly-once sink's rate next to the at-least-once sink's, per value size."""
    out = []
    for direction, size in jobs(runs):
        if direction != "write":
            continue
        eos, alo_s, alo_k = (median_run(of(runs, "write", size, r)) for r in ROUTES)
        if eos is None:
            continue
        parts = [f'Exactly-once sink, {job_name("write", size)}: format("sluice") {eos.rows_per_s:,.0f} rows/s']
        if alo_s is not None:
            parts.append(f"{ratio(eos, alo_s):.2f}x format(\"kafka\") on the same broker "
                         f"({alo_s.rows_per_s:,.0f}, at least once)")  # fmt: skip
        if alo_k is not None:
            parts.append(f'{ratio(eos, alo_k):.2f}x format("kafka") on Apache Kafka ({alo_k.rows_per_s:,.0f})')
        out.append("; ".join(parts) + ".")
    return out


def verdict_line(start: verdict.Verdict, runs: Sequence[Run], failures: Sequence[str] = ()) -> str:
    errors = [r for r in runs if r.error]
    busy = [r for r in runs if not r.valid]
    if failures:
        return "VERDICT: ERRORS: " + "; ".join(failures) + "; the figures are incomplete"
    if errors:
        return (f"VERDICT: ERRORS: {len(errors)} of {len(runs)} runs failed or read back the wrong rows "
                "(see the table and the JSON); the figures are incomplete")  # fmt: skip
    if start.valid and not busy:
        return f"VERDICT: valid: all {len(runs)} runs on a quiet machine"
    why = list(start.reasons)
    if busy:
        why.append(f"{len(busy)} of {len(runs)} runs while other processes used the CPU")
    return "VERDICT: NOT VALID (" + "; ".join(why) + "): do not quote these figures"


def chart(runs: Sequence[Run], path: Path, title: str) -> bool:
    """Grouped bars: rows/s per job and route (the median run; whiskers from the slowest to the fastest
    run). False when matplotlib is missing."""
    try:
        import matplotlib  # type: ignore[import-not-found, unused-ignore]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return False
    js = jobs(runs)
    fig, ax = plt.subplots(figsize=(max(7.0, 2.6 * len(js) + 2), 4.8))
    colors = {"sluice": "#3b7dd8", "kafka-sluice": "#8fb8ee", "kafka-kafka": "#777777"}
    width = 0.8 / len(ROUTES)
    for i, route in enumerate(ROUTES):
        xs, ys, lo, hi = [], [], [], []
        for x, (direction, size) in enumerate(js):
            rs = [r for r in of(runs, direction, size, route) if not r.error]
            m = median_run(rs)
            if m is None:
                continue
            xs.append(x + (i - (len(ROUTES) - 1) / 2) * width)
            ys.append(m.rows_per_s)
            lo.append(m.rows_per_s - min(r.rows_per_s for r in rs))
            hi.append(max(r.rows_per_s for r in rs) - m.rows_per_s)
        if xs:
            ax.bar(xs, ys, width=width, yerr=[lo, hi], capsize=3, label=ROUTE_LABEL[route], color=colors[route])
    ax.set_xticks(list(range(len(js))), [job_name(d, s) for d, s in js])
    ax.set_ylabel("rows/s (median run)")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# -- running -------------------------------------------------------------------------------------------


class Meter:
    """Samples the broker processes and this process's tree (Spark's JVM and Python workers, and the
    brokers it started) while runs happen; judges each run as compare_kafka does."""

    def __init__(self, broker_pids: list[int], limits: verdict.Limits) -> None:
        self.sampler = sysstat.Sampler({"broker": broker_pids, "ours": [os.getpid()]}, interval=0.2)
        self.limits = limits
        self.cpus = os.cpu_count() or 1

    def __enter__(self) -> Meter:
        self.sampler.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.sampler.__exit__(*exc)

    def measure(self, run: Run, job: Callable[[], None]) -> Run:
        """Time ``job`` (a Spark action, call to return) into ``run``; an exception becomes its error."""
        run.load_1m_before = os.getloadavg()[0]
        first = self.sampler.take()
        t0 = time.perf_counter()
        try:
            job()
        except Exception as exc:  # a failed Spark job is a result to report, not a crash of the harness
            text = str(exc).strip()
            run.error = f"{type(exc).__name__}: {text.splitlines()[0][:300] if text else ''}"
        t1 = time.perf_counter()
        last = self.sampler.take()
        window = [x for x in list(self.sampler.samples) if first.at <= x.at <= last.at]
        run.seconds = round(t1 - t0, 3)
        run.broker_cpu_s = round(rising([x.cpu_s.get("broker", 0.0) for x in window]), 2)
        load = verdict.RunLoad(
            wall_s=last.at - first.at, machine_busy_s=last.machine_busy_s - first.machine_busy_s,
            own_cpu_s=rising([x.cpu_s.get("ours", 0.0) for x in window]), cpus=self.cpus,
            load_1m_after=os.getloadavg()[0],
        )  # fmt: skip
        v = verdict.judge_run(load, self.limits)
        run.own_cpu_s = round(load.own_cpu_s, 2)
        run.load_1m_after = round(load.load_1m_after, 2)
        run.load_1m_before = round(run.load_1m_before, 2)
        run.foreign_share = round(load.foreign_share, 4)
        run.valid, run.reasons = v.valid, v.reasons
        return run


@dataclass
class Target:
    """One broker and how each route of it reaches it: its routes, topic creation and deletion."""

    system: str  # "sluice" or "kafka"
    routes: tuple[str, ...]
    grpc: str  # Sluice's gRPC bootstrap ("" for Kafka)
    kafka: str  # the Kafka-protocol bootstrap (Sluice's listener, or Kafka's)
    pids: list[int]
    create: Callable[[str, int], str]
    delete: Callable[[str], None]


@contextmanager
def sluice_target(partitions: int) -> Iterator[Target]:
    from sluice.client import Admin
    from sluice.testing import LocalCluster

    with (
        LocalCluster(brokers=1, kafka_listener=True) as cluster,
        Admin(bootstrap_servers=cluster.bootstrap_servers) as admin,
    ):

        def create(prefix: str, n: int) -> str:
            name = f"{prefix}-{uuid.uuid4().hex[:8]}"
            admin.create_topic(name, partitions=n, replication_factor=1)
            return name

        pids = [b.pid for b in cluster.brokers if b.pid] + [p for p in [cluster.controller.pid] if p]
        yield Target("sluice", ("sluice", "kafka-sluice"), cluster.bootstrap_servers,
                     cluster.kafka_bootstrap_servers, pids, create, admin.delete_topic)  # fmt: skip


@contextmanager
def kafka_target(version: str, heap: str) -> Iterator[Target]:
    from bench.kafka.cluster import KafkaCluster
    from bench.kafka.perf import KafkaTools

    with (
        KafkaCluster(nodes=1, version=version, heap=heap) as kafka,
        tempfile.TemporaryDirectory(prefix="spark-kbench-") as tmp,
    ):
        tools = KafkaTools(ensure_jars(version), kafka.bootstrap_servers, Path(tmp))
        yield Target("kafka", ("kafka-kafka",), "", kafka.bootstrap_servers, kafka.pids(),
                     lambda prefix, n: tools.create_topic(prefix, n), tools.delete_topic)  # fmt: skip


class Jobs:
    """The Spark jobs of every route, on one SparkSession."""

    def __init__(self, spark: Any, spark_partitions: int) -> None:
        self.spark = spark
        self.spark_partitions = spark_partitions

    def frame(self, rows: int, value_size: int) -> Any:
        from pyspark.sql import functions as F

        value = F.lpad(F.col("id").cast("string"), value_size, "x").cast("binary")  # exactly value_size bytes
        return self.spark.range(0, rows, 1, self.spark_partitions).select(value.alias("value"))

    def write(self, route: str, target: Target, topic: str, rows: int, value_size: int) -> None:
        w = self.frame(rows, value_size).write.mode("append").option("topic", topic)
        if route == "sluice":
            w.format("sluice").option("bootstrap.servers", target.grpc).save()
        else:
            w.format("kafka").option("kafka.bootstrap.servers", target.kafka).options(**KAFKA_SINK_OPTIONS).save()

    def read(self, route: str, target: Target, topic: str) -> tuple[int, int, int]:
        """(rows, value bytes, max offset) of the whole topic, read_committed, earliest to latest."""
        from pyspark.sql import functions as F

        if route == "sluice":
            r = self.spark.read.format("sluice").option("bootstrap.servers", target.grpc)
        else:
            r = self.spark.read.format("kafka").option("kafka.bootstrap.servers", target.kafka)
            r = r.option("kafka.isolation.level", "read_committed")
        df = (r.option("subscribe", topic).option("startingOffsets", "earliest").option("endingOffsets", "latest")
              .load())  # fmt: skip
        row = df.agg(F.count(F.lit(1)), F.sum(F.length("value")), F.max("offset")).collect()[0]
        return int(row[0]), int(row[1] or 0), int(row[2] if row[2] is not None else -1)


def run_system(
    target: Target, spark_jobs: Jobs, *, rows: int, runs: int, sizes: Sequence[int], partitions: int, warmup: int,
    limits: verdict.Limits, say: Callable[[str], None], out: list[Run],
) -> None:  # fmt: skip
    """Warm-up, then ``runs`` rounds of: per value size and route, a write and a read back of its topic;
    the runs are appended to ``out`` as they finish (so a failure later keeps them)."""
    say(f"  warm-up: {warmup:,} rows written and read through {', '.join(target.routes)} (not recorded)")
    for route in target.routes:
        topic = target.create(f"warmup-{route}", partitions)
        spark_jobs.write(route, target, topic, warmup, sizes[0])
        back = spark_jobs.read(route, target, topic)
        if back[0] != warmup:
            raise RuntimeError(f"warm-up through {route}: read {back[0]:,} rows back, wrote {warmup:,}")
        target.delete(topic)
    with Meter(target.pids, limits) as meter:
        for i in range(runs):
            for size in sizes:
                for route in target.routes:
                    out += one_round(meter, target, spark_jobs, route, size, i + 1, runs, rows, partitions, say)


def one_round(
    meter: Meter, target: Target, spark_jobs: Jobs, route: str, size: int, run: int, runs: int, rows: int,
    partitions: int, say: Callable[[str], None],
) -> list[Run]:  # fmt: skip
    """One route's write of a fresh topic and its read back; the read checks what the write wrote."""
    topic = target.create(f"spark-{route}-{size}", partitions)
    w = meter.measure(Run(route, "write", size, run, rows, topic=topic),
                      lambda: spark_jobs.write(route, target, topic, rows, size))  # fmt: skip
    say(_line(w, runs))
    got: list[tuple[int, int, int]] = []
    r = meter.measure(Run(route, "read", size, run, rows, topic=topic),
                      lambda: got.append(spark_jobs.read(route, target, topic)))  # fmt: skip
    if got and got[0][:2] != (rows, rows * size):
        wrong = f"read {got[0][0]:,} rows / {got[0][1]:,} value bytes back, expected {rows:,} / {rows * size:,}"
        r.error = wrong
        w.error = w.error or f"the read back found the wrong rows: {wrong}"
        say(f"    {w.route} write run {w.run}: ERROR {w.error}")
    say(_line(r, runs))
    try:
        target.delete(topic)
    except Exception as exc:  # a topic left behind costs disk, not the figures
        say(f"    (could not delete {topic}: {exc})")
    return [w, r]


def _line(r: Run, runs: int) -> str:
    state = "ok" if r.valid else "BUSY"
    if r.error:
        return f"  {r.route:12} {job_name(r.direction, r.value_size):12} run {r.run}/{runs}: ERROR {r.error}"
    return (f"  {r.route:12} {job_name(r.direction, r.value_size):12} run {r.run}/{runs}: {r.rows:,} rows in "
            f"{r.seconds:.2f} s = {r.rows_per_s:,.0f} rows/s, {r.mb_per_s:.1f} MB/s; "
            f"broker CPU {r.broker_cpu_s:.1f} s; load {r.load_1m_before:.2f} before; "
            f"others {r.foreign_share:.0%} [{state}]")  # fmt: skip


def start_spark(master: str, jars: Sequence[Path], warehouse: str) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import sluice.spark

    spark = (
        SparkSession.builder.master(master)
        .appName("sluice-bench-spark-vs-kafka")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")  # the progress lines are the harness's
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.warehouse.dir", warehouse)
        .config("spark.pyspark.python", sys.executable)
        .config("spark.jars", ",".join(str(j) for j in jars))
        # The Kafka sink caches its producers across jobs (10 minutes by default); one still cached for
        # Sluice's listener after that cluster stopped would retry it for minutes. Idle ones now go
        # within about 30 s, which the Kafka cluster's start-up and the warm-up outlast.
        .config("spark.kafka.producer.cache.timeout", "30s")
        .config("spark.kafka.producer.cache.evictorThreadRunInterval", "5s")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    with contextlib.suppress(Exception):  # ... and log a warning per retry meanwhile: not worth showing
        jvm: Any = spark.sparkContext._jvm
        level = jvm.org.apache.logging.log4j.Level.ERROR
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel("org.apache.kafka.clients.NetworkClient", level)
    sluice.spark.register(spark)
    return spark


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # 5,000,000 rows: at 1,000,000 a job lasted 1-3 s and Kafka's own write runs spread 2x in one
    # evening, so a valid verdict could still rank the two wrongly
    ap.add_argument("--rows", type=int, default=5_000_000, help="rows per job (default 5,000,000)")
    ap.add_argument("--runs", type=int, default=5, help="runs per job and route; medians reported (default 5)")
    ap.add_argument("--value-sizes", default="100", help="comma-separated value sizes in bytes (default 100)")
    ap.add_argument("--topic-partitions", type=int, default=4)
    ap.add_argument("--spark-partitions", type=int, default=4, help="partitions (write tasks) of spark.range")
    ap.add_argument("--warmup-rows", type=int, default=20_000)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--smoke", action="store_true",
                    help="smoke run: 10,000 rows, 1 run, 2,000 warm-up rows; saved as *-smoke.*")  # fmt: skip
    ap.add_argument("--only", choices=("sluice", "kafka"), help="one system only")
    ap.add_argument("--kafka-first", action="store_true", help="run Apache Kafka before Sluice")
    ap.add_argument("--kafka-version", default=DEFAULT_VERSION)
    ap.add_argument("--kafka-heap", default="1g", help="Kafka broker heap (-Xms = -Xmx; default 1g)")
    ap.add_argument("--max-foreign-share", type=float, default=verdict.Limits.max_foreign_share,
                    help="a run is not valid when other processes used more than this share of the CPU")  # fmt: skip
    ap.add_argument("--max-start-load", type=float, default=verdict.Limits.max_start_load_per_cpu,
                    help="not valid when the 1-min load average per CPU before the first run exceeds this")  # fmt: skip
    ap.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                    help="first wait up to SECONDS for the load average to fall under --max-start-load "
                         "(right after a test suite it is the suite's tail; default 0: no wait)")  # fmt: skip
    ap.add_argument("--results", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.smoke:
        args.rows, args.runs, args.warmup_rows = 10_000, 1, 2_000
    sizes = [int(s) for s in args.value_sizes.split(",") if s.strip()]
    if args.rows < 1 or args.runs < 1 or not sizes or min(sizes) < 1:
        ap.error("--rows, --runs and every value size must be positive")
    limits = verdict.Limits(max_foreign_share=args.max_foreign_share, max_start_load_per_cpu=args.max_start_load)
    # Before anything of ours runs: only other work is in this load average.
    cpus = os.cpu_count() or 1
    verdict.wait_quiet(limits, cpus, args.wait_quiet)
    start_load = os.getloadavg()
    start = verdict.judge_start(start_load[0], cpus, limits)
    env = environment()  # the commit measured: taken before the runs
    wall0 = time.monotonic()

    def say(s: str) -> None:
        print(f"[{time.monotonic() - wall0:6.0f} s] {s}", flush=True)

    say(f"spark_vs_kafka: {args.rows:,} rows x {sizes} B, {args.runs} run(s) per job and route, "
        f"{args.topic_partitions} topic partitions, {args.master}{' (SMOKE)' if args.smoke else ''}; "
        f"load average before: {start_load[0]:.2f} on {cpus} CPUs -> {start.text()}")  # fmt: skip
    from tests.support import spark_kafka  # the Spark tests' fetcher of spark-sql-kafka-0-10

    try:
        if args.only != "sluice":
            ensure_jars(args.kafka_version)  # before any clock runs
        jars = spark_kafka.connector_jars()
    except (FetchError, spark_kafka.FetchError) as exc:
        print(f"spark_vs_kafka: cannot fetch jars: {exc}", file=sys.stderr)
        return 2
    import pyspark

    say(f"Spark {pyspark.__version__} with spark-sql-kafka-0-10 {spark_kafka.chosen}; starting the SparkSession")
    runs: list[Run] = []
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="spark-vs-kafka-") as warehouse:
        spark = start_spark(args.master, jars, warehouse)
        spark_jobs = Jobs(spark, args.spark_partitions)

        def go(target: Target) -> None:
            run_system(target, spark_jobs, rows=args.rows, runs=args.runs, sizes=sizes,
                       partitions=args.topic_partitions, warmup=min(args.warmup_rows, args.rows),
                       limits=limits, say=say, out=runs)  # fmt: skip

        order = ["kafka", "sluice"] if args.kafka_first else ["sluice", "kafka"]
        try:
            for system in order:
                if args.only and args.only != system:
                    continue
                try:
                    if system == "sluice":
                        say("Sluice: a fresh single-broker LocalCluster with its Kafka listener")
                        with sluice_target(args.topic_partitions) as target:
                            go(target)
                    else:
                        say(f"Apache Kafka {args.kafka_version}: one KRaft node")
                        with kafka_target(args.kafka_version, args.kafka_heap) as target:
                            go(target)
                except Exception as exc:  # the other system still runs, and what ran is still saved
                    text = " | ".join(ln.strip() for ln in str(exc).strip().splitlines() if ln.strip())
                    failures.append(f"{system} stopped early: {type(exc).__name__}: {text[:400]}")
                    say(f"  {system}: FAILED: {failures[-1]}")
        finally:
            spark.stop()

    vline = verdict_line(start, runs, failures)
    header = (f"{'SMOKE RUN (tiny counts, not a measurement): ' if args.smoke else ''}"
              f"Spark {pyspark.__version__} ({args.master}) through format(\"sluice\") and spark-sql-kafka-0-10 "
              f"{spark_kafka.chosen}, Sluice (1 broker) and Apache Kafka {args.kafka_version} (1 node), "
              f"{args.rows:,} rows per job, {args.topic_partitions} topic partitions, {args.spark_partitions} "
              f"write tasks, median of {args.runs}, commit {env.get('git_commit', '')}, {cpus} CPUs, "
              f"load average before {start_load[0]:.2f}")  # fmt: skip
    md = table(runs)
    cost = eos_cost(runs)
    stem = STEM + ("-smoke" if args.smoke else "")
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / f"{stem}.md").write_text(f"{header}\n\n{md}\n\n" + "".join(c + "\n" for c in cost)
                                             + f"\n{vline}\n")  # fmt: skip
    record = {
        "header": header, "smoke": args.smoke, "rows": args.rows, "runs_per_job": args.runs,
        "value_sizes": sizes, "topic_partitions": args.topic_partitions, "spark_partitions": args.spark_partitions,
        "master": args.master, "pyspark": pyspark.__version__, "spark_sql_kafka": spark_kafka.chosen,
        "kafka_version": args.kafka_version, "kafka_sink_options": KAFKA_SINK_OPTIONS,
        "start_load_average": start_load, "start_valid": start.valid, "start_reasons": start.reasons,
        "verdict": vline, "failures": failures, "environment": env, "wall_s": round(time.monotonic() - wall0, 1),
        "runs": [r.record() for r in runs],
    }  # fmt: skip
    (args.results / f"{stem}.json").write_text(json.dumps(record, indent=2) + "\n")
    append_result(args.results / f"{STEM}-runs.json", record)
    print(f"\n{header}\n\n{md}\n")
    for c in cost:
        print(c)
    status = "NOT VALID (busy machine)"
    if vline.startswith("VERDICT: valid"):
        status = "valid"
    elif vline.startswith("VERDICT: ERRORS"):
        status = "ERRORS (incomplete)"
    title = f"{'SMOKE run, ' if args.smoke else ''}Spark rows/s, {args.rows:,} rows per job: {status}"
    if chart(runs, args.results / f"{stem}.png", title):
        print(f"\nchart: {args.results / f'{stem}.png'}")
    else:
        print("\n(no chart: matplotlib is not installed; pip install -e '.[bench]')")
    print(f"results: {args.results / f'{stem}.md'}, {args.results / f'{stem}.json'}; total {record['wall_s']} s")
    print(vline)
    return 1 if failures or any(r.error for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
