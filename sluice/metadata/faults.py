"""A test-only fault: a MetadataStore that can be cut off from its process by creating a file.

The local store is a SQLite file every process of a LocalCluster opens, so iptables cannot cut a
broker from it as it cuts a broker from the Kubernetes API server. :class:`CuttableStore` wraps the
store a process opened (not each backend: the cut is the same whichever store is behind it) and,
while the file ``cut_path`` exists, fails every call with :class:`StoreUnavailable`, the error the
Kubernetes backend raises when the API server cannot be reached. Deleting the file heals the cut;
the process never restarts. Checking a file costs one ``stat`` per call, so the wrapper is only put
in place when a test asks for it (the broker's ``metadata.cut`` hook, the local controller's
``--test-metadata-cut``; docs/architecture.md, "Test-only hooks").

One difference from a real cut, on purpose the stricter one: a Kubernetes store answers
``changes_since`` from its watch cache, which simply stops changing while the API server is cut off;
here it fails, so the caller's error path runs. Either way the process learns nothing new until
the cut heals.
"""

from __future__ import annotations

import builtins
import logging
import os
import threading
from typing import Any

from sluice.metadata.store import Document, MetadataStore, StoreUnavailable

log = logging.getLogger(__name__)


class CuttableStore:
    """``store`` as long as ``cut_path`` does not exist; :class:`StoreUnavailable` on every call while it does."""

    def __init__(self, store: MetadataStore, cut_path: str) -> None:
        self.store = store
        self.cut_path = cut_path
        self._lock = threading.Lock()
        self._was_cut = False

    def _check(self, op: str) -> None:
        cut = os.path.exists(self.cut_path)
        with self._lock:
            changed, self._was_cut = cut != self._was_cut, cut
        if changed:  # logged once per change, not once per call
            log.warning("metadata store %s (test hook: %s)", "cut off" if cut else "reachable again", self.cut_path)
        if cut:
            raise StoreUnavailable(f"cannot reach the API server: metadata store cut off by a test ({op})")

    def get(self, key: str) -> Document | None:
        self._check("get")
        return self.store.get(key)

    def list(self, prefix: str) -> builtins.list[Document]:
        self._check("list")
        return self.store.list(prefix)

    def compare_and_set(self, key: str, value: dict[str, Any], expected_version: int | None) -> Document:
        self._check("compare_and_set")
        return self.store.compare_and_set(key, value, expected_version)

    def delete(self, key: str, expected_version: int) -> None:
        self._check("delete")
        self.store.delete(key, expected_version)

    def changes_since(self, revision: int, prefix: str = "") -> builtins.list[Document]:
        self._check("changes_since")
        return self.store.changes_since(revision, prefix)

    def close(self) -> None:
        self.store.close()  # closing is local: never cut
