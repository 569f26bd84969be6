#!/usr/bin/env python3
"""How cost grows: Sluice's scale benchmarks, side by side with Apache Kafka where Kafka has the
same notion and its own tools can drive it.

    python bench/scale.py partitions  [--sizes 3,300,3000]  [--kafka]  # one broker: produce MB/s, RSS, restart
    python bench/scale.py producers   [--sizes 1,16,64]               # concurrent transactional producers
    python bench/scale.py txnids      [--ids 10000] [--brokers 3]     # memory; coordinator load after failover
    python bench/scale.py catchup     [--gb 2]      [--kafka]         # a consumer catching up through old data
    python bench/scale.py catchup --kafka --sluice-client kafka        # ... Kafka's ConsumerPerformance on both
    python bench/scale.py catchup --kafka --repeat 3                   # ... three rounds, medians (order alternates)
    python bench/scale.py restart     [--gb 5]      [--kafka]         # restart time with data on disk
    python bench/scale.py all --smoke [--kafka]                       # every one, tiny sizes: a smoke run

Each has a size knob; ``--smoke`` picks small sizes that prove the harness end to end in a few
minutes on a loaded machine. Every point is judged like a compare_kafka.py run (``bench/verdict.py``:
the CPU other processes took meanwhile, the load average before the first point) and saved with
its verdict. Results: ``bench/results/scale-<bench>[-smoke].json`` (every point, the machine, the
verdict), ``.md`` (the table) and ``.png`` (the curve, matplotlib), plus the growth of each figure
between the smallest and the largest size named as flat, sub-linear, linear or worse
(:func:`growth`).

What each measures (docs/performance.md says what limits each figure):

* **partitions**: for each size P, a fresh single broker, one topic of P partitions, 1 KiB
  records produced by the bench producer (idempotent, acks=all, linger 5 ms, batch 256 KiB),
  MB/s; the broker's RSS after the produce; then a clean restart of the broker, timed until it is
  healthy again (Kafka: until its log says it started).
* **producers**: N transactional producers in threads of one client process, each committing a
  transaction of ``--records-per-txn`` 1 KiB records in a loop for ``--seconds``: commits/s over all
  and the p50/p99 of ``commit_transaction`` latency. Kafka: the same loop with Kafka's Java client,
  N threads in one JVM (``bench/kafka/java/TxnDriver.java``; its perf tools run one producer per JVM).
* **txnids**: ``--ids`` transactional ids, each initialised and committing one transaction of one
  record; broker RSS before and after (bytes per id); then the broker holding the transaction
  coordinators is killed (kill -9) and the time until ``init_transactions`` of an existing id
  succeeds again is measured (with ``--brokers 3``, on another broker; with 1, after its restart).
  Both sides detect the failure in ``--failure-timeout-ms`` (5 s: Sluice's ``failure_timeout_ms``,
  Kafka's ``broker.session.timeout.ms``, whose own default is 9 s).
  Kafka: the ids made by ``TxnDriver``, node 1 killed, a probe JVM started beforehand times
  ``initTransactions`` of the first id. Broker RSS of a JVM is mostly its heap's touched pages,
  so Kafka's bytes per id are a rough figure.
* **catchup**: ``--gb`` of 1 KiB records written, then a new consumer reads all of it from the
  start, read_uncommitted: MB/s. The page cache is not dropped (that would disturb other users of
  the machine), so "old data" may still be in memory: the figure is an upper bound for cold reads.
* **restart**: ``--gb`` on disk, then a clean restart and a kill -9 restart: seconds until
  healthy (Sluice: RocksDB reopen; Kafka: log loading, and recovery after the kill).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":
    sys.path[0] = str(ROOT)  # see compare_kafka.py: import the harness as bench.*

from bench import sysstat, verdict  # noqa: E402
from sluice.cli.engines import bench as engine  # noqa: E402

RESULTS = ROOT / "bench" / "results"
SMOKE = {"partitions": [3, 30, 300], "producers": [1, 4, 8], "ids": 200, "gb": 0.05}
FULL = {"partitions": [3, 300, 3000], "producers": [1, 16, 64], "ids": 10_000, "catchup_gb": 2.0, "restart_gb": 5.0}


@dataclass
class Point:
    """One size of one benchmark on one system."""

    bench: str
    system: str
    size: float
    figures: dict[str, float] = field(default_factory=dict)
    valid: bool = True
    reasons: list[str] = field(default_factory=list)
    error: str = ""
    load_1m: float = 0.0
    run: int = 1  # the round (--repeat): one point per size, system and round


def growth(sizes: Sequence[float], values: Sequence[float]) -> str:
    """Name how ``values`` grow with ``sizes``, from the log-log slope between the first and last
    point: value ~ size^k. ``|k|`` below 0.1 is flat (less than x1.6 over a 100-fold size), below
    0 it falls, up to 0.8 sub-linear, up to 1.2 linear, above that worse than linear. The factor
    is always printed beside the name. (Two ends of a curve, not a fit: the points between are in
    the table.)"""
    pairs = [(s, v) for s, v in zip(sizes, values, strict=True) if s > 0 and v > 0]
    if len(pairs) < 2 or pairs[0][0] == pairs[-1][0]:
        return "n/a"
    (s0, v0), (s1, v1) = pairs[0], pairs[-1]
    k = math.log(v1 / v0) / math.log(s1 / s0)
    if k <= -0.1:
        name = "falls"
    elif k < 0.1:
        name = "flat"
    elif k < 0.8:
        name = "sub-linear"
    elif k <= 1.2:
        name = "linear"
    else:
        name = "worse than linear"
    return f"{name} (x{v1 / v0:.2f} for x{s1 / s0:g} size; exponent {k:.2f})"


class Judge:
    """Samples the harness's own process tree against the machine around each point."""

    def __init__(self, limits: verdict.Limits) -> None:
        self.limits = limits
        self.cpus = os.cpu_count() or 1
        self.start = verdict.judge_start(os.getloadavg()[0], self.cpus, limits)

    @contextlib.contextmanager
    def point(self, p: Point) -> Any:
        s0 = sysstat.sample({"ours": [os.getpid()]})
        try:
            yield p
        except Exception as exc:  # a failed point is recorded, the curve goes on
            p.error = f"{type(exc).__name__}: {exc}"
        s1 = sysstat.sample({"ours": [os.getpid()]})
        load = verdict.RunLoad(s1.at - s0.at, s1.machine_busy_s - s0.machine_busy_s,
                               s1.cpu_s["ours"] - s0.cpu_s["ours"], self.cpus, s1.load_1m)  # fmt: skip
        v = self.start.merge(verdict.judge_run(load, self.limits))
        p.valid, p.reasons, p.load_1m = v.valid and not p.error, v.reasons, s1.load_1m


def rss(pids: Sequence[int]) -> int:
    return sysstat.sample({"t": pids}).rss_bytes["t"]


def _sluice_pids(cluster: Any) -> list[int]:
    return [b.pid for b in cluster.brokers if b.pid]


# -- partitions ---------------------------------------------------------------------------------


def bench_partitions(sizes: list[int], count: int, judge: Judge, kafka: bool) -> list[Point]:
    from sluice.client import Admin
    from sluice.testing import LocalCluster

    points: list[Point] = []
    for size in sizes:
        p = Point("partitions", "sluice", size)
        with judge.point(p), LocalCluster(brokers=1, startup_timeout=300.0) as cluster:
            bs = cluster.bootstrap_servers
            admin = Admin(bootstrap_servers=bs)
            topic = f"scale-p{size}-{uuid.uuid4().hex[:6]}"
            t0 = time.perf_counter()
            admin.create_topic(topic, partitions=size, timeout=600.0)
            p.figures["create_topic_s"] = time.perf_counter() - t0
            admin.close()
            r = engine.produce(bs, name=f"scale-partitions-{size}", record_size=1024, count=count, topic=topic,
                               max_seconds=300.0, progress=False)  # fmt: skip
            if r.error:
                raise RuntimeError(r.error)
            p.figures["produce_mb_s"] = r.mb_per_s
            p.figures["broker_rss_mb"] = rss(_sluice_pids(cluster)) / 1e6
            t0 = time.perf_counter()
            cluster.restart(0, timeout=600.0)
            p.figures["restart_s"] = time.perf_counter() - t0
            p.figures["broker_rss_after_restart_mb"] = rss(_sluice_pids(cluster)) / 1e6
        points.append(p)
        print(_say(p), flush=True)
        if kafka:
            points.append(_kafka_partitions(size, count, judge))
            print(_say(points[-1]), flush=True)
    return points


def _kafka_partitions(size: int, count: int, judge: Judge) -> Point:
    from bench.kafka.cluster import KafkaCluster
    from bench.kafka.perf import tools_for

    p = Point("partitions", "kafka", size)
    with judge.point(p), KafkaCluster(nodes=1) as k, tempfile.TemporaryDirectory(prefix="kbench-") as tmp:
        tools = tools_for(k, Path(tmp))
        t0 = time.perf_counter()
        topic = tools.create_topic(f"scale-p{size}", partitions=size)
        p.figures["create_topic_s"] = time.perf_counter() - t0  # includes the TopicCommand JVM's start
        r = tools.produce(name=f"scale-partitions-{size}", record_size=1024, count=count, topic=topic)
        if r.error:
            raise RuntimeError(r.error)
        p.figures["produce_mb_s"] = r.mb_per_s
        p.figures["broker_rss_mb"] = rss(k.pids()) / 1e6
        p.figures["restart_s"] = k.restart(1)
        p.figures["broker_rss_after_restart_mb"] = rss(k.pids()) / 1e6
    return p


# -- producers ----------------------------------------------------------------------------------


@dataclass
class _TxnRun:
    """What the producer threads of one producers point share."""

    topic: str
    value: bytes
    per_txn: int
    start: threading.Barrier
    stop_at: float = float("inf")
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def loop(self, producer: Any) -> None:
        mine: list[float] = []
        self.start.wait()
        try:
            # bounded: one transaction per iteration, until the shared deadline
            for _ in range(1_000_000):
                if time.perf_counter() >= self.stop_at:
                    break
                producer.begin_transaction()
                for _ in range(self.per_txn):
                    producer.send(self.topic, value=self.value)
                t0 = time.perf_counter()
                producer.commit_transaction()
                mine.append((time.perf_counter() - t0) * 1000.0)
        except Exception as exc:
            with self.lock:
                self.errors.append(f"{type(exc).__name__}: {exc}")
        with self.lock:
            self.latencies.extend(mine)


def bench_producers(sizes: list[int], seconds: float, per_txn: int, judge: Judge, kafka: bool) -> list[Point]:
    from sluice.client import Producer
    from sluice.testing import LocalCluster

    points: list[Point] = []
    value = engine.make_values(1024, n=1)[0]
    for n in sizes:
        p = Point("producers", "sluice", n)
        with judge.point(p), LocalCluster(brokers=1) as cluster:
            bs = cluster.bootstrap_servers
            topic = f"scale-txn-{uuid.uuid4().hex[:6]}"
            from sluice.client import Admin

            admin = Admin(bootstrap_servers=bs)
            admin.create_topic(topic, partitions=3)
            admin.close()
            producers = [Producer(bootstrap_servers=bs, transactional_id=f"scale-{n}-{i}-{uuid.uuid4().hex[:6]}",
                                  linger_ms=5, batch_size=262144) for i in range(n)]  # fmt: skip
            for pr in producers:
                pr.init_transactions()
            shared = _TxnRun(topic, value, per_txn, threading.Barrier(n + 1))
            threads = [threading.Thread(target=shared.loop, args=(pr,), daemon=True) for pr in producers]
            for t in threads:
                t.start()
            shared.stop_at = time.perf_counter() + seconds
            t0 = time.perf_counter()
            shared.start.wait()
            for t in threads:
                t.join(timeout=seconds + 120)
            elapsed = time.perf_counter() - t0
            latencies, errors = shared.latencies, shared.errors
            for pr in producers:
                with contextlib.suppress(Exception):
                    pr.close()
            if errors:
                raise RuntimeError(f"{len(errors)} producer(s) failed, first: {errors[0]}")
            pct = engine.percentiles(latencies)
            p.figures.update(commits_per_s=len(latencies) / elapsed, commit_p50_ms=pct["p50"],
                             commit_p99_ms=pct["p99"], commits=len(latencies),
                             broker_rss_mb=rss(_sluice_pids(cluster)) / 1e6)  # fmt: skip
        points.append(p)
        print(_say(p), flush=True)
        if kafka:
            points.append(_kafka_producers(n, seconds, per_txn, judge))
            print(_say(points[-1]), flush=True)
    return points


def _kafka_producers(n: int, seconds: float, per_txn: int, judge: Judge) -> Point:
    from bench.kafka import driver
    from bench.kafka.cluster import KafkaCluster
    from bench.kafka.perf import tools_for

    p = Point("producers", "kafka", n)
    with judge.point(p), KafkaCluster(nodes=1) as k, tempfile.TemporaryDirectory(prefix="kbench-") as tmp:
        assert k.lib is not None
        topic = tools_for(k, Path(tmp)).create_topic("scale-txn")
        r = driver.run(k.lib, ["producers", k.bootstrap_servers, topic, str(n), str(seconds), str(per_txn)])
        p.figures.update(commits_per_s=r["commits"] / r["seconds"], commit_p50_ms=r["p50_ms"],
                         commit_p99_ms=r["p99_ms"], commits=r["commits"],
                         broker_rss_mb=rss(k.pids()) / 1e6)  # fmt: skip
    return p


# -- transactional ids --------------------------------------------------------------------------


def bench_txnids(ids: int, brokers: int, judge: Judge, kafka: bool, failure_ms: int = 5000) -> list[Point]:
    from sluice.client import Admin, Producer
    from sluice.testing import LocalCluster

    p = Point("txnids", "sluice", ids)
    with judge.point(p), LocalCluster(brokers=brokers, failure_timeout_ms=failure_ms) as cluster:
        bs = cluster.bootstrap_servers
        admin = Admin(bootstrap_servers=bs)
        topic = f"scale-ids-{uuid.uuid4().hex[:6]}"
        admin.create_topic(topic, partitions=3)
        admin.close()
        rss0 = rss(_sluice_pids(cluster))
        prefix = f"scale-id-{uuid.uuid4().hex[:6]}"
        t0 = time.perf_counter()
        for i in range(ids):
            pr = Producer(bootstrap_servers=bs, transactional_id=f"{prefix}-{i}")
            try:
                pr.init_transactions()
                pr.begin_transaction()
                pr.send(topic, value=b"x")
                pr.commit_transaction()
            finally:
                pr.close()
        p.figures["create_ids_s"] = time.perf_counter() - t0
        rss1 = rss(_sluice_pids(cluster))
        p.figures["broker_rss_before_mb"] = rss0 / 1e6
        p.figures["broker_rss_after_mb"] = rss1 / 1e6
        p.figures["rss_bytes_per_id"] = (rss1 - rss0) / ids
        # Failover: kill -9 broker 0 (with one broker it holds every coordinator; with three, some),
        # then time until an id that broker coordinated can be initialised again.
        victim = 0
        t0 = time.perf_counter()
        cluster.kill(victim)
        if brokers == 1:
            cluster.restart(victim, timeout=600.0)
        probe = Producer(bootstrap_servers=cluster.bootstrap_servers if brokers == 1 else
                         ",".join(cluster.address(i) for i in range(brokers) if i != victim),
                         transactional_id=f"{prefix}-0")  # fmt: skip
        try:
            probe.init_transactions(timeout=600.0)
        finally:
            probe.close()
        p.figures["coordinator_ready_after_kill_s"] = time.perf_counter() - t0
    print(_say(p), flush=True)
    if not kafka:
        return [p]
    q = _kafka_txnids(ids, brokers, judge, failure_ms)
    print(_say(q), flush=True)
    return [p, q]


def kafka_failure_detector(failure_ms: int) -> dict[str, str]:
    """Kafka settings for the same failure detection time as Sluice's ``failure_timeout_ms``: the
    KRaft controller fences a broker whose heartbeats stop for ``broker.session.timeout.ms``
    (Kafka's default 9 s, Sluice's LocalCluster's 5 s); heartbeats must come more often."""
    return {"broker.session.timeout.ms": str(failure_ms),
            "broker.heartbeat.interval.ms": str(max(100, min(2000, failure_ms // 4)))}  # fmt: skip


def _kafka_txnids(ids: int, brokers: int, judge: Judge, failure_ms: int) -> Point:
    from bench.kafka import driver
    from bench.kafka.cluster import KafkaCluster
    from bench.kafka.perf import tools_for

    q = Point("txnids", "kafka", ids)
    with judge.point(q), KafkaCluster(nodes=brokers, config=kafka_failure_detector(failure_ms)) as k, \
            tempfile.TemporaryDirectory(prefix="kbench-") as tmp:  # fmt: skip
        assert k.lib is not None
        topic = tools_for(k, Path(tmp)).create_topic("scale-ids")
        rss0 = rss(k.pids())
        prefix = f"scale-id-{uuid.uuid4().hex[:6]}"
        r = driver.run(k.lib, ["txnids", k.bootstrap_servers, topic, str(ids), prefix])
        rss1 = rss(k.pids())
        q.figures.update(create_ids_s=r["seconds"], broker_rss_before_mb=rss0 / 1e6, broker_rss_after_mb=rss1 / 1e6,
                         rss_bytes_per_id=(rss1 - rss0) / ids)  # fmt: skip
        # The probe JVM starts first (its start-up is not timed), bootstrapped at the nodes that survive.
        survivors = k.bootstrap_servers if brokers == 1 else ",".join(k.bootstrap_servers.split(",")[1:])
        probe = driver.Probe(k.lib, survivors, f"{prefix}-0")
        t0 = time.perf_counter()
        k.stop(1, hard=True)
        if brokers == 1:
            k.restart(1)
        waited = time.perf_counter() - t0
        q.figures["coordinator_ready_after_kill_s"] = waited + probe.go()
    return q


# -- catch-up and restart -----------------------------------------------------------------------


def _filled_topic(bs: str, name: str, nbytes: float) -> tuple[str, engine.BenchResult]:
    """A new 3-partition topic ``<name>-<random>`` with ``nbytes`` of 1 KiB records written by Sluice's client."""
    from sluice.client import Admin

    topic = f"{name}-{uuid.uuid4().hex[:6]}"
    admin = Admin(bootstrap_servers=bs)
    try:
        admin.create_topic(topic, partitions=3)
    finally:
        admin.close()
    return topic, _fill(bs, topic, nbytes)


def _fill(bs: str, topic: str, nbytes: float) -> engine.BenchResult:
    count = max(1000, int(nbytes / 1024))
    r = engine.produce(bs, name="scale-fill", record_size=1024, count=count, topic=topic, max_seconds=7200.0,
                       progress=False)  # fmt: skip
    if r.error:
        raise RuntimeError(f"filling failed: {r.error}")
    return r


def _read_all(bs: str, topic: str, partitions: int, count: int) -> float:
    """Seconds for a new consumer to read ``count`` records of ``topic`` from the start (bounded)."""
    from sluice.client import Consumer, TopicPartition

    consumer = Consumer(bootstrap_servers=bs, group_id=f"scale-{uuid.uuid4().hex[:6]}",
                        isolation_level="read_uncommitted", auto_offset_reset="earliest",
                        enable_auto_commit=False, max_poll_records=500)  # fmt: skip
    try:
        tps = [TopicPartition(topic, i) for i in range(partitions)]
        consumer.assign(tps)
        for tp, off in consumer.beginning_offsets(tps).items():
            consumer.seek(tp, off)
        got = 0
        t0 = time.perf_counter()
        deadline = t0 + 3600.0
        while got < count and time.perf_counter() < deadline:
            got += len(consumer.poll(timeout=1.0))
        if got < count:
            raise RuntimeError(f"read {got} of {count} records")
        return time.perf_counter() - t0
    finally:
        consumer.close()


def bench_catchup(
    gb: float, judge: Judge, kafka: bool, tools_on_sluice: bool = False, run: int = 1, kafka_first: bool = False
) -> list[Point]:
    """A consumer reading ``gb`` from the start. ``tools_on_sluice``: Sluice is read (and filled) by
    Kafka's own ConsumerPerformance and ProducerPerformance through its Kafka listener, the same
    client as on Kafka's side, so the difference is the brokers'. ``kafka_first``: Kafka's point
    is taken before Sluice's (rounds of ``--repeat`` alternate, so neither always runs second,
    on the first one's warm page cache and raised load average)."""
    points = [_kafka_catchup(gb, judge, run)] if kafka and kafka_first else []
    points.append(_sluice_catchup(gb, judge, tools_on_sluice, run))
    if kafka and not kafka_first:
        points.append(_kafka_catchup(gb, judge, run))
    return points


def _sluice_catchup(gb: float, judge: Judge, tools_on_sluice: bool, run: int) -> Point:
    from sluice.testing import LocalCluster

    p = Point("catchup", "sluice", gb, run=run)  # with tools_on_sluice the results are saved as catchup-kafka-tools
    with judge.point(p), LocalCluster(brokers=1, kafka_listener=tools_on_sluice) as cluster:
        if tools_on_sluice:
            from bench.kafka.fetch import ensure_jars
            from bench.kafka.perf import KafkaTools

            with tempfile.TemporaryDirectory(prefix="sbench-") as tmp:
                tools = KafkaTools(ensure_jars(), cluster.kafka_bootstrap_servers, Path(tmp), replication_factor=1,
                                   environment={"system": "sluice", "client": "kafka-tools"})  # fmt: skip
                p.figures.update(_tools_catchup(tools, gb))
        else:
            bs = cluster.bootstrap_servers
            topic, r = _filled_topic(bs, "scale-catchup", gb * 1e9)
            seconds = _read_all(bs, topic, 3, r.records)
            p.figures.update(catchup_mb_s=r.bytes / seconds / 1e6, catchup_s=seconds, bytes=r.bytes)
    print(_say(p), flush=True)
    return p


def _kafka_catchup(gb: float, judge: Judge, run: int) -> Point:
    from bench.kafka.cluster import KafkaCluster
    from bench.kafka.perf import tools_for

    q = Point("catchup", "kafka", gb, run=run)
    with judge.point(q), KafkaCluster(nodes=1) as k, tempfile.TemporaryDirectory(prefix="kbench-") as tmp:
        q.figures.update(_tools_catchup(tools_for(k, Path(tmp)), gb))
    print(_say(q), flush=True)
    return q


def catchup_rounds(
    gb: float, judge: Judge, kafka: bool, tools_on_sluice: bool, rounds: int, quiet_s: float
) -> list[Point]:
    """``rounds`` of :func:`bench_catchup`. Each round after the first waits (up to ``quiet_s``) for
    the load average that the previous round's JVMs and brokers left to fall, and is judged from
    its own start: otherwise every round after the first was marked busy."""
    points: list[Point] = []
    for run in range(1, rounds + 1):
        if run > 1:
            verdict.wait_quiet(judge.limits, judge.cpus, quiet_s)
            judge = Judge(judge.limits)
        points += bench_catchup(gb, judge, kafka, tools_on_sluice, run=run, kafka_first=run % 2 == 0)
    return points


def _tools_catchup(tools: Any, gb: float) -> dict[str, float]:
    """Kafka's ProducerPerformance fills a topic with ``gb`` of 1 KiB records, then ConsumerPerformance
    reads it all from the start (read_uncommitted): its figures."""
    tools.consumer_config.write_text(tools.consumer_config.read_text().replace(
        "isolation.level=read_committed", "isolation.level=read_uncommitted"))  # fmt: skip
    topic = tools.create_topic("scale-catchup")
    count = max(1000, int(gb * 1e9 / 1024))
    filled = tools.produce(name="scale-fill", record_size=1024, count=count, topic=topic)
    if filled.error:
        raise RuntimeError(filled.error)
    c = tools.consume(name="scale-catchup", record_size=1024, count=count, topic=topic, fill=False)
    if c.error:
        raise RuntimeError(c.error)
    return {"catchup_mb_s": c.mb_per_s, "catchup_s": c.seconds, "bytes": c.bytes}


def bench_restart(gb: float, judge: Judge, kafka: bool) -> list[Point]:
    from sluice.testing import LocalCluster

    p = Point("restart", "sluice", gb)
    with judge.point(p), LocalCluster(brokers=1, startup_timeout=1800.0) as cluster:
        _topic, r = _filled_topic(cluster.bootstrap_servers, "scale-restart", gb * 1e9)
        p.figures["bytes"] = r.bytes
        t0 = time.perf_counter()
        cluster.restart(0, timeout=1800.0)
        p.figures["clean_restart_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        cluster.kill(0)
        cluster.restart(0, timeout=1800.0)
        p.figures["kill9_restart_s"] = time.perf_counter() - t0
    points = [p]
    print(_say(p), flush=True)
    if kafka:
        from bench.kafka.cluster import KafkaCluster
        from bench.kafka.perf import tools_for

        q = Point("restart", "kafka", gb)
        with judge.point(q), KafkaCluster(nodes=1, start_timeout=1800.0) as k, \
                tempfile.TemporaryDirectory(prefix="kbench-") as tmp:  # fmt: skip
            tools = tools_for(k, Path(tmp))
            topic = tools.create_topic("scale-restart")
            filled = tools.produce(name="scale-fill", record_size=1024, count=max(1000, int(gb * 1e9 / 1024)),
                                   topic=topic)  # fmt: skip
            if filled.error:
                raise RuntimeError(filled.error)
            q.figures["bytes"] = filled.bytes
            q.figures["clean_restart_s"] = k.restart(1)
            q.figures["kill9_restart_s"] = k.restart(1, hard=True)
        points.append(q)
        print(_say(q), flush=True)
    return points


# -- output -------------------------------------------------------------------------------------


def _say(p: Point) -> str:
    figs = ", ".join(f"{k} {v:,.3g}" for k, v in p.figures.items())
    state = "valid" if p.valid else "NOT VALID: " + "; ".join(p.reasons + ([p.error] if p.error else []))
    rnd = f" run {p.run}" if p.run > 1 else ""
    return f"  {p.bench} {p.system} size {p.size:g}{rnd}: {figs} [load {p.load_1m:.2f}; {state}]"


def has_rounds(points: list[Point]) -> bool:
    """Whether the points come from several rounds (``--repeat``)."""
    return any(p.run > 1 for p in points)


def table(points: list[Point]) -> str:
    keys: list[str] = []
    for p in points:
        keys += [k for k in p.figures if k not in keys]
    rounds = has_rounds(points)
    run_head, run_rule = ("run | ", "---:|") if rounds else ("", "")
    rows = ["| benchmark | system | size | " + run_head + " | ".join(keys) + " | load avg | valid |",
            "|---|---|---:|" + run_rule + "---:|" * len(keys) + "---:|---|"]  # fmt: skip
    for p in points:
        vals = " | ".join(f"{p.figures[k]:,.3g}" if k in p.figures else "" for k in keys)
        ok = "yes" if p.valid else "NO (busy)" if not p.error else "NO (failed)"
        run = f"{p.run} | " if rounds else ""
        rows.append(f"| {p.bench} | {p.system} | {p.size:g} | {run}{vals} | {p.load_1m:.1f} | {ok} |")
    if rounds:
        rows += ["", *medians(points, keys)]
    notes: list[str] = []
    for system in ("sluice", "kafka"):
        mine = [p for p in points if p.system == system and not p.error]
        if len({p.size for p in mine}) < 2:
            continue
        for k in keys:
            if all(k in p.figures for p in mine):
                notes.append(f"- {system} {k}: {growth([p.size for p in mine], [p.figures[k] for p in mine])}")
    if notes:
        rows += ["", "Growth from the smallest to the largest size:", "", *notes]
    return "\n".join(rows)


def medians(points: list[Point], keys: list[str]) -> list[str]:
    """Per size and figure, each system's median over its valid rounds, and Sluice/Kafka."""
    lines = ["Medians over the valid rounds:", ""]
    for size in sorted({p.size for p in points}):
        for k in keys:
            med: dict[str, float] = {}
            said: list[str] = []
            for system in ("sluice", "kafka"):
                vals = [
                    p.figures[k] for p in points if (p.system, p.size) == (system, size) and p.valid and k in p.figures
                ]
                if vals:
                    med[system] = statistics.median(vals)
                    said.append(f"{system} {med[system]:,.3g} ({len(vals)} valid)")
            if said:
                ratio = f"; Sluice/Kafka {med['sluice'] / med['kafka']:.2f}" if len(med) == 2 and med["kafka"] else ""
                lines.append(f"- size {size:g}, {k}: {', '.join(said)}{ratio}")
    return lines if len(lines) > 2 else [*lines, "- none: no round was valid"]


def chart(points: list[Point], path: Path, title: str) -> bool:
    try:
        import matplotlib  # type: ignore[import-not-found, unused-ignore]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return False
    keys: list[str] = []
    for p in points:
        keys += [k for k in p.figures if k not in keys and k != "bytes"]
    if not keys:
        return False
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.8), squeeze=False)
    rounds = has_rounds(points)  # rounds of one size: dots, not a line
    for ax, k in zip(axes[0], keys, strict=True):
        for system, style in (("sluice", "o" if rounds else "o-"), ("kafka", "s" if rounds else "s--")):
            pts = [p for p in points if p.system == system and k in p.figures]
            if pts:
                ax.plot([p.size for p in pts], [p.figures[k] for p in pts], style, label=system)
        ax.set_title(k, fontsize=9)
        ax.set_xlabel(f"size ({points[0].bench})", fontsize=8)
        if len({p.size for p in points}) > 1:
            ax.set_xscale("log")
        ax.legend(fontsize=8)
    fig.suptitle(textwrap.fill(title, 40 * len(keys)), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def verdict_of(points: list[Point]) -> tuple[bool, str]:
    """Whether the points can be read, in words. One round: every point valid. Several rounds
    (``--repeat``): each system has a valid round at every size, since the medians take only
    those; the words count the valid rounds per system."""
    if not has_rounds(points):
        valid = all(p.valid for p in points)
        return valid, "valid" if valid else "NOT VALID (busy machine or a failed point)"
    groups: dict[tuple[str, float], list[Point]] = {}
    for p in points:
        groups.setdefault((p.system, p.size), []).append(p)
    valid = all(any(p.valid for p in group) for group in groups.values())
    counts = ", ".join(
        f"{system} {sum(p.valid for p in group)} of {len(group)}" for (system, _size), group in groups.items()
    )
    state = "valid" if valid else "NOT VALID (a system without a valid round)"
    return valid, f"{state}; valid rounds: {counts} (the medians take only those)"


def save(name: str, points: list[Point], smoke: bool, results: Path, judge: Judge) -> None:
    stem = f"scale-{name}" + ("-smoke" if smoke else "")
    results.mkdir(parents=True, exist_ok=True)
    valid, verdict_text = verdict_of(points)
    label = "SMOKE RUN (small sizes, not a measurement), " if smoke else ""
    header = (f"{label}bench/scale.py {name}, commit {engine.environment().get('git_commit', '')}, "
              f"{judge.cpus} CPUs: {verdict_text}")  # fmt: skip
    md = table(points)
    (results / f"{stem}.md").write_text(f"{header}\n\n{md}\n")
    record = {"header": header, "environment": engine.environment(), "valid": valid,
              "start_reasons": judge.start.reasons, "points": [asdict(p) for p in points]}  # fmt: skip
    (results / f"{stem}.json").write_text(json.dumps(record, indent=2) + "\n")
    chart(points, results / f"{stem}.png", header)
    print(f"\n{header}\n\n{md}\n\nsaved: {results / stem}.md/.json/.png", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bench", choices=("partitions", "producers", "txnids", "catchup", "restart", "all"))
    ap.add_argument("--smoke", action="store_true", help="small sizes: proves the harness, measures nothing")
    ap.add_argument("--kafka", action="store_true", help="also run Kafka where it has the same notion")
    ap.add_argument("--sluice-client", choices=("sluice", "kafka"), default="sluice",
                    help="catchup: what reads Sluice: its own Python client (default) or Kafka's own tools "
                         "through its Kafka listener, the same client as Kafka's side")  # fmt: skip
    ap.add_argument("--sizes", help="comma-separated sizes (partitions or producers)")
    ap.add_argument("--count", type=int, help="records produced per partitions point (default 200,000; smoke 5,000)")
    ap.add_argument("--seconds", type=float, help="seconds per producers point (default 20; smoke 3)")
    ap.add_argument("--records-per-txn", type=int, default=10)
    ap.add_argument("--ids", type=int, help="transactional ids (default 10,000; smoke 200)")
    ap.add_argument("--brokers", type=int, default=1, choices=(1, 3), help="txnids: brokers (3: failover)")
    ap.add_argument("--failure-timeout-ms", type=int, default=5000,
                    help="txnids: failure detection on both sides (Sluice failure_timeout_ms, Kafka "
                         "broker.session.timeout.ms; default 5000)")  # fmt: skip
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="catchup: rounds (default 1), Kafka first in every other one, each after the first waiting up to "
        "180 s (or --wait-quiet if longer) for the load to fall; medians of the valid rounds",
    )
    ap.add_argument("--gb", type=float, help="GB written first (catchup default 2, restart 5; smoke 0.05)")
    ap.add_argument("--max-foreign-share", type=float, default=verdict.Limits.max_foreign_share)
    ap.add_argument("--max-start-load", type=float, default=verdict.Limits.max_start_load_per_cpu)
    ap.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                    help="first wait up to SECONDS for the load average to fall under --max-start-load "
                         "(right after a test suite it is the suite's tail; default 0: no wait)")  # fmt: skip
    ap.add_argument("--results", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.repeat < 1 or (args.repeat > 1 and args.bench != "catchup"):
        ap.error("--repeat takes a count of at least 1, and only for catchup")
    limits = verdict.Limits(args.max_foreign_share, args.max_start_load)
    verdict.wait_quiet(limits, os.cpu_count() or 1, args.wait_quiet)
    judge = Judge(limits)
    if args.kafka:
        from bench.kafka.fetch import FetchError, ensure_jars

        try:
            ensure_jars()
        except FetchError as exc:
            print(f"scale: cannot fetch Apache Kafka: {exc}", file=sys.stderr)
            return 2
    print(f"scale: load average before {os.getloadavg()[0]:.2f} -> {judge.start.text()}", flush=True)
    sizes = [int(x) for x in args.sizes.split(",")] if args.sizes else None
    chosen = ["partitions", "producers", "txnids", "catchup", "restart"] if args.bench == "all" else [args.bench]
    failed = False
    runners: dict[str, Callable[[], list[Point]]] = {
        "partitions": lambda: bench_partitions(sizes or (SMOKE if args.smoke else FULL)["partitions"],  # type: ignore[arg-type]
                                               args.count or (5_000 if args.smoke else 200_000), judge, args.kafka),
        "producers": lambda: bench_producers(sizes or (SMOKE if args.smoke else FULL)["producers"],  # type: ignore[arg-type]
                                             args.seconds or (3.0 if args.smoke else 20.0), args.records_per_txn,
                                             judge, args.kafka),
        "txnids": lambda: bench_txnids(args.ids or (200 if args.smoke else 10_000), args.brokers, judge, args.kafka,
                                       args.failure_timeout_ms),
        "catchup": lambda: catchup_rounds(args.gb or (0.05 if args.smoke else 2.0), judge, args.kafka,
                                          args.sluice_client == "kafka", args.repeat, max(args.wait_quiet, 180.0)),
        "restart": lambda: bench_restart(args.gb or (0.05 if args.smoke else 5.0), judge, args.kafka),
    }  # fmt: skip
    for name in chosen:
        print(f"{name}:", flush=True)
        points = runners[name]()
        # txnids on three brokers is another benchmark (a failover, not a restart): its own files
        label = f"{name}-3brokers" if name == "txnids" and args.brokers == 3 else name
        if name == "catchup" and args.sluice_client == "kafka":
            label = "catchup-kafka-tools"  # both sides read by Kafka's ConsumerPerformance
        save(label, points, args.smoke, args.results, judge)
        failed = failed or any(p.error for p in points)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
