"""bench/rocksdb_wal.py runs end to end on a real RocksDB and writes its results (no timing is asserted)."""

from __future__ import annotations

import json
from pathlib import Path

from bench import rocksdb_wal


def test_a_small_run_writes_every_row_and_the_verdict_on_the_crc(tmp_path: Path) -> None:
    assert rocksdb_wal.main(["--mib", "1", "--results", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "rocksdb-wal.json").read_text())
    rows = {(r["value_bytes"], r["wal"]) for r in result["rows"]}
    assert rows == {(size, wal) for size in rocksdb_wal.SIZES for wal in (True, False)}
    assert all(r["writes"] >= 1 and r["ns_per_byte"] > 0 for r in result["rows"])
    assert "ns per byte" in (tmp_path / "rocksdb-wal.md").read_text()
