"""The RocksDB settings chosen for the log (docs/performance.md) are the ones RocksDB runs with.

Read back from the OPTIONS file RocksDB writes into the database directory when it opens it,
so the test sees what RocksDB itself took, not what the code meant to set.
"""

from __future__ import annotations

from pathlib import Path

from rocksdict import Options, Rdict

from sluice.broker.log.storage import BYTES_PER_SYNC, COLUMN_FAMILIES, LOG_MAX_WRITE_BUFFERS, RocksStorage, WriteSet


def options_sections(db: Path) -> dict[str, dict[str, str]]:
    latest = max(db.glob("OPTIONS-*"), key=lambda p: int(p.name.split("-")[1]))
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    for line in latest.read_text().splitlines():
        line = line.strip()
        if line.startswith("["):
            current = sections.setdefault(line, {})
        elif "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            current[key.strip()] = value.strip()
    return sections


def test_the_log_column_family_gets_its_write_buffers_and_the_db_its_writeback(tmp_path: Path) -> None:
    storage = RocksStorage(str(tmp_path / "db"))
    storage.close()
    sections = options_sections(tmp_path / "db")
    assert sections["[DBOptions]"]["bytes_per_sync"] == str(BYTES_PER_SYNC)
    assert int(sections['[CFOptions "log"]']["max_write_buffer_number"]) == LOG_MAX_WRITE_BUFFERS > 2
    # the small column families keep RocksDB's defaults
    assert sections['[CFOptions "producers"]']["max_write_buffer_number"] == "2"


def test_a_data_directory_made_with_rocksdb_defaults_opens_with_the_settings(tmp_path: Path) -> None:
    # as a broker before these settings made it: every column family with RocksDB's defaults
    opt = Options(raw_mode=True)
    opt.create_if_missing(True)
    opt.create_missing_column_families(True)
    old = Rdict(str(tmp_path / "db"), opt, column_families={cf: Options(raw_mode=True) for cf in COLUMN_FAMILIES})
    old.close()
    assert options_sections(tmp_path / "db")['[CFOptions "log"]']["max_write_buffer_number"] == "2"
    again = RocksStorage(str(tmp_path / "db"))
    again.close()
    sections = options_sections(tmp_path / "db")
    assert int(sections['[CFOptions "log"]']["max_write_buffer_number"]) == LOG_MAX_WRITE_BUFFERS


def test_a_scan_back_to_a_floor_starts_at_the_entry_that_holds_the_key(tmp_path: Path) -> None:
    """partition.read scans from the batch that holds an offset with one iterator: the greatest key
    at or below the start if it is within the partition's prefix, else the start itself."""
    storage = RocksStorage(str(tmp_path / "db"))
    ws = WriteSet()
    for key in (b"a\x05", b"b\x00", b"b\x10", b"b\x20", b"c\x00"):
        ws.put("log", key, b"v" + key)
    storage.write(ws)

    def keys(start: bytes, end: bytes, back_to: bytes | None) -> list[bytes]:
        return [k for k, _v in storage.scan("log", start, end, back_to)]

    assert keys(b"b\x15", b"c", b"b") == [b"b\x10", b"b\x20"]  # from the floor
    assert keys(b"b\x10", b"c", b"b") == [b"b\x10", b"b\x20"]  # the key itself is its floor
    assert keys(b"b\x15", b"c", None) == [b"b\x20"]  # no back_to: from the start
    assert keys(b"b\x00", b"c", b"b\x00") == [b"b\x00", b"b\x10", b"b\x20"]
    assert keys(b"a\xff", b"b\x11", b"b") == [b"b\x00", b"b\x10"]  # the floor (a\x05) is below back_to
    assert keys(b"\x00", b"b", b"\x00") == [b"a\x05"]  # nothing at or below the start
    assert keys(b"b\x30", b"c", b"b") == [b"b\x20"]  # the floor may be the last entry
    storage.close()
