"""The partition soak: issue 30's probe as a command, many seeds of each fault schedule.

    python -m tests.integration.partition_soak --mode mixed --seeds 20 [--first-seed 5000] [--out FILE]
    python -m tests.integration.partition_soak --mode all --seeds 3

One *run* (:func:`run_one`) is: a fresh 3-broker :class:`~sluice.testing.LocalCluster` (RF 3,
``min.insync.replicas`` 2, the controller's failure timeout 1.5 s) with every process in a group
of its own (:class:`~sluice.testing.partitions.NetworkPartitions`); the topic ``queue`` of three
partitions; three transactional workers with the impatient profile
(:func:`tests.integration.queue_workload.workers`), a live read_committed reader and the
ListOffsets monitor; a few seconds of workload, then the mode's faults (each held 10-14 s, then
healed), then a wait for every partition's ISR to be whole again, a few more seconds of workload,
and the checks: the queue checker's verdict over a final read_committed read (every acknowledged
commit readable exactly once, nothing aborted visible, unknown outcomes all or nothing, order per
worker and partition, offsets never back, nothing read live vanished) and the replica consistency
check (:meth:`~sluice.testing.LocalCluster.check_replica_consistency`).

Modes (the probe's fault schedules; the seed draws victims, hold times and, for ``mixed``, the
sequence): ``none`` (no fault: one loss of issue 30 needed none), ``leader`` (a partition's leader
cut from its followers and the controller; clients still reach it), ``follower`` (a follower cut
from its leader), ``split`` ({A} | {B, C}, the controller on the side the seed picks),
``controller`` (the controller cut from every broker), ``kill`` (a leader isolated, killed -9
while cut off, healed and restarted), ``mixed`` (2-4 of those in a row).

Why here and why like this: the loss is rare and timing-dependent, so it is found by many short
seeded runs rather than one long one; a run is reproducible in its schedule (not in its timing),
so the seed and the event times are printed and kept. A failing run keeps its directory (broker
and controller logs, RocksDB data, ``run.json`` with the events, the verdict and every
transaction's outcome); a clean run's directory is removed. The summary (runs, seeds,
transactions committed/aborted/unknown, anomalies by kind) goes to ``--out`` (JSON, and Markdown
next to it). Every loop is bounded in count and time; a run that cannot finish its fault schedule
or recover is an *error* (counted apart from anomalies, its data kept too).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import shutil
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice import errors
from sluice.client import Admin, TopicPartition
from sluice.testing import LocalCluster
from sluice.testing.partitions import NetworkPartitions
from sluice.testing.replicas import ReplicaDivergence
from tests.support.waiting import wait_for

from . import queue_workload
from .helpers import OffsetMonitor, read_topic

MODES = ("none", "leader", "follower", "split", "controller", "kill", "mixed")
FAULTS = ("leader", "follower", "split", "controller", "kill")
TOPIC = "queue"
CONFIG = {
    "min.insync.replicas": "2",
    # the controller (1.5 s) acts before a cut-off leader would shrink its ISR on its own
    "replica.lag.time.max.ms": "10000",
}
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Timing:
    """A run's durations (seconds); :data:`SHORT` is what CI uses."""

    warmup: float = 4.0
    hold: tuple[float, float] = (10.0, 14.0)
    gap: tuple[float, float] = (2.0, 4.0)
    settle: float = 4.0
    no_fault: float = 20.0
    mixed_faults: tuple[int, int] = (2, 4)


DEFAULT = Timing()
SHORT = Timing(hold=(10.0, 12.0), mixed_faults=(2, 2), no_fault=12.0)


@dataclass
class RunResult:
    mode: str
    seed: int
    seconds: float = 0.0
    committed: int = 0
    aborted: int = 0
    unknown: int = 0
    unknown_visible: int = 0
    anomalies: dict[str, list[str]] = field(default_factory=dict)
    error: str = ""
    kept: str = ""  # the run's directory, kept when it failed
    events: list[tuple[float, str]] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return bool(self.anomalies or self.error)

    def line(self) -> str:
        state = "ANOMALY" if self.anomalies else ("ERROR" if self.error else "ok")
        kinds = ", ".join(f"{k} {len(v)}" for k, v in self.anomalies.items())
        return (
            f"[{self.mode} seed {self.seed}] {state} in {self.seconds:.0f}s: {self.committed} committed, "
            f"{self.aborted} aborted, {self.unknown} unknown ({self.unknown_visible} visible)"
            + (f"; {kinds}" if kinds else "")
            + (f"; error: {self.error.splitlines()[-1][:200]}" if self.error else "")
            + (f"; kept {self.kept}" if self.kept else "")
        )


class Run:
    """One run's cluster, network cuts and event log (see the module docstring)."""

    def __init__(self, cluster: LocalCluster, net: NetworkPartitions, rng: random.Random, timing: Timing) -> None:
        self.cluster = cluster
        self.net = net
        self.rng = rng
        self.timing = timing
        self.t0 = time.monotonic()
        self.events: list[tuple[float, str]] = []

    def event(self, what: str) -> None:
        t = time.monotonic() - self.t0
        self.events.append((round(t, 2), f"{time.strftime('%H:%M:%S', time.gmtime())} {what}"))
        print(f"    t+{t:5.1f}s {what}", flush=True)

    def endpoint(self, broker: int) -> tuple[int, ...]:
        b = self.cluster.broker(broker)
        return (broker, b.port, *([b.inter_broker_port] if b.inter_broker_port else []))

    def endpoints(self) -> list[tuple[int, ...]]:
        return [self.endpoint(b.broker_id) for b in self.cluster.brokers]

    def some_leader(self) -> tuple[int, int]:
        """(partition, its leader) of a partition the seed picks whose leader is known (bounded)."""
        partition = self.rng.randrange(queue_workload.PARTITIONS)
        leader = wait_for(
            lambda: (self.cluster.leader(TOPIC, partition) + 1) or None, timeout=30, what=f"a leader of {partition}"
        )
        return partition, leader - 1

    def hold(self) -> None:
        time.sleep(self.rng.uniform(*self.timing.hold))

    def heal(self) -> None:
        dropped = self.net.dropped_packets()
        self.net.heal()
        self.event(f"healed ({dropped} packets dropped)")

    # -- the faults -----------------------------------------------------------------------------

    def leader(self) -> None:
        partition, leader = self.some_leader()
        self.net.isolate(self.endpoint(leader), self.endpoints())
        self.event(f"leader b{leader} of {TOPIC}-{partition} cut from its followers and the controller")
        self.hold()
        self.heal()

    def follower(self) -> None:
        partition, leader = self.some_leader()
        follower = self.rng.choice([b for b in range(3) if b != leader])
        self.net.cut_brokers(self.endpoint(leader), self.endpoint(follower))
        self.event(f"follower b{follower} cut from b{leader}, leader of {TOPIC}-{partition}")
        self.hold()
        self.heal()

    def split(self) -> None:
        alone = self.rng.randrange(3)
        rest = [self.endpoint(b) for b in range(3) if b != alone]
        self.net.isolate(self.endpoint(alone), rest, controller=False)
        with_minority = self.rng.random() < 0.5
        for cut in rest if with_minority else [self.endpoint(alone)]:
            self.net.cut_controller(cut)
        side = f"{{b{alone}}}" if with_minority else "the majority"
        others = ", ".join(f"b{b[0]}" for b in rest)
        self.event(f"split {{b{alone}}} | {{{others}}}, the controller with {side}")
        self.hold()
        self.heal()

    def controller(self) -> None:
        for e in self.endpoints():
            self.net.cut_controller(e)
        self.event("the controller cut from every broker")
        self.hold()
        self.heal()

    def kill(self) -> None:
        partition, victim = self.some_leader()
        self.net.isolate(self.endpoint(victim), self.endpoints())
        self.event(f"b{victim} (leader of {TOPIC}-{partition}) cut from the others and the controller")
        total = self.rng.uniform(*self.timing.hold)
        time.sleep(total * self.rng.uniform(0.3, 0.6))
        self.cluster.kill(victim)
        self.event(f"b{victim} killed -9 while cut off")
        time.sleep(total * 0.4)
        self.heal()
        self.cluster.restart(victim, timeout=90)
        self.event(f"b{victim} restarted")

    def schedule(self, mode: str) -> list[Callable[[], None]]:
        if mode == "none":
            return []
        if mode == "mixed":
            n = self.rng.randint(*self.timing.mixed_faults)
            return [getattr(self, self.rng.choice(FAULTS)) for _ in range(n)]
        return [getattr(self, mode)]

    def wait_whole(self, timeout: float = 90.0) -> None:
        """Every broker healthy and every partition of the topic with its whole ISR (bounded)."""
        self.cluster.wait_until_healthy(timeout=timeout)
        for p in range(queue_workload.PARTITIONS):
            self.cluster.wait_for_partition(
                TOPIC, p, lambda s: len(s["isr"]) == 3 and s["leader"] >= 0, timeout=timeout, what="a whole ISR"
            )


def run_one(mode: str, seed: int, work: Path, timing: Timing = DEFAULT, keep_all: bool = False) -> RunResult:
    """One run of ``mode`` with ``seed`` in ``work/<mode>-<seed>`` (see the module docstring)."""
    result = RunResult(mode, seed)
    run_dir = work / f"{mode}-{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    rng = random.Random(f"{mode}-{seed}")
    started = time.monotonic()
    details: dict[str, Any] = {}
    workers: list[queue_workload.QueueProducer] = []
    try:
        with NetworkPartitions(run_dir / "net") as net:
            cluster = LocalCluster(
                brokers=3, data_dir=run_dir, config=CONFIG, failure_timeout_ms=1500, python=net.python
            )
            with cluster:
                run = Run(cluster, net, rng, timing)
                result.events = run.events  # the same list: events after the workload are kept too
                try:
                    details = _workload(run, mode, seed, workers)
                finally:
                    net.heal()
                result.seconds = time.monotonic() - started
                verdict = details.pop("verdict")
                result.committed, result.aborted = verdict.committed, verdict.aborted
                result.unknown, result.unknown_visible = verdict.unknown, verdict.unknown_visible
                result.anomalies = dict(verdict.anomalies)
                try:
                    details["batches_compared"] = cluster.check_replica_consistency(timeout=60)
                    run.event(f"replicas consistent ({details['batches_compared']} stored batches compared)")
                except ReplicaDivergence as exc:
                    result.anomalies["replica_divergence"] = exc.differences[:20]
                    run.event(f"replicas differ: {exc.differences[0]}")
    except Exception:
        result.error = traceback.format_exc()
    result.seconds = time.monotonic() - started
    if result.failed or keep_all:
        result.kept = str(run_dir)
        report = {
            "mode": mode,
            "seed": seed,
            "anomalies": result.anomalies,
            "error": result.error,
            "events": result.events,
            "details": details,
            "transactions": [t.to_json() for w in workers for t in w.history],
        }
        (run_dir / "run.json").write_text(json.dumps(report, indent=1, default=str))
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
    return result


def _workload(run: Run, mode: str, seed: int, workers: list[queue_workload.QueueProducer]) -> dict[str, Any]:
    """Start the workload, inject the faults, heal, check; the verdict and what explains it."""
    cluster = run.cluster
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    admin.create_topic(TOPIC, partitions=queue_workload.PARTITIONS, replication_factor=3)
    admin.close()
    tps = [TopicPartition(TOPIC, p) for p in range(queue_workload.PARTITIONS)]
    workers += queue_workload.workers(cluster.bootstrap_servers, TOPIC, 3, seed=seed, max_seconds=400)
    reader = queue_workload.LiveReader(cluster.bootstrap_servers, TOPIC)
    monitor = OffsetMonitor(cluster.bootstrap_servers, tps, interval=0.25, max_seconds=500).start()
    run.event("workload started")
    for w in workers:
        w.start()
    reader.start()
    try:
        wait_for(lambda: sum(len(w.committed) for w in workers) >= 3, timeout=60, what="commits before the faults")
        time.sleep(run.timing.warmup)
        faults = run.schedule(mode)
        if not faults:
            time.sleep(run.timing.no_fault)
        for i, fault in enumerate(faults):
            if i:
                time.sleep(run.rng.uniform(*run.timing.gap))
            fault()
        run.wait_whole()
        run.event("every partition's ISR whole again")
        before = sum(len(w.committed) for w in workers)
        time.sleep(run.timing.settle)
        wait_for(lambda: sum(len(w.committed) for w in workers) > before, timeout=60, what="commits after the faults")
    finally:
        for w in workers:
            w.stop_event.set()
        for w in workers:
            w.stop(timeout=120)
        run.event("workload stopped")
    stable = _wait_stable(cluster.bootstrap_servers, tps)
    run.event("LSO = HW on every partition" if stable else "LSO still below the HW after 60 s: reading anyway")
    final = read_topic(cluster.bootstrap_servers, TOPIC, limit_s=120)
    uncommitted = read_topic(cluster.bootstrap_servers, TOPIC, isolation_level="read_uncommitted", limit_s=120)
    reader.stop()
    monitor.stop()
    verdict = queue_workload.check(workers, final, reader, monitor.regressions())
    run.event(verdict.summary(mode).splitlines()[0])
    seen_uncommitted = {v for _p, _o, _k, v in uncommitted if v is not None}
    lost_anywhere = {v: (v.encode() in seen_uncommitted) for v in verdict.lost}
    states = {p: cluster.partition_state(TOPIC, p) for p in range(queue_workload.PARTITIONS)}
    return {
        "verdict": verdict,
        "lost_in_read_uncommitted": lost_anywhere,
        "partition_states": states,
        "producer_errors": {f"w{w.worker}": dict(w.errors) for w in workers},
        "producer_restarts": {f"w{w.worker}": w.restarts for w in workers},
        "monitor_failed_samples": monitor.failed_samples,
    }


def _wait_stable(bootstrap: str, tps: list[TopicPartition], timeout: float = 60.0) -> bool:
    """Wait (bounded) until no transaction is open: LSO = HW on every partition. A worker stopped right
    after giving up on a transaction leaves it open until the coordinator's timeout (20 s), and a
    read_committed read stops at the LSO: reading before would report later commits as lost."""
    admin = Admin(bootstrap_servers=bootstrap, request_timeout_ms=5_000)

    def stable() -> bool:
        try:
            hw = admin.list_offsets(dict.fromkeys(tps, Admin.LATEST), timeout=5)
            lso = admin.list_offsets(dict.fromkeys(tps, Admin.LATEST), isolation_level="read_committed", timeout=5)
        except errors.SluiceError:
            return False
        return all(hw[tp].offset == lso[tp].offset for tp in tps)

    try:
        wait_for(stable, timeout=timeout, interval=0.5, what="LSO = HW")
        return True
    except AssertionError:
        return False
    finally:
        admin.close()


def summarize(results: list[RunResult], seconds: float) -> dict[str, Any]:
    by_mode: dict[str, dict[str, Any]] = {}
    for r in results:
        m = by_mode.setdefault(
            r.mode, {"runs": 0, "seeds": [], "committed": 0, "aborted": 0, "unknown": 0, "unknown_visible": 0,
                     "anomalies": Counter(), "failed_runs": [], "errors": 0}
        )  # fmt: skip
        m["runs"] += 1
        m["seeds"].append(r.seed)
        for k in ("committed", "aborted", "unknown", "unknown_visible"):
            m[k] += getattr(r, k)
        for kind, items in r.anomalies.items():
            m["anomalies"][kind] += len(items)
        m["errors"] += bool(r.error)
        if r.failed:
            m["failed_runs"].append({"seed": r.seed, "kept": r.kept, "line": r.line()})
    for m in by_mode.values():
        m["anomalies"] = dict(m["anomalies"])
    return {
        "runs": len(results),
        "seconds": round(seconds),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "modes": by_mode,
    }


def markdown(summary: dict[str, Any]) -> str:
    lines = [
        f"# Partition soak: {summary['runs']} runs in {summary['seconds']} s ({summary['finished']})",
        "",
        "| mode | runs | seeds | committed | aborted | unknown (visible) | anomalies | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mode, m in summary["modes"].items():
        seeds = f"{min(m['seeds'])}-{max(m['seeds'])}"
        anomalies = ", ".join(f"{k} {n}" for k, n in m["anomalies"].items()) or "0"
        lines.append(
            f"| {mode} | {m['runs']} | {seeds} | {m['committed']} | {m['aborted']} | "
            f"{m['unknown']} ({m['unknown_visible']}) | {anomalies} | {m['errors']} |"
        )
    for mode, m in summary["modes"].items():
        for f in m["failed_runs"]:
            lines.append(f"\n- {mode} seed {f['seed']}: {f['line']}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.integration.partition_soak", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--mode", default="mixed", choices=[*MODES, "all"])
    parser.add_argument("--seeds", type=int, default=10, help="seeds per mode")
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument(
        "--out", type=Path, default=None, help="summary JSON (default bench/results/partition-soak-<time>.json)"
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/sluice-partition-soak"), help="runs' directories")
    parser.add_argument("--max-minutes", type=float, default=24 * 60, help="start no run after this long")
    parser.add_argument("--short", action="store_true", help="CI's shorter timing")
    parser.add_argument("--keep-all", action="store_true", help="keep every run's directory, not only failing ones")
    args = parser.parse_args(argv)
    modes = list(MODES) if args.mode == "all" else [args.mode]
    out = args.out or ROOT / "bench" / "results" / f"partition-soak-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    timing = SHORT if args.short else DEFAULT
    started = time.monotonic()
    results: list[RunResult] = []
    total = len(modes) * args.seeds
    # seeds outer, modes inner: a run cut short by --max-minutes leaves every mode with about as many seeds
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for mode in modes:
            if time.monotonic() - started > args.max_minutes * 60:
                print(f"stopping: --max-minutes {args.max_minutes} reached", flush=True)
                break
            print(f"run {len(results) + 1}/{total}: mode {mode} seed {seed}", flush=True)
            result = run_one(mode, seed, args.work, timing, keep_all=args.keep_all)
            results.append(result)
            print(result.line(), flush=True)
            failed = sum(r.failed for r in results)
            print(
                f"progress: {len(results)}/{total} runs, {failed} failed, {(time.monotonic() - started) / 60:.1f} min",
                flush=True,
            )
            summary = summarize(results, time.monotonic() - started)
            out.write_text(json.dumps(summary, indent=1))
            out.with_suffix(".md").write_text(markdown(summary))
        else:
            continue
        break
    print(f"summary: {out} and {out.with_suffix('.md')}", flush=True)
    with contextlib.suppress(Exception):
        print(markdown(summarize(results, time.monotonic() - started)))
    return 1 if any(r.failed for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
