"""Does a RocksDB write release Python's GIL? (issue 26, lever 3: the write path off the event loop)

The broker appends a produced batch with ``RocksStorage.write`` (one WriteBatch, ``db.write``) on
its event loop: ≈550 µs per 256 KiB batch in ../shared/notes/perf-anatomy.md. Moving it to a worker
thread only helps if rocksdict lets go of the GIL while RocksDB works; otherwise the loop waits for
the GIL instead of for the write, and nothing is won. This measures it with the broker's own storage
class on a temporary directory:

1. ``alone``: a Python thread that only counts (the stand-in for the event loop's Python work) runs
   for ``--seconds``; its count per second is the baseline.
2. ``writes alone``: another thread writes 256 KiB batches as fast as it can; writes per second and
   the median and p99 time of one write.
3. ``both``: the two together. If ``db.write`` holds the GIL, the counter's rate falls by the share
   of time spent writing (the two take turns); if it releases it, the counter keeps its baseline
   rate on a machine with a free core while the writes go on.
4. ``control``: the counter beside a thread hashing the same bytes with SHA-256, C work that is
   known to release the GIL: what "releases it" looks like on this machine at this load.

    python -m bench.rocksdb_gil                  # 5 s per phase, 256 KiB batches
    python -m bench.rocksdb_gil --batch-kib 64 --seconds 3

Results: ``bench/results/rocksdb-gil.json`` and ``.md`` (or ``--results DIR``). A whole-process
figure, so read it next to the load average it prints: on a busy machine the counter loses its
core to other processes, whatever the GIL does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from sluice.broker.log.storage import RocksStorage, WriteSet

RESULTS = Path(__file__).resolve().parent / "results"


def _count(stop: threading.Event, out: list[int]) -> None:
    n = 0
    while not stop.is_set():
        for _ in range(1000):
            n += 1
    out.append(n)


def _write(storage: RocksStorage, value: bytes, stop: threading.Event, times: list[float]) -> None:
    key = 0
    while not stop.is_set():
        ws = WriteSet()
        ws.put("log", key.to_bytes(8, "big"), value)
        started = time.perf_counter()
        storage.write(ws)
        times.append(time.perf_counter() - started)
        key += 1


def _hash(value: bytes, stop: threading.Event, times: list[float]) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        hashlib.sha256(value).digest()  # releases the GIL for inputs over 2 KiB
        times.append(time.perf_counter() - started)


def _phase(
    storage: RocksStorage | None, value: bytes, seconds: float, *, count: bool, control: bool = False
) -> dict[str, Any]:
    stop = threading.Event()
    counted: list[int] = []
    times: list[float] = []
    threads = []
    if count:
        threads.append(threading.Thread(target=_count, args=(stop, counted)))
    if storage is not None:
        threads.append(threading.Thread(target=_write, args=(storage, value, stop, times)))
    if control:
        threads.append(threading.Thread(target=_hash, args=(value, stop, times)))
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    out: dict[str, Any] = {}
    if counted:
        out["count_per_s"] = counted[0] / seconds
    if times:
        ordered = sorted(times)
        out["writes_per_s"] = len(times) / seconds
        out["write_median_us"] = statistics.median(ordered) * 1e6
        out["write_p99_us"] = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e6
        out["mb_per_s"] = len(times) * len(value) / seconds / 1e6
        out["busy_share"] = sum(times) / seconds  # of the thread's time, inside the call
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-kib", type=int, default=256, help="bytes per write, KiB (default 256)")
    ap.add_argument("--seconds", type=float, default=5.0, help="length of each phase (default 5)")
    ap.add_argument("--results", type=Path, default=RESULTS, help="output directory (default bench/results)")
    args = ap.parse_args(argv)
    if args.batch_kib <= 0 or not 0 < args.seconds <= 600:
        ap.error("--batch-kib must be > 0 and --seconds in (0, 600]")
    value = os.urandom(args.batch_kib * 1024)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="sluice-gil-") as tmp:
        storage = RocksStorage(tmp)
        phases: dict[str, dict[str, Any]] = {}
        plan = (
            ("alone", False, True, False),
            ("writes alone", True, False, False),
            ("both", True, True, False),
            ("control", False, True, True),
        )
        for name, with_storage, count, control in plan:
            print(f"phase {name!r}: {args.seconds:.0f} s ...", file=sys.stderr, flush=True)
            phases[name] = _phase(storage if with_storage else None, value, args.seconds, count=count, control=control)
    kept = phases["both"]["count_per_s"] / phases["alone"]["count_per_s"]
    kept_control = phases["control"]["count_per_s"] / phases["alone"]["count_per_s"]
    writing = phases["writes alone"]["busy_share"]
    result = {
        "batch_bytes": len(value),
        "seconds_per_phase": args.seconds,
        "cpus": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg()[0],
        "phases": phases,
        "counter_rate_kept": kept,
        "counter_rate_kept_beside_sha256": kept_control,
        "share_of_time_writing": writing,
    }
    # Held: the counter keeps about (1 - share writing); released: about what it keeps beside SHA-256.
    held, released = 1 - writing, kept_control
    verdict = (
        "db.write releases the GIL: the counter kept about what it keeps beside SHA-256"
        if abs(kept - released) < abs(kept - held)
        else "db.write holds the GIL: the counter lost about the share of time spent writing"
    )
    result["verdict"] = verdict
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "rocksdb-gil.json").write_text(json.dumps(result, indent=1) + "\n")
    w, b = phases["writes alone"], phases["both"]
    md = [
        f"# Does a RocksDB write release the GIL? ({len(value) // 1024} KiB batches, {args.seconds:.0f} s a phase)",
        "",
        f"{os.cpu_count()} CPUs, load average {load_before:.2f} before, {result['load_average_after']:.2f} after.",
        "",
        "| phase | counter (per s) | writes/s | MB/s | write median µs | write p99 µs |",
        "|---|---:|---:|---:|---:|---:|",
        f"| counter alone | {phases['alone']['count_per_s']:,.0f} | | | | |",
        f"| writes alone | | {w['writes_per_s']:,.0f} | {w['mb_per_s']:,.0f} | {w['write_median_us']:,.0f} "
        f"| {w['write_p99_us']:,.0f} |",
        f"| both | {b['count_per_s']:,.0f} | {b['writes_per_s']:,.0f} | {b['mb_per_s']:,.0f} "
        f"| {b['write_median_us']:,.0f} | {b['write_p99_us']:,.0f} |",
        f"| counter beside SHA-256 of the same bytes (control) | {phases['control']['count_per_s']:,.0f} | | | | |",
        "",
        f"The counter kept {kept:.0%} of its rate beside the writes and {kept_control:.0%} beside SHA-256 (which "
        f"releases the GIL); writing alone spends {writing:.0%} of its thread's time inside db.write.",
        f"Verdict: {verdict}.",
        "",
    ]
    (args.results / "rocksdb-gil.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
