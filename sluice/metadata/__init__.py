"""Cluster metadata: named JSON documents with compare-and-set and change polling.

The Kubernetes API is the cluster's ZooKeeper in production (custom resource
status, compare-and-set on resourceVersion); the embedded cluster uses one
SQLite file shared by its processes. Both sit behind :class:`MetadataStore`.

* :mod:`~sluice.metadata.store`: the interface (get / compare-and-set / watch) and ``update``
* :mod:`~sluice.metadata.local`, :mod:`~sluice.metadata.kubernetes`: the two backends
* :mod:`~sluice.metadata.factory`: ``open_store(url)``, the one module that imports the backends
* :mod:`~sluice.metadata.keys`: the documents' keys
* :mod:`~sluice.metadata.documents`: the documents' typed form (one dataclass per kind) and
  the internal topics' names
* :mod:`~sluice.metadata.placement`: replica placement, shared by broker and controller
"""

from sluice.metadata.factory import open_store
from sluice.metadata.local import SqliteMetadataStore
from sluice.metadata.store import Document, MetadataStore, VersionConflict

__all__ = ["Document", "MetadataStore", "SqliteMetadataStore", "VersionConflict", "open_store"]
