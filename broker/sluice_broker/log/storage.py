"""Storage: the one narrow interface between the broker and its disk.

Everything the broker persists goes through :class:`Storage`: point reads,
ordered range scans, a floor lookup, and :meth:`Storage.write` of a
:class:`WriteSet`, applied atomically. Nothing above this module knows it is
RocksDB, so another engine (or a different layout) can replace it.

:class:`RocksStorage` keeps one RocksDB (rocksdict) per broker with a column
family per kind of data (see :data:`COLUMN_FAMILIES`). An append is one
WriteBatch (the batch, the producer state change, the index entries together):
RocksDB's write-ahead log makes it all-or-nothing across kill -9. We do not
fsync per write, as Kafka does not: a process crash loses nothing acknowledged
(the WAL is in the OS page cache); a machine crash is what replication is for.

A failed disk (full, read-only, I/O errors) takes the whole log directory offline, as Kafka's
LogDirFailureChannel does: the first RocksDB call that fails for a reason other than a bug
(rocksdict raises plain ``Exception`` for RocksDB's ``IO error``, ``Corruption`` ... statuses)
records the failure, tells the ``failure_listeners``, and raises
:class:`~sluice.errors.KafkaStorageError` (KAFKA_STORAGE_ERROR, retriable: the client looks the
leader up again and goes to a replica that can write). Every call after it raises the same error
at once, without touching RocksDB: after ENOSPC RocksDB refuses every write anyway ("Writer has
previous error"), and a directory that failed once is not trusted again until the broker
restarts (RocksDB then replays its write-ahead log, so nothing written before the failure is
lost). A write that failed was not applied: RocksDB writes the WAL before the memtable, and the
partition log changes memory only after its write returned. ``close`` never raises: a final
memtable flush that fails loses nothing the WAL does not hold.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import NoReturn, Protocol, TypeVar

from rocksdict import Options, Rdict, WriteBatch

from sluice.errors import KafkaStorageError

log = logging.getLogger(__name__)
T = TypeVar("T")
# Python's own errors are bugs in the caller, not a failing disk: they never take the directory offline.
_PROGRAMMING_ERRORS = (TypeError, AttributeError, KeyError, IndexError, NameError, AssertionError)

# log:          partition key + base offset (8, big-endian) -> RecordBatch bytes
# producers:    partition key + producer id (8)             -> producer state entry
# txn_index:    partition key + first offset (8)            -> aborted transaction (pid, last offset)
# partition_meta: partition key                             -> partition metadata (JSON)
COLUMN_FAMILIES = ("log", "producers", "txn_index", "partition_meta")


@dataclass
class WriteSet:
    """Puts, deletes and range deletes to apply together, atomically."""

    ops: list[tuple[str, str, bytes, bytes]] = field(default_factory=list)

    def put(self, cf: str, key: bytes, value: bytes) -> None:
        self.ops.append(("put", cf, key, value))

    def delete(self, cf: str, key: bytes) -> None:
        self.ops.append(("del", cf, key, b""))

    def delete_range(self, cf: str, start: bytes, end: bytes) -> None:
        """Delete keys in [start, end)."""
        self.ops.append(("range", cf, start, end))


class Storage(Protocol):
    @property
    def failure(self) -> str | None:
        """Why the log directory is offline (the first storage error), or None while it works."""
        ...

    # called once, with the reason, when the log directory goes offline
    failure_listeners: list[Callable[[str], None]]

    def get(self, cf: str, key: bytes) -> bytes | None: ...

    def write(self, ws: WriteSet) -> None: ...

    def scan(self, cf: str, start: bytes, end: bytes, back_to: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Keys in [start, end), ascending. ``back_to``: begin instead at the greatest key <= start,
        if one is >= back_to (the batch that holds an offset, when keys are base offsets)."""
        ...

    def floor(self, cf: str, key: bytes, lower: bytes) -> tuple[bytes, bytes] | None:
        """The greatest entry with lower <= entry key <= key."""
        ...

    def last(self, cf: str, start: bytes, end: bytes) -> tuple[bytes, bytes] | None:
        """The greatest entry in [start, end)."""
        ...

    def compact(self, cf: str, start: bytes, end: bytes) -> None:
        """Rewrite the files holding keys in [start, end), so deleted keys leave the disk now."""
        ...

    def close(self) -> None: ...


# RocksDB settings for a log (measured: docs/performance.md, "RocksDB settings for the log").
# With replication factor 3 every broker stores the same bytes, so the brokers' memtables fill and
# flush together; unpaced, each flush and the compaction after it wrote its dirty pages in one burst
# that starved the event loops (the p99 tail). A *fixed* rate limiter paces flushes and compactions;
# the auto-tuned one was measured to throttle flushes below the ingest rate (RocksDB lowers its rate
# to a twentieth of the ceiling while it is not drained), so a full memtable found the previous one
# still flushing and writes stopped for seconds on every broker (memtable-limit-stops), which is why
# produce throughput fell run after run with it. Its rate is the broker setting
# log.background.write.max.bytes.per.second: the disk's budget for this broker (LocalCluster divides
# one machine's among its brokers). Set below the sustained ingest it caps produce throughput once
# the memtables are full. Four write buffers for the log let a memtable fill while the previous
# one flushes; bytes_per_sync makes the kernel write back as files grow.
DEFAULT_BACKGROUND_WRITE_RATE = 192 * 1024 * 1024  # bytes/s, flushes (first) and compactions together
BACKGROUND_WRITE_REFILL_US = 100_000
BYTES_PER_SYNC = 1024 * 1024
LOG_WRITE_BUFFER_SIZE = 64 * 1024 * 1024
LOG_MAX_WRITE_BUFFERS = 4

# Room for a restart after a disk-full stop. Records not yet flushed (the memtables) have the WAL as
# their only copy on disk, and opening the database replays the WAL and flushes it into a table
# *before* deleting it: a start needs as much free space as the WAL holds unflushed. With 64 MB write
# buffers on a 64 MiB volume no memtable was ever flushed, the WAL held all the data (55.9 MiB), and a
# start with 8 MiB freed failed writing that table (docs/faults.md, "Restarting after a full disk").
# So the unflushed data is kept to a share of the volume: log write buffers of at most
# 1/(UNFLUSHED_VOLUME_SHARE x LOG_MAX_WRITE_BUFFERS) of it, and max_total_wal_size (RocksDB flushes
# the column families that keep the oldest WAL alive when the WALs exceed it; the small column
# families would otherwise pin every WAL) 1/UNFLUSHED_VOLUME_SHARE. A start then needs at most about
# that much free. Volumes of 4 GiB and more keep the settings measured above (1/16 of them is already
# the 256 MB four full log memtables can hold); below that the memtables shrink, which only small
# volumes see.
UNFLUSHED_VOLUME_SHARE = 16
MIN_LOG_WRITE_BUFFER_SIZE = 1024 * 1024
# RocksDB's info LOG is renamed to LOG.old.<time> at every open and 1000 are kept by default: a broker
# restarted again and again on a full volume (a crash loop) would fill it with them (66 KB to 360 KB
# each on the 64 MiB volume above).
KEEP_INFO_LOG_FILES = 10


@dataclass(frozen=True)
class MemtableBudget:
    """RocksDB's memtable settings for a data volume of a given size (see UNFLUSHED_VOLUME_SHARE)."""

    log_write_buffer_size: int
    max_total_wal_size: int  # 0: RocksDB's default (4 x every column family's write buffers)

    @classmethod
    def for_volume(cls, volume_bytes: int) -> MemtableBudget:
        unflushed = volume_bytes // UNFLUSHED_VOLUME_SHARE
        if unflushed >= LOG_WRITE_BUFFER_SIZE * LOG_MAX_WRITE_BUFFERS:
            return cls(LOG_WRITE_BUFFER_SIZE, 0)
        size = max(MIN_LOG_WRITE_BUFFER_SIZE, unflushed // LOG_MAX_WRITE_BUFFERS)
        return cls(size, max(unflushed, size))


def _options(background_write_rate: int, budget: MemtableBudget) -> Options:
    opt = Options(raw_mode=True)
    opt.create_if_missing(True)
    opt.create_missing_column_families(True)
    opt.set_max_background_jobs(2)
    opt.set_ratelimiter(background_write_rate, BACKGROUND_WRITE_REFILL_US, 10)
    opt.set_bytes_per_sync(BYTES_PER_SYNC)
    opt.set_keep_log_file_num(KEEP_INFO_LOG_FILES)
    if budget.max_total_wal_size:
        opt.set_max_total_wal_size(budget.max_total_wal_size)
    return opt


def _column_family_options(cf: str) -> Options:
    """Per column family: only ``log`` takes the bulk of the writes; the others keep RocksDB's defaults.

    The log's write buffers open at their full size whatever the budget: the replay of the WAL at
    open then fills one memtable and writes one table at the end. Replayed into small memtables it
    wrote a table each time one filled, and a start that ran out of space left every finished one
    behind (only the table it failed on is removed), so the space freed for the next start went to
    tables nothing references. The budget's size is set once the database is open.
    """
    opt = Options(raw_mode=True)
    if cf == "log":
        opt.set_write_buffer_size(LOG_WRITE_BUFFER_SIZE)
        opt.set_max_write_buffer_number(LOG_MAX_WRITE_BUFFERS)
    return opt


def _unflushed_wal_bytes(path: str) -> int:
    """Bytes in the database's write-ahead log files (``*.log``): what a start must flush, at most."""
    try:
        return sum(e.stat().st_size for e in os.scandir(path) if e.name.endswith(".log") and e.is_file())
    except OSError:
        return 0


def _space_needed(path: str, free_before: int, exc: Exception) -> str:
    """On a failed open for want of space, how much to free and why (a WAL written before the memtable
    budget, or by an older version, can hold more than the budget). ``free_before`` is read before the
    open: the table it failed to write still takes space until the process exits."""
    if "No space left" not in str(exc):
        return ""
    wal = _unflushed_wal_bytes(path)
    mib = 1024 * 1024
    need = max(wal + mib - free_before, mib)  # the table, plus room for a new WAL, MANIFEST and OPTIONS file
    return (
        f" (opening replays the write-ahead log, {wal / mib:.1f} MiB, into tables before deleting it:"
        f" {free_before / mib:.1f} MiB was free, free at least {need / mib:.0f} MiB more)"
    )


class RocksStorage:
    def __init__(self, path: str, background_write_rate: int = DEFAULT_BACKGROUND_WRITE_RATE) -> None:
        if background_write_rate <= 0:
            raise ValueError(f"the background write rate must be positive, not {background_write_rate}")
        self.path = path
        self._failure: str | None = None
        # Called once, with the reason, when the directory goes offline (on the thread that failed).
        self.failure_listeners: list[Callable[[str], None]] = []
        free_before = 0
        try:
            os.makedirs(path, exist_ok=True)
            volume = os.statvfs(path)
            free_before = volume.f_bavail * volume.f_frsize
            self.budget = MemtableBudget.for_volume(volume.f_blocks * volume.f_frsize)
            self._db = Rdict(
                path,
                _options(background_write_rate, self.budget),
                column_families={cf: _column_family_options(cf) for cf in COLUMN_FAMILIES},
            )
            if self.budget.log_write_buffer_size != LOG_WRITE_BUFFER_SIZE:  # mutable: from the next write on
                self._db.get_column_family("log").set_options(
                    {"write_buffer_size": str(self.budget.log_write_buffer_size)}
                )
        except Exception as exc:  # opening replays the WAL and writes; a full disk fails here
            raise KafkaStorageError(
                f"cannot open the log directory {path}: {exc}{_space_needed(path, free_before, exc)}"
            ) from None
        self._cfs = {cf: self._db.get_column_family(cf) for cf in COLUMN_FAMILIES}
        self._handles = {cf: self._db.get_column_family_handle(cf) for cf in COLUMN_FAMILIES}

    # -- failures -------------------------------------------------------------------------------

    @property
    def failure(self) -> str | None:
        return self._failure

    def _offline_error(self) -> KafkaStorageError:
        return KafkaStorageError(f"the log directory {self.path} is offline: {self._failure}")

    def _failed(self, exc: Exception) -> NoReturn:
        if isinstance(exc, _PROGRAMMING_ERRORS):
            raise exc
        if self._failure is None:
            self._failure = str(exc) or type(exc).__name__
            log.error("log directory %s is offline: %s", self.path, self._failure)
            for listener in list(self.failure_listeners):
                try:
                    listener(self._failure)
                except Exception:
                    log.exception("a log-directory failure listener failed")
        raise self._offline_error() from None

    def _call(self, fn: Callable[[], T]) -> T:
        if self._failure is not None:
            raise self._offline_error()
        try:
            return fn()
        except Exception as exc:
            self._failed(exc)

    # -- the Storage interface ------------------------------------------------------------------

    def get(self, cf: str, key: bytes) -> bytes | None:
        value = self._call(lambda: self._cfs[cf].get(key))
        return None if value is None else bytes(value)

    def write(self, ws: WriteSet) -> None:
        wb = WriteBatch(raw_mode=True)
        for op, cf, key, value in ws.ops:
            handle = self._handles[cf]
            if op == "put":
                wb.put(key, value, handle)
            elif op == "del":
                wb.delete(key, handle)
            else:
                wb.delete_range(key, value, handle)
        self._call(lambda: self._db.write(wb))

    def scan(self, cf: str, start: bytes, end: bytes, back_to: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        it = self._call(lambda: self._cfs[cf].iter())
        if back_to is not None:  # one iterator for the floor and the scan: a floor() first read its value again
            self._call(lambda: it.seek_for_prev(start))
            if not (self._call(it.valid) and it.key() >= back_to):
                self._call(lambda: it.seek(start))
        else:
            self._call(lambda: it.seek(start))
        while self._call(it.valid):
            key = it.key()
            if key >= end:
                return
            yield key, it.value()
            self._call(it.next)
        self._call(it.status)  # an iterator stops early on an I/O error: say so rather than end quietly

    def floor(self, cf: str, key: bytes, lower: bytes) -> tuple[bytes, bytes] | None:
        def find() -> tuple[bytes, bytes] | None:
            it = self._cfs[cf].iter()
            it.seek_for_prev(key)
            if it.valid() and it.key() >= lower:
                return it.key(), it.value()
            it.status()
            return None

        return self._call(find)

    def last(self, cf: str, start: bytes, end: bytes) -> tuple[bytes, bytes] | None:
        def find() -> tuple[bytes, bytes] | None:
            it = self._cfs[cf].iter()
            it.seek_for_prev(end)
            while it.valid() and it.key() >= end:
                it.prev()
            if it.valid() and it.key() >= start:
                return it.key(), it.value()
            it.status()
            return None

        return self._call(find)

    def compact(self, cf: str, start: bytes, end: bytes) -> None:
        self._call(lambda: self._cfs[cf].compact_range(start, end))

    def int_property(self, name: str, *, per_column_family: bool = True) -> int:
        """A RocksDB integer property (``rocksdb.total-sst-files-size`` ...), summed over every column family
        unless it is database-wide (``per_column_family=False``: ``rocksdb.is-write-stopped`` ...).

        Read-only, for the metrics endpoint; -1 when RocksDB does not know the property.
        """
        total = 0
        views = (self._db, *self._cfs.values()) if per_column_family else (self._db,)
        for view in views:
            value = view.property_int_value(name)
            if value is None:
                return -1
            total += int(value)
        return total

    def str_property(self, name: str) -> str | None:
        """A database-wide RocksDB text property (``rocksdb.dbstats`` ...), for the metrics endpoint."""
        value = self._db.property_value(name)
        return None if value is None else str(value)

    def cf_str_properties(self, name: str) -> dict[str, str]:
        """A per-column-family RocksDB text property (``rocksdb.cfstats`` ...) of every column family."""
        out: dict[str, str] = {}
        for cf, view in self._cfs.items():
            value = view.property_value(name)
            if value is not None:
                out[cf] = str(value)
        return out

    def close(self) -> None:
        # Column-family views hold references to the DB: drop them first, or
        # RocksDB keeps its LOCK file and the same process cannot reopen it.
        # Closing flushes; after a full disk that fails: the WAL still holds every write, say so and go on.
        failed = []
        for view in (*self._cfs.values(), self._db):
            try:
                view.close()
            except Exception as exc:
                failed.append(str(exc))
        if failed:
            log.warning(
                "closing %s: %s (the write-ahead log holds every write; a restart replays it)", self.path, failed[0]
            )
        self._cfs.clear()
        self._handles.clear()
