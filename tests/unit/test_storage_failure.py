"""RocksStorage on a full filesystem (a real tmpfs, mounted by the test as root): a storage error,
then the log directory is offline; close does not raise; reopened with space, every write that
returned is there."""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.broker.log.storage import LOG_WRITE_BUFFER_SIZE, MemtableBudget, RocksStorage, WriteSet
from sluice.errors import KafkaStorageError


def test_a_full_disk_takes_the_log_dir_offline_and_loses_no_completed_write(tmp_path: Path) -> None:
    volume = tmp_path / "volume"
    volume.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(volume)], check=True)
    try:
        storage = RocksStorage(str(volume / "db"))
        heard: list[str] = []
        storage.failure_listeners.append(heard.append)
        written = 0
        with pytest.raises(KafkaStorageError) as failed:
            for i in range(10_000):  # 8 MiB fill up long before 10 000 x 64 KiB
                ws = WriteSet()
                ws.put("log", b"k%08d" % i, os.urandom(64 * 1024))
                storage.write(ws)
                written += 1
        assert 0 < written < 10_000
        assert "No space left on device" in str(failed.value) and failed.value.retriable
        assert storage.failure is not None and "No space left" in storage.failure
        assert heard == [storage.failure]
        # offline: reads and writes are refused at once, and the listener is not called again
        with pytest.raises(KafkaStorageError, match="offline"):
            storage.get("log", b"k00000000")
        with pytest.raises(KafkaStorageError, match="offline"):
            list(storage.scan("log", b"", b"\xff"))
        assert len(heard) == 1
        storage.close()  # the final flush fails; close says so in the log and returns
        del storage, failed  # dropping the database (tracebacks hold it too) releases its LOCK, as an exit does
        gc.collect()

        # Space freed; reopened by a new process, as a restarted broker does (this one still holds
        # the LOCK of the database whose close failed).
        subprocess.run(["mount", "-o", "remount,size=64m", str(volume)], check=True)
        count = (
            "import sys; from sluice.broker.log.storage import RocksStorage; s = RocksStorage(sys.argv[1]); "
            "print(sum(1 for _ in s.scan('log', b'', b'\\xff'))); s.close()"
        )
        out = subprocess.run([sys.executable, "-c", count, str(volume / "db")], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert int(out.stdout) == written
    finally:
        subprocess.run(["umount", "-l", str(volume)], check=False)


def test_the_unflushed_data_is_kept_to_a_sixteenth_of_the_volume() -> None:
    """What a start after a full disk must flush (docs/faults.md): a 64 MiB volume flushes 1 MiB tables
    and keeps at most 4 MiB of WAL; from 4 GiB up the measured settings (4 x 64 MB, RocksDB's WAL limit)."""
    mib = 1 << 20
    assert MemtableBudget.for_volume(64 * mib) == MemtableBudget(1 * mib, 4 * mib)
    assert MemtableBudget.for_volume(16 * mib) == MemtableBudget(1 * mib, 1 * mib)  # the floor
    assert MemtableBudget.for_volume(1024 * mib) == MemtableBudget(16 * mib, 64 * mib)
    assert MemtableBudget.for_volume(4096 * mib) == MemtableBudget(LOG_WRITE_BUFFER_SIZE, 0)
    assert MemtableBudget.for_volume(100 * 1024 * mib) == MemtableBudget(LOG_WRITE_BUFFER_SIZE, 0)


OPEN = (
    "import sys; from sluice.broker.log.storage import RocksStorage; from sluice.errors import KafkaStorageError\n"
    "try:\n"
    "    s = RocksStorage(sys.argv[1])\n"
    "except KafkaStorageError as exc:\n"
    "    print(exc); sys.exit(1)\n"
    "print(sum(1 for _ in s.scan('log', b'', b'\\xff'))); s.close()\n"
)


def test_a_start_without_room_for_the_wal_says_how_much_to_free(tmp_path: Path) -> None:
    """A WAL bigger than the free space (written under a bigger budget: here a 4 GiB volume, shrunk
    afterwards) cannot be flushed at open: the error says how big it is and how much more to free."""
    volume = tmp_path / "volume"
    volume.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4g", "tmpfs", str(volume)], check=True)
    try:
        write = (
            "import os, sys; from sluice.broker.log.storage import RocksStorage, WriteSet\n"
            "s = RocksStorage(sys.argv[1])\n"
            "for i in range(24):\n"
            "    ws = WriteSet(); ws.put('log', b'k%04d' % i, os.urandom(1 << 20)); s.write(ws)\n"
            "os._exit(0)  # killed: 24 MiB in the WAL only, never flushed (64 MB write buffers)\n"
        )
        out = subprocess.run([sys.executable, "-c", write, str(volume / "db")], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        used = os.statvfs(volume)
        used_mib = (used.f_blocks - used.f_bfree) * used.f_frsize >> 20
        subprocess.run(["mount", "-o", f"remount,size={used_mib + 8}m", str(volume)], check=True)
        # each start in a process of its own, as a broker's: a failed open holds the table it could
        # not finish until its process exits
        opened = subprocess.run([sys.executable, "-c", OPEN, str(volume / "db")], capture_output=True, text=True)
        assert opened.returncode == 1, opened.stdout
        message = opened.stdout
        assert "No space left on device" in message
        assert "opening replays the write-ahead log, 24.0 MiB, into tables before deleting it" in message
        more = re.search(r"free at least (\d+) MiB more", message)
        assert more is not None, message
        # freeing what it says is enough: it opens, and every write is there
        subprocess.run(["mount", "-o", f"remount,size={used_mib + 8 + int(more[1])}m", str(volume)], check=True)
        opened = subprocess.run([sys.executable, "-c", OPEN, str(volume / "db")], capture_output=True, text=True)
        assert opened.returncode == 0 and opened.stdout.strip() == "24", opened.stdout + opened.stderr
    finally:
        subprocess.run(["umount", "-l", str(volume)], check=False)
