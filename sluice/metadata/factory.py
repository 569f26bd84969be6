"""``open_store(url)``: a MetadataStore from a location string, whichever backend it names.

The one module that imports the backends. It sits beside the interface
(:mod:`sluice.metadata.store`) rather than in it, so the backends, which import
the interface, are never imported by it in turn. The Kubernetes backend is
imported only for a ``kubernetes:`` URL: it pulls in the kubernetes client,
which a broker on SQLite never needs.
"""

from __future__ import annotations

from sluice.metadata.local import SqliteMetadataStore
from sluice.metadata.store import MetadataStore

__all__ = ["open_store"]


def open_store(url: str) -> MetadataStore:
    """A store from a location: ``kubernetes://NAMESPACE[?kubeconfig=..&context=..]`` (custom
    resources through the API server, :mod:`sluice.metadata.kubernetes`), else a SQLite file
    path (or ``sqlite:///path``)."""
    if url.startswith("kubernetes:"):
        from sluice.metadata.kubernetes import KubernetesMetadataStore

        return KubernetesMetadataStore.from_url(url)
    return SqliteMetadataStore(url.removeprefix("sqlite://"))
