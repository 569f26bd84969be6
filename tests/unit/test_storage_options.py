"""The RocksDB settings chosen for the log (docs/performance.md) are the ones RocksDB runs with.

Read back from the OPTIONS file RocksDB writes into the database directory when it opens it,
so the test sees what RocksDB itself took, not what the code meant to set.
"""

from __future__ import annotations

from pathlib import Path

from rocksdict import Options, Rdict

from sluice.broker.log.storage import BYTES_PER_SYNC, COLUMN_FAMILIES, LOG_MAX_WRITE_BUFFERS, RocksStorage


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
