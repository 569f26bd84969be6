#!/usr/bin/env python3
"""Sluice and Apache Kafka side by side on this machine: the standard benchmark set on both.

    python bench/compare_kafka.py                 # 1 broker each, the set 3 times, medians (~15 min)
    python bench/compare_kafka.py --brokers 3     # 3 brokers each, replication factor 3, min.insync 2
    python bench/compare_kafka.py --smoke         # tiny counts, once: proves the harness end to end
    python bench/compare_kafka.py --sluice-client kafka   # Kafka's own tools against both (issue 18)
    python bench/compare_kafka.py --brokers 3 --kafka-inter-broker-tls   # Kafka replicating over mutual TLS too

One system after the other (Sluice first, then Kafka), each on a fresh cluster of ``--brokers``
(Sluice: ``sluice.testing.LocalCluster``; Kafka 4.3.1 in KRaft mode: ``bench/kafka``, jars fetched
from Maven Central with Maven on first use), each with an unrecorded warm-up produce, then the five
benchmarks of ``bench/run_all.py`` ``--repeat`` times with the same parameters (3 partitions,
idempotent, acks=all, linger 5 ms, batch 256 KiB, no compression, the same 64 record values):

1. produce 1 KiB -> MB/s            2. produce 100 B -> records/s
3. transactions 1 KiB, commit every 100 ms -> MB/s
4. consume read_committed 1 KiB -> MB/s     5. latency at a steady 10 MB/s -> p99 ms

Sluice runs with its own Python client (``sluice.cli.engines.bench``, what ``sluice bench`` runs),
Kafka with its own JVM tools (``ProducerPerformance``, ``ConsumerPerformance``). MB is 10^6 bytes for
both.

``--sluice-client kafka`` drives Sluice with the same JVM tools instead, through its Kafka-protocol
listener (``LocalCluster(kafka_listener=True)``): the same client, the same parameters, the same
topic creation (``TopicCommand``) against both systems, one after the other, so the client's cost
is the same on both sides and the difference is the brokers. Its results are saved as
``kafka-compare-<N>broker-kafka-tools.*``. ConsumerPerformance joins a consumer group through the
classic protocol (JoinGroup/SyncGroup), which the listener serves; a broker without it fails that
row and says so.

For every run the harness also records, from /proc:

* the CPU seconds of the broker processes (for Sluice the brokers and the local controller, for
  Kafka the broker JVMs, whose controller runs inside them) during the timed part, reported as
  **broker CPU seconds per GB produced and per GB consumed**: the figure that does not depend on
  the number of cores;
* the 1-minute load average at the end of the run, and the CPU other processes used meanwhile.
  A run during which other processes took more than 10% of the machine, or a comparison that
  started at a load average above 0.5 per core, is **not valid** (``bench/verdict.py``): its
  figures are printed and saved, marked so, and the verdict says not to quote them.

Output: the table on stdout and in ``bench/results/kafka-compare-<N>broker.md``, every run with its
parameters and load in ``kafka-compare-<N>broker.json`` (and appended to ``kafka-compare-runs.json``),
the chart in ``kafka-compare-<N>broker.png`` (matplotlib: ``pip install -e '.[bench]'``).
Smoke runs write ``...-smoke.*`` instead, and a comparison whose verdict is not valid
``...-not-valid.*``, so neither ever replaces the last valid measurement (every run is appended to
``kafka-compare-runs.json`` whatever its verdict).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

if __name__ == "__main__":
    # Run as a file, Python puts bench/ first on the path, where bench/kafka would shadow any
    # package named kafka; the harness imports itself as bench.* from the repository root instead.
    sys.path[0] = str(ROOT)

from bench import sidebyside, sysstat, verdict  # noqa: E402
from bench.kafka.cluster import KafkaCluster  # noqa: E402
from bench.kafka.fetch import DEFAULT_VERSION, FetchError, ensure_jars  # noqa: E402
from bench.kafka.perf import KafkaTools, tools_for  # noqa: E402
from sluice.cli.engines import bench as engine  # noqa: E402

RESULTS = ROOT / "bench" / "results"


@dataclass(frozen=True)
class Spec:
    """One benchmark of the set, with its counts already scaled."""

    name: str
    kind: str
    record_size: int
    count: int = 0
    commit_interval_ms: int | None = None
    seconds: float = 0.0


def the_set(scale: float, latency_min_s: float = 5.0) -> list[Spec]:
    """run_all.py's set: the same counts, times ``scale`` (at least 1,000 records)."""

    def n(count: int) -> int:
        return max(1000, int(count * scale))

    return [
        Spec("produce-1KiB-acks-all", "produce", 1024, n(200_000)),
        Spec("produce-100B-acks-all", "produce", 100, n(500_000)),
        Spec("transactions-1KiB-100ms", "transactions", 1024, n(200_000), commit_interval_ms=100),
        Spec("consume-read_committed-1KiB", "consume", 1024, n(200_000)),
        Spec("latency-10MBps-1KiB", "latency", 1024, seconds=max(latency_min_s, 30.0 * scale)),
    ]


class Meter:
    """Samples the brokers' process trees and the harness's own tree while runs happen, and turns a
    run into a :class:`sidebyside.Measured` with its broker CPU and its verdict."""

    def __init__(self, broker_pids: list[int], limits: verdict.Limits, interval: float = 0.2) -> None:
        self.sampler = sysstat.Sampler({"broker": broker_pids, "ours": [os.getpid()]}, interval=interval)
        self.limits = limits
        self.cpus = os.cpu_count() or 1

    def __enter__(self) -> Meter:
        self.sampler.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.sampler.__exit__(*exc)

    def measure(self, system: str, run: str, fn: Callable[[], tuple[Any, float, float]]) -> sidebyside.Measured:
        """``fn`` returns (BenchResult, timed_start, timed_end) in perf_counter time; broker CPU is
        counted in the timed window, the verdict over the whole call."""
        self.sampler.take()
        t0 = time.perf_counter()
        result, w0, w1 = fn()
        self.sampler.take()
        t1 = time.perf_counter()
        load = verdict.RunLoad(
            wall_s=t1 - t0,
            machine_busy_s=self.sampler.machine_between(t0, t1),
            own_cpu_s=self.sampler.cpu_between("ours", t0, t1),
            cpus=self.cpus,
            load_1m_after=os.getloadavg()[0],
        )
        v = verdict.judge_run(load, self.limits)
        return sidebyside.Measured.from_result(
            system, result, broker_cpu_s=self.sampler.cpu_between("broker", w0, w1), load_1m=load.load_1m_after,
            foreign_share=round(load.foreign_share, 4), valid=v.valid, reasons=v.reasons, run=run,
        )  # fmt: skip


def _timed(fn: Callable[[], Any], end: Callable[[], float] | None = None) -> Callable[[], tuple[Any, float, float]]:
    """Wrap a bench call. The broker CPU window is the result's own timed seconds, ending where the
    call returned (Sluice: after the timed part only the client's close and the topic's deletion
    follow) or at ``end()`` (Kafka: the perf tool's exit, before the topic is deleted). So the
    topic's creation, the producer's start-up and the consume benchmark's untimed fill are not
    counted, for either system."""

    def run() -> tuple[Any, float, float]:
        t0 = time.perf_counter()
        r = fn()
        t1 = time.perf_counter()
        w1 = min(t1, end()) if end is not None and end() > t0 else t1
        return r, (max(t0, w1 - r.seconds) if r.seconds > 0 else t0), w1

    return run


def sluice_runs(specs: list[Spec], brokers: int, repeat: int, warmup: int, meter_limits: verdict.Limits,
                progress: Callable[[str], None]) -> list[sidebyside.Measured]:  # fmt: skip
    from sluice.testing import LocalCluster

    out: list[sidebyside.Measured] = []
    with LocalCluster(brokers=brokers) as cluster:
        bootstrap = cluster.bootstrap_servers
        pids = [b.pid for b in cluster.brokers if b.pid] + [p for p in [cluster.controller.pid] if p]
        engine.produce(bootstrap, name="warm-up", record_size=1024, count=warmup, max_seconds=60.0, progress=False)
        with Meter(pids, meter_limits) as meter:
            for i in range(repeat):
                for s in specs:
                    fn = _sluice_call(bootstrap, s)
                    m = meter.measure("sluice", f"{i + 1}/{repeat}", fn)
                    out.append(m)
                    progress(_line(m))
    return out


def _sluice_call(bootstrap: str, s: Spec) -> Callable[[], tuple[Any, float, float]]:
    if s.kind == "consume":
        # bench.consume fills its topic (untimed) inside the call: count the broker CPU of the
        # timed read only, the result's seconds up to the call's return.
        return _timed(lambda: engine.consume(bootstrap, name=s.name, record_size=s.record_size, count=s.count,
                                             progress=False))  # fmt: skip
    if s.kind == "latency":
        return _timed(lambda: engine.latency(bootstrap, name=s.name, record_size=s.record_size, seconds=s.seconds,
                                             progress=False))  # fmt: skip
    return _timed(lambda: engine.produce(bootstrap, name=s.name, record_size=s.record_size, count=s.count,
                                         commit_interval_ms=s.commit_interval_ms, progress=False))  # fmt: skip


def kafka_runs(specs: list[Spec], brokers: int, repeat: int, warmup: int, meter_limits: verdict.Limits,
               progress: Callable[[str], None], heap: str, inter_broker_tls: bool = False,
               ) -> list[sidebyside.Measured]:  # fmt: skip
    with KafkaCluster(nodes=brokers, heap=heap, inter_broker_tls=inter_broker_tls) as kafka, \
            tempfile.TemporaryDirectory(prefix="kbench-") as tmp:  # fmt: skip
        return tools_runs("kafka", tools_for(kafka, Path(tmp)), kafka.pids(), specs, repeat, warmup, meter_limits,
                          progress)  # fmt: skip


def sluice_tools_runs(specs: list[Spec], brokers: int, repeat: int, warmup: int, meter_limits: verdict.Limits,
                      progress: Callable[[str], None], kafka_version: str) -> list[sidebyside.Measured]:  # fmt: skip
    """The set on Sluice driven by Kafka's own tools through every broker's Kafka listener."""
    from sluice.testing import LocalCluster

    with LocalCluster(brokers=brokers, kafka_listener=True) as cluster, \
            tempfile.TemporaryDirectory(prefix="sbench-") as tmp:  # fmt: skip
        env = {"kafka_tools": kafka_version, "nodes": brokers, "client": "kafka-tools"}
        tools = KafkaTools(ensure_jars(kafka_version), cluster.kafka_bootstrap_servers, Path(tmp),
                           replication_factor=min(brokers, 3), environment={"system": "sluice", **env})  # fmt: skip
        pids = [b.pid for b in cluster.brokers if b.pid] + [p for p in [cluster.controller.pid] if p]
        return tools_runs("sluice", tools, pids, specs, repeat, warmup, meter_limits, progress)


def tools_runs(system: str, tools: KafkaTools, pids: list[int], specs: list[Spec], repeat: int, warmup: int,
               meter_limits: verdict.Limits, progress: Callable[[str], None]) -> list[sidebyside.Measured]:  # fmt: skip
    """The set, driven by Kafka's tools against ``tools``' bootstrap servers, the brokers ``pids`` metered."""
    out: list[sidebyside.Measured] = []
    tools.produce(name="warm-up", record_size=1024, count=warmup)
    with Meter(pids, meter_limits) as meter:
        for i in range(repeat):
            for s in specs:
                m = meter.measure(system, f"{i + 1}/{repeat}", _kafka_call(tools, s))
                out.append(m)
                progress(_line(m))
    return out


def _kafka_call(tools: KafkaTools, s: Spec) -> Callable[[], tuple[Any, float, float]]:
    if s.kind == "latency":
        return _timed(lambda: tools.latency(name=s.name, record_size=s.record_size, seconds=s.seconds),
                      lambda: tools.tool_end)  # fmt: skip
    if s.kind != "consume":
        return _timed(lambda: tools.produce(name=s.name, record_size=s.record_size, count=s.count,
                                            commit_interval_ms=s.commit_interval_ms),
                      lambda: tools.tool_end)  # fmt: skip

    def consume() -> tuple[Any, float, float]:
        # The fill is not timed and its broker CPU is not counted: the window is the consumer tool's
        # timed seconds (fetch.time.ms) up to its exit.
        topic = tools.create_topic(f"bench-{s.name}")
        try:
            filled = tools.produce(name="fill", record_size=s.record_size, count=s.count, commit_interval_ms=100,
                                   topic=topic)  # fmt: skip
            t0 = time.perf_counter()
            r = tools.consume(name=s.name, record_size=s.record_size, count=s.count, topic=topic, fill=False)
            t1 = tools.tool_end if tools.tool_end > t0 else time.perf_counter()
            if filled.error and not r.error:
                r.error = f"filling the topic failed: {filled.error}"
            return r, max(t0, t1 - r.seconds), t1
        finally:
            with contextlib.suppress(Exception):
                tools.delete_topic(topic)

    return consume


def _line(m: sidebyside.Measured) -> str:
    label, value, _ = sidebyside.figure_of(m)
    state = "ok" if m.valid else "BUSY"
    err = f" FAILED: {m.error}" if m.error else ""
    return (f"  {m.system:6} {m.name:30} run {m.run}: {value:,.1f} {label}, {m.mb_per_s:.1f} MB/s, "
            f"broker CPU {m.broker_cpu_s:.2f} s, load {m.load_1m:.2f}, others {m.foreign_share:.0%} "
            f"[{state}]{err}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--brokers", type=int, default=1, choices=(1, 3), help="brokers (Kafka: nodes) of each cluster")
    ap.add_argument("--repeat", type=int, default=3, help="runs of the set per system; medians reported (default 3)")
    ap.add_argument("--scale", type=float, default=1.0, help="record counts x this (run_all --quick is 0.1)")
    ap.add_argument("--smoke", action="store_true",
                    help="smoke run: --scale 0.05 --repeat 1, 3 s of latency; saved as *-smoke.*")  # fmt: skip
    ap.add_argument("--only", choices=("sluice", "kafka"), help="run one system only (no ratios)")
    ap.add_argument("--sluice-client", choices=("sluice", "kafka"), default="sluice",
                    help="what drives Sluice: its own Python client (default) or Kafka's own tools through "
                         "its Kafka listener, the same client as Kafka's side")  # fmt: skip
    ap.add_argument("--kafka-version", default=DEFAULT_VERSION)
    ap.add_argument("--kafka-heap", default="1g", help="Kafka broker heap (-Xms = -Xmx; default 1g)")
    ap.add_argument("--kafka-inter-broker-tls", action="store_true",
                    help="Kafka's brokers replicate over mutual TLS, as Strimzi runs them and as Sluice's "
                         "always do (default: plaintext, Kafka's default); results saved as *-kafka-tls.*")  # fmt: skip
    ap.add_argument("--max-foreign-share", type=float, default=verdict.Limits.max_foreign_share,
                    help="a run is not valid when other processes used more than this share of the CPU")  # fmt: skip
    ap.add_argument("--max-start-load", type=float, default=verdict.Limits.max_start_load_per_cpu,
                    help="not valid when the 1-min load average per CPU before the first run exceeds this")  # fmt: skip
    ap.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                    help="first wait up to SECONDS for the load average to fall under --max-start-load "
                         "(right after a test suite it is the suite's tail; default 0: no wait)")  # fmt: skip
    ap.add_argument("--results", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.repeat < 1 or args.scale <= 0:
        ap.error("--repeat must be >= 1 and --scale > 0")
    limits = verdict.Limits(max_foreign_share=args.max_foreign_share, max_start_load_per_cpu=args.max_start_load)
    # Before anything of ours runs: only other work is in this load average.
    cpus = os.cpu_count() or 1
    verdict.wait_quiet(limits, cpus, args.wait_quiet)
    start_load = os.getloadavg()
    start = verdict.judge_start(start_load[0], cpus, limits)
    repeat, scale, lat_min = (1, 0.05, 3.0) if args.smoke else (args.repeat, args.scale, 5.0)
    specs = the_set(scale, lat_min)
    warmup = max(1000, int(50_000 * scale))
    print(f"compare_kafka: {args.brokers} broker(s), {repeat} run(s) of the set, scale {scale}"
          f"{' (SMOKE)' if args.smoke else ''}; load average before: {start_load[0]:.2f} on {cpus} CPUs "
          f"-> {start.text()}", flush=True)  # fmt: skip
    env = engine.environment()  # the commit measured: taken before the runs, not after
    tools_on_sluice = args.sluice_client == "kafka"
    if args.only != "sluice" or tools_on_sluice:
        try:
            ensure_jars(args.kafka_version)  # before any clock runs
        except FetchError as exc:
            print(f"compare_kafka: cannot fetch Apache Kafka {args.kafka_version}: {exc}", file=sys.stderr)
            return 2

    def say(s: str) -> None:
        print(s, flush=True)

    runs: list[sidebyside.Measured] = []
    if args.only != "kafka" and tools_on_sluice:
        say(f"Sluice {args.brokers} broker(s), Kafka {args.kafka_version}'s tools through the Kafka listener:")
        runs += sluice_tools_runs(specs, args.brokers, repeat, warmup, limits, say, args.kafka_version)
    elif args.only != "kafka":
        say(f"Sluice {args.brokers} broker(s):")
        runs += sluice_runs(specs, args.brokers, repeat, warmup, limits, say)
    if args.only != "sluice":
        tls_note = ", replicating over mutual TLS" if args.kafka_inter_broker_tls else ""
        say(f"Apache Kafka {args.kafka_version} {args.brokers} node(s){tls_note}:")
        runs += kafka_runs(specs, args.brokers, repeat, warmup, limits, say, args.kafka_heap,
                           args.kafka_inter_broker_tls)  # fmt: skip
    sluice_name = "Sluice (Kafka listener)" if tools_on_sluice else "Sluice"
    comp = sidebyside.Comparison(args.brokers, runs, start.valid, start.reasons, "smoke" if args.smoke else "",
                                 sluice_name)  # fmt: skip
    md = sidebyside.table(comp)
    vtext = sidebyside.verdict_text(comp)
    stem = results_stem(args.brokers, tools_on_sluice, args.kafka_inter_broker_tls, args.smoke, comp.valid)
    args.results.mkdir(parents=True, exist_ok=True)
    both_tools = "both driven by Kafka's own tools, " if tools_on_sluice else ""
    header = (f"{'SMOKE RUN (tiny counts, not a measurement): ' if args.smoke else ''}"
              f"{sluice_name} vs Apache Kafka {args.kafka_version}"
              f"{' (inter-broker mutual TLS)' if args.kafka_inter_broker_tls else ''}, {args.brokers} broker(s), "
              f"{both_tools}median of {repeat}, "
              f"scale {scale}, commit {env.get('git_commit', '')}, {cpus} CPUs, "
              f"load average before {start_load[0]:.2f}")  # fmt: skip
    (args.results / f"{stem}.md").write_text(f"{header}\n\n{md}\n\n{vtext}\n")
    record = {
        "header": header, "brokers": args.brokers, "repeat": repeat, "scale": scale, "smoke": args.smoke,
        "sluice_client": args.sluice_client, "kafka_inter_broker_tls": args.kafka_inter_broker_tls,
        "start_load_average": start_load, "environment": env, "valid": comp.valid,
        "reasons": comp.reasons(), "runs": [asdict(m) for m in runs],
    }  # fmt: skip
    (args.results / f"{stem}.json").write_text(json.dumps(record, indent=2) + "\n")
    engine.append_result(args.results / "kafka-compare-runs.json", record)
    print(f"\n{header}\n\n{md}\n\n{vtext}")
    if sidebyside.chart(comp, args.results / f"{stem}.png"):
        print(f"\nchart: {args.results / f'{stem}.png'}")
    else:
        print("\n(no chart: matplotlib is not installed; pip install -e '.[bench]')")
    return 1 if any(m.error for m in runs) else 0


def results_stem(brokers: int, tools_on_sluice: bool, kafka_tls: bool, smoke: bool, valid: bool) -> str:
    """The results files' name: a smoke run or a comparison that is not valid never takes the name of
    the real measurement, so the last valid one stays where the docs point."""
    stem = f"kafka-compare-{brokers}broker" + ("-kafka-tools" if tools_on_sluice else "")
    stem += "-kafka-tls" if kafka_tls else ""
    if smoke:
        return stem + "-smoke"
    return stem if valid else stem + "-not-valid"


if __name__ == "__main__":
    sys.exit(main())
