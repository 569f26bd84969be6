"""Where a RocksDB write's time goes: the write-ahead log against the memtable (issue 26, lever 3).

The broker appends a produced batch with one ``db.write`` on its event loop, and rocksdict holds the
GIL through it (``bench/rocksdb_gil.py``), so every nanosecond of it per byte is the loop's. This
times ``db.write`` of one value per write (the broker's shape: one key per batch), per byte, with
RocksDB's write-ahead log on (what the broker does: a kill -9 then loses nothing acknowledged, the
WAL is in the page cache) and off (the memtable alone), for several value sizes, with large write
buffers so that no flush runs during the timing. It also says whether the RocksDB inside rocksdict
uses the CPU's CRC-32C instruction, which the WAL checksums every record with: it looks for
``crc32`` instructions in rocksdict's binary (``objdump``; skipped when objdump is missing).

    python -m bench.rocksdb_wal                      # 4 KiB .. 1 MiB values, 64 MiB each way
    python -m bench.rocksdb_wal --mib 16             # a quicker run

Results: ``bench/results/rocksdb-wal.{json,md}`` (or ``--results DIR``). Per-byte CPU: read it next
to the load average it prints.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import rocksdict
from rocksdict import Options, Rdict, WriteBatch, WriteOptions

RESULTS = Path(__file__).resolve().parent / "results"
SIZES = (4096, 65536, 262144, 1048576)


def crc32_instructions() -> int | None:
    """How many crc32 instructions rocksdict's binary holds (0: RocksDB's table-driven software
    CRC-32C), or None when objdump is not installed."""
    binary = next(Path(rocksdict.__file__).parent.glob("rocksdict*.so"), None)
    if binary is None or shutil.which("objdump") is None:
        return None
    out = subprocess.run(["objdump", "-d", str(binary)], capture_output=True, text=True, check=False).stdout
    return sum(1 for line in out.splitlines() if "\tcrc32" in line)


def time_writes(directory: str, size: int, total: int, wal: bool) -> dict[str, Any]:
    opt = Options(raw_mode=True)
    opt.create_if_missing(True)
    opt.set_write_buffer_size(max(2 * total, 64 << 20))  # no flush while timing
    db = Rdict(directory, opt)
    options = WriteOptions()
    options.disable_wal = not wal
    value = os.urandom(size)
    count = max(20, total // size)
    times = []
    cpu0 = time.process_time()
    for i in range(count):
        batch = WriteBatch(raw_mode=True)
        batch.put(i.to_bytes(8, "big"), value)
        started = time.perf_counter()
        db.write(batch, options)
        times.append(time.perf_counter() - started)
    cpu = time.process_time() - cpu0
    db.close()
    median = statistics.median(times)
    return {
        "value_bytes": size,
        "wal": wal,
        "writes": count,
        "write_median_us": median * 1e6,
        "ns_per_byte": median / size * 1e9,
        "process_cpu_s_per_gb": cpu / (count * size) * 1e9,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=64, help="MiB written per value size and WAL setting (default 64)")
    ap.add_argument("--results", type=Path, default=RESULTS, help="output directory (default bench/results)")
    args = ap.parse_args(argv)
    if not 1 <= args.mib <= 4096:
        ap.error("--mib must be in [1, 4096]")
    load_before = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory(prefix="sluice-wal-") as tmp:
        for size in SIZES:
            for wal in (True, False):
                print(f"{size} B values, WAL {'on' if wal else 'off'} ...", file=sys.stderr, flush=True)
                directory = os.path.join(tmp, f"{size}-{wal}")
                rows.append(time_writes(directory, size, args.mib << 20, wal))
                shutil.rmtree(directory, ignore_errors=True)
    instructions = crc32_instructions()
    on = [r["ns_per_byte"] for r in rows if r["wal"]]
    off = [r["ns_per_byte"] for r in rows if not r["wal"]]
    result = {
        "rocksdict": importlib.metadata.version("rocksdict"),
        "cpus": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg()[0],
        "crc32_instructions_in_rocksdict": instructions,
        "rows": rows,
        "wal_ns_per_byte_median": statistics.median(a - b for a, b in zip(on, off, strict=True)),
    }
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "rocksdb-wal.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# Where a RocksDB write's time goes: WAL on and off (bench/rocksdb_wal.py)",
        "",
        f"{result['cpus']} CPUs, load average {load_before:.2f} before, {result['load_average_after']:.2f} after; "
        f"{args.mib} MiB per row, one value per write, no flush while timing.",
        "",
        "| value | WAL | write median µs | ns per byte | process CPU s per GB |",
        "|---:|---|---:|---:|---:|",
    ]
    lines += [
        f"| {r['value_bytes']:,} B | {'on' if r['wal'] else 'off'} | {r['write_median_us']:,.1f} | "
        f"{r['ns_per_byte']:.2f} | {r['process_cpu_s_per_gb']:.2f} |"
        for r in rows
    ]
    crc = (
        "objdump not installed: not checked"
        if instructions is None
        else (
            f"{instructions} crc32 instructions in rocksdict's binary"
            + (": its RocksDB computes CRC-32C in software (table-driven)" if instructions == 0 else "")
        )
    )
    lines += [
        "",
        f"The WAL adds {result['wal_ns_per_byte_median']:.2f} ns per byte (median over the sizes). {crc}.",
    ]
    text = "\n".join(lines) + "\n"
    (args.results / "rocksdb-wal.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
