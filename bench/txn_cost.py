"""Where a replicated transaction's broker CPU goes, round after round on one cluster.

    python bench/txn_cost.py --brokers 3 --rounds 3 --count 50000
    python bench/txn_cost.py --kind produce --rounds 3          # the plain acks=all producer instead
    python bench/txn_cost.py --profile-dir /tmp/prof            # also a py-spy profile per broker and round

Each round runs ``sluice bench transactions`` (or ``produce``) as a subprocess against the same
LocalCluster, as ``compare_kafka.py`` runs its set, and prints figures that do not depend on how
busy the machine is, so they can be taken on a shared machine:

* broker CPU seconds per transaction and per MB, split by thread: the event loop (the main
  thread), gRPC's threads, RocksDB's background threads (flushes, compactions), the rest;
* requests per committed transaction, by RPC, summed over the brokers
  (``kafka_network_requestmetrics_requests_total``): AddPartitionsToTxn beyond one per
  transaction are CONCURRENT_TRANSACTIONS retries, ReplicaFetch per transaction shows how often
  followers wake up;
* RocksDB: level-0 files at the end of the round, write stalls (delays and stops) and bytes
  written by compactions during it (``sluice_rocksdb_*``), per broker summed.

CPU comes from ``/proc/PID/task/TID/stat`` (utime + stime), so work that outlives a round (a
compaction) is counted in the round it falls in. With ``--profile-dir`` each broker is sampled
by ``py-spy record --threads -f raw`` during the round (py-spy must be installed); the profiles
are flame-graph input, one file per broker and round.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice.testing import LocalCluster, scrape

CLK_TCK = os.sysconf("SC_CLK_TCK")


def thread_group(pid: int, tid: int, comm: str) -> str:
    """The part of a broker a thread belongs to, from its id and name."""
    if tid == pid:
        return "event loop"
    if comm.startswith("rocksdb"):
        return "rocksdb"
    if comm.startswith(("grpc", "event_engine", "lifeguard")):
        return "grpc core"
    if comm.startswith("python"):
        return "python threads"  # gRPC aio's poller (_poll_wrapper), the reclaim thread
    return "other"


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of one process by thread group (threads that exited are lost: none of interest do)."""
    out: dict[str, float] = defaultdict(float)
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
            comm = (task / "comm").read_text().strip()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        out[thread_group(pid, int(task.name), comm)] += (int(fields[11]) + int(fields[12])) / CLK_TCK
    return dict(out)


def process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


@dataclass
class Snapshot:
    cpu: dict[str, float] = field(default_factory=dict)  # thread group -> seconds, all brokers
    controller_cpu: float = 0.0
    requests: dict[str, float] = field(default_factory=dict)  # RPC -> answered, all brokers
    stall_seconds: float = 0.0
    stalls: dict[str, float] = field(default_factory=dict)  # RocksDB's cause -> count
    compaction_bytes: float = 0.0
    level0_files: float = 0.0
    commits: float = 0.0
    wakeups: dict[str, float] = field(default_factory=dict)  # "wait/result" -> long-poll wake-ups


def snapshot(cluster: LocalCluster, brokers: int) -> Snapshot:
    snap = Snapshot()
    cpu: dict[str, float] = defaultdict(float)
    requests: dict[str, float] = defaultdict(float)
    stalls: dict[str, float] = defaultdict(float)
    wakeups: dict[str, float] = defaultdict(float)
    for i in range(brokers):
        pid = cluster.broker(i).pid
        assert pid is not None
        for group, seconds in thread_cpu(pid).items():
            cpu[group] += seconds
        m = scrape(cluster.metrics_url(i))
        for labels, value in m.series("kafka_network_requestmetrics_requests_total"):
            requests[labels.get("request", "?")] += value
        for labels, value in m.series("sluice_rocksdb_write_stalls_total"):
            stalls[labels.get("cause", "?")] += value
        for labels, value in m.series("sluice_long_poll_wakeups_total"):
            wakeups[f"{labels.get('wait')}/{labels.get('result')}"] += value
        snap.stall_seconds += m.total("sluice_rocksdb_write_stall_seconds_total")
        snap.compaction_bytes += m.total("sluice_rocksdb_compaction_written_bytes_total")
        snap.level0_files += m.total("sluice_rocksdb_level0_files")
        snap.commits += m.total("sluice_transaction_coordinator_commits_total")
    controller = cluster.controller.pid
    snap.controller_cpu = process_cpu(controller) if controller is not None else 0.0
    snap.cpu, snap.requests, snap.stalls, snap.wakeups = dict(cpu), dict(requests), dict(stalls), dict(wakeups)
    return snap


def run_round(cluster: LocalCluster, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    argv = [
        sys.executable, "-m", "sluice", "bench", args.kind, "--bootstrap-server", cluster.bootstrap_servers,
        "--count", str(args.count), "--record-size", str(args.record_size), "--no-progress", "--output", str(out),
    ]  # fmt: skip
    if args.kind == "transactions":
        argv += ["--commit-interval-ms", str(args.commit_interval_ms)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not out.exists():
        raise SystemExit(f"bench round failed ({done.returncode}): {done.stderr[-2000:]}")
    lines = out.read_text().strip()
    data = json.loads(lines)
    result: dict[str, Any] = data[-1] if isinstance(data, list) else data
    out.unlink()
    return result


def start_profiles(
    cluster: LocalCluster, brokers: int, directory: Path, round_no: int, native: bool
) -> list[subprocess.Popen[bytes]]:
    directory.mkdir(parents=True, exist_ok=True)
    procs = []
    for i in range(brokers):
        path = directory / f"round{round_no}-broker{i}.txt"
        argv = ["py-spy", "record", "--threads", "-r", "50", "-f", "raw", "-o", str(path)]
        argv += ["-p", str(cluster.broker(i).pid), *(["--native"] if native else [])]
        procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return procs


def stop_profiles(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.send_signal(signal.SIGINT)
    for p in procs:
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()


def report(round_no: int, result: dict[str, Any], before: Snapshot, after: Snapshot) -> dict[str, Any]:
    txns = after.commits - before.commits
    mb = float(result.get("bytes", 0)) / 1e6
    cpu = {g: after.cpu.get(g, 0.0) - before.cpu.get(g, 0.0) for g in after.cpu}
    total_cpu = sum(cpu.values())
    requests = {r: after.requests.get(r, 0.0) - before.requests.get(r, 0.0) for r in after.requests}
    row: dict[str, Any] = {
        "round": round_no,
        "records": result.get("records"),
        "mb": round(mb, 1),
        "seconds": result.get("seconds"),
        "mb_per_s": result.get("mb_per_s"),
        "transactions": txns,
        "broker_cpu_s": round(total_cpu, 2),
        "broker_cpu_by_thread_s": {g: round(v, 2) for g, v in sorted(cpu.items())},
        "controller_cpu_s": round(after.controller_cpu - before.controller_cpu, 2),
        "broker_cpu_s_per_mb": round(total_cpu / mb, 4) if mb else None,
        "broker_cpu_ms_per_txn": round(1000 * total_cpu / txns, 1) if txns else None,
        "requests": {r: int(v) for r, v in sorted(requests.items()) if v},
        "requests_per_txn": {r: round(v / txns, 2) for r, v in sorted(requests.items()) if v and txns},
        "wakeups_per_txn": {
            k: round((v - before.wakeups.get(k, 0.0)) / txns, 2) for k, v in sorted(after.wakeups.items()) if txns
        },
        "rocksdb_level0_files_end": after.level0_files,
        "rocksdb_write_stalls": {
            k: v - before.stalls.get(k, 0.0) for k, v in sorted(after.stalls.items()) if v - before.stalls.get(k, 0.0)
        },
        "rocksdb_stall_seconds": round(after.stall_seconds - before.stall_seconds, 2),
        "rocksdb_compaction_mb": round((after.compaction_bytes - before.compaction_bytes) / 1e6),
    }
    print(
        f"round {round_no}: {row['records']} records, {row['mb']} MB in {row['seconds']:.1f} s, {txns:.0f} txns; "
        f"broker CPU {total_cpu:.1f} s ({row['broker_cpu_s_per_mb']} s/MB, {row['broker_cpu_ms_per_txn']} ms/txn) "
        f"{row['broker_cpu_by_thread_s']}; controller {row['controller_cpu_s']} s",
        flush=True,
    )
    print(f"  requests per txn: {row['requests_per_txn']}", flush=True)
    print(f"  long-poll wake-ups per txn: {row['wakeups_per_txn']}", flush=True)
    print(
        f"  rocksdb: L0 files at end {row['rocksdb_level0_files_end']:.0f}, stalls {row['rocksdb_write_stalls']}, "
        f"stall s {row['rocksdb_stall_seconds']}, compaction written {row['rocksdb_compaction_mb']} MB",
        flush=True,
    )
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--count", type=int, default=50_000, help="records per round")
    parser.add_argument("--record-size", type=int, default=1024)
    parser.add_argument("--kind", choices=("transactions", "produce"), default="transactions")
    parser.add_argument("--commit-interval-ms", type=int, default=100)
    parser.add_argument("--profile-dir", type=Path, help="py-spy raw profiles per broker and round go here")
    parser.add_argument("--native", action="store_true", help="py-spy --native: C frames too (gRPC core, upb)")
    parser.add_argument("--json", type=Path, help="append the rounds' figures to this JSON-lines file")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="txn-cost-") as tmp, LocalCluster(brokers=args.brokers) as cluster:
        cluster.wait_until_healthy(timeout=120)
        for r in range(1, args.rounds + 1):
            before = snapshot(cluster, args.brokers)
            profiles = (
                start_profiles(cluster, args.brokers, args.profile_dir, r, args.native) if args.profile_dir else []
            )
            try:
                result = run_round(cluster, args, Path(tmp) / f"round{r}.json")
            finally:
                stop_profiles(profiles)
            time.sleep(0.5)  # the last CompleteCommit is logged just after the client's last commit returned
            rows.append(report(r, result, before, snapshot(cluster, args.brokers)))
    if args.json:
        with args.json.open("a") as f:
            for row in rows:
                f.write(json.dumps({"kind": args.kind, "brokers": args.brokers, **row}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
