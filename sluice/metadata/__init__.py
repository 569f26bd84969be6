"""Cluster metadata: named JSON documents with compare-and-set and change polling.

The Kubernetes API is the cluster's ZooKeeper in production (custom resource
status, compare-and-set on resourceVersion); the embedded cluster uses one
SQLite file shared by its processes. Both sit behind :class:`MetadataStore`.
Document keys used by Sluice are listed in :mod:`sluice.metadata.keys`.
"""

from sluice.metadata.local import SqliteMetadataStore
from sluice.metadata.store import Document, MetadataStore, VersionConflict, open_store

__all__ = ["Document", "MetadataStore", "SqliteMetadataStore", "VersionConflict", "open_store"]
