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
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from rocksdict import Options, Rdict, WriteBatch

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
    def get(self, cf: str, key: bytes) -> bytes | None: ...

    def write(self, ws: WriteSet) -> None: ...

    def scan(self, cf: str, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Keys in [start, end), ascending."""
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


def _options() -> Options:
    opt = Options(raw_mode=True)
    opt.create_if_missing(True)
    opt.create_missing_column_families(True)
    opt.set_max_background_jobs(2)
    opt.set_write_buffer_size(64 * 1024 * 1024)
    return opt


class RocksStorage:
    def __init__(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)
        self.path = path
        self._db = Rdict(path, _options(), column_families={cf: Options(raw_mode=True) for cf in COLUMN_FAMILIES})
        self._cfs = {cf: self._db.get_column_family(cf) for cf in COLUMN_FAMILIES}
        self._handles = {cf: self._db.get_column_family_handle(cf) for cf in COLUMN_FAMILIES}

    def get(self, cf: str, key: bytes) -> bytes | None:
        value = self._cfs[cf].get(key)
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
        self._db.write(wb)

    def scan(self, cf: str, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        it = self._cfs[cf].iter()
        it.seek(start)
        while it.valid():
            key = it.key()
            if key >= end:
                return
            yield key, it.value()
            it.next()

    def floor(self, cf: str, key: bytes, lower: bytes) -> tuple[bytes, bytes] | None:
        it = self._cfs[cf].iter()
        it.seek_for_prev(key)
        if it.valid() and it.key() >= lower:
            return it.key(), it.value()
        return None

    def last(self, cf: str, start: bytes, end: bytes) -> tuple[bytes, bytes] | None:
        it = self._cfs[cf].iter()
        it.seek_for_prev(end)
        while it.valid() and it.key() >= end:
            it.prev()
        if it.valid() and it.key() >= start:
            return it.key(), it.value()
        return None

    def compact(self, cf: str, start: bytes, end: bytes) -> None:
        self._cfs[cf].compact_range(start, end)

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

    def close(self) -> None:
        # Column-family views hold references to the DB: drop them first, or
        # RocksDB keeps its LOCK file and the same process cannot reopen it.
        for cf in self._cfs.values():
            cf.close()
        self._cfs.clear()
        self._handles.clear()
        self._db.close()
