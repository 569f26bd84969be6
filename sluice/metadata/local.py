"""The local MetadataStore: one SQLite file shared by the embedded cluster's processes.

SQLite gives us what ZooKeeper gave Kafka on one machine: atomic
compare-and-set across processes (a write transaction takes the database lock,
``BEGIN IMMEDIATE``), durability across kill -9 (WAL journal), and ordered
change polling (a store-wide revision column). Deleted documents stay as rows
with a NULL value so watchers see the deletion.
"""

from __future__ import annotations

import builtins
import json
import sqlite3
import threading
from typing import Any

from sluice.metadata.store import Document, VersionConflict

_SCHEMA = """
CREATE TABLE IF NOT EXISTS documents (
    key TEXT PRIMARY KEY,
    value TEXT,
    version INTEGER NOT NULL,
    revision INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS documents_revision ON documents(revision);
"""


class SqliteMetadataStore:
    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()  # one connection, shared by this process's threads
        self._db = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    @staticmethod
    def _doc(row: tuple[str, str | None, int, int]) -> Document:
        key, value, version, revision = row
        return Document(key, None if value is None else json.loads(value), version, revision)

    def get(self, key: str) -> Document | None:
        with self._lock:
            row = self._db.execute(
                "SELECT key, value, version, revision FROM documents WHERE key = ? AND value IS NOT NULL",
                (key,),
            ).fetchone()
        return None if row is None else self._doc(row)

    def list(self, prefix: str) -> builtins.list[Document]:
        with self._lock:
            rows = self._db.execute(
                "SELECT key, value, version, revision FROM documents "
                "WHERE key >= ? AND key < ? AND value IS NOT NULL ORDER BY key",
                (prefix, prefix + "\uffff"),
            ).fetchall()
        return [self._doc(r) for r in rows]

    def _write(self, key: str, value: dict[str, Any] | None, expected_version: int | None) -> Document:
        text = None if value is None else json.dumps(value, sort_keys=True)
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute("SELECT value, version FROM documents WHERE key = ?", (key,)).fetchone()
                live = row is not None and row[0] is not None
                current = row[1] if live else None
                if current != expected_version:
                    raise VersionConflict(f"{key}: expected version {expected_version}, found {current}")
                (revision,) = self._db.execute("SELECT COALESCE(MAX(revision), 0) + 1 FROM documents").fetchone()
                version = (row[1] if row is not None else 0) + 1
                self._db.execute(
                    "INSERT INTO documents(key, value, version, revision) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT(key) DO UPDATE SET value = excluded.value, version = excluded.version, "
                    "revision = excluded.revision",
                    (key, text, version, revision),
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return Document(key, value, version, revision)

    def compare_and_set(self, key: str, value: dict[str, Any], expected_version: int | None) -> Document:
        return self._write(key, value, expected_version)

    def delete(self, key: str, expected_version: int) -> None:
        self._write(key, None, expected_version)

    def changes_since(self, revision: int, prefix: str = "") -> builtins.list[Document]:
        with self._lock:
            rows = self._db.execute(
                "SELECT key, value, version, revision FROM documents "
                "WHERE revision > ? AND key >= ? AND key < ? ORDER BY revision",
                (revision, prefix, prefix + "\uffff"),
            ).fetchall()
        return [self._doc(r) for r in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()
