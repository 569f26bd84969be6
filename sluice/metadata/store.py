"""The MetadataStore interface: get / compare-and-set / watch over named documents.

Every write is a compare-and-set against the document's version, so two
writers (two brokers claiming a producer-id block, a leader and the controller
changing an ISR) can never overwrite each other silently: the loser gets
:class:`VersionConflict`, re-reads and decides again. ``changes_since`` gives a
poll-based watch: each write gets a store-wide, increasing revision.

This module is the interface only and imports no backend: the backends
(:mod:`sluice.metadata.local`, :mod:`sluice.metadata.kubernetes`) import it,
and :mod:`sluice.metadata.factory` imports them to open a store from a URL,
so the imports point one way. Documents are JSON objects here; their typed
form is :mod:`sluice.metadata.documents`.
"""

from __future__ import annotations

import builtins
import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


class VersionConflict(Exception):
    """The document changed (or appeared, or vanished) since the caller read it."""


class StoreUnavailable(Exception):
    """The store cannot be reached now (the API server is down or cut off): nothing was read or written,
    or a write's outcome is unknown. Transient: the caller tries again later, or answers a retriable
    error. Every backend raises this for a connection failure, and so does the test-only cut
    (:mod:`sluice.metadata.faults`), so a broker handles both one way."""


@dataclass(frozen=True)
class Document:
    key: str
    value: dict[str, Any] | None  # None: deleted (only seen through changes_since)
    version: int  # per document, starts at 1
    revision: int  # store-wide, increases with every write


class MetadataStore(Protocol):
    def get(self, key: str) -> Document | None: ...

    def list(self, prefix: str) -> builtins.list[Document]: ...

    def compare_and_set(self, key: str, value: dict[str, Any], expected_version: int | None) -> Document:
        """Write ``value`` if the document is at ``expected_version`` (None: must not exist)."""
        ...

    def delete(self, key: str, expected_version: int) -> None: ...

    def changes_since(self, revision: int, prefix: str = "") -> builtins.list[Document]:
        """Documents written or deleted after ``revision``, oldest first."""
        ...

    def close(self) -> None: ...


def update(
    store: MetadataStore,
    key: str,
    change: Callable[[dict[str, Any] | None], dict[str, Any] | None],
    attempts: int = 50,
) -> Document | None:
    """Read-modify-write with retries on conflict. ``change`` returns None to leave it as it is."""
    for _ in range(attempts):
        doc = store.get(key)
        # A deep copy: callers change nested values in place, which must neither touch the document
        # read nor make the change look like no change below.
        new = change(None if doc is None else copy.deepcopy(doc.value or {}))
        if new is None or (doc is not None and new == doc.value):
            return doc  # nothing to change: no write (every watcher would receive the document again)
        try:
            return store.compare_and_set(key, new, None if doc is None else doc.version)
        except VersionConflict:
            continue
    raise VersionConflict(f"{key}: gave up after {attempts} conflicting updates")
