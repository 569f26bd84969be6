"""Brokers played by ClusterViews on one real metadata store, for tests of cluster-wide rules."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from sluice.broker.cluster import ClusterView
from sluice.broker.config import BrokerConfig
from sluice.metadata.store import MetadataStore


def registered_view(
    store: MetadataStore,
    tmp_path: Path,
    broker_id: int,
    settings: Mapping[str, str] | None = None,
    *,
    refresh: bool = False,
) -> ClusterView:
    """Broker ``broker_id`` (port 9000 + id, its data under ``tmp_path``) registered in ``store``;
    ``refresh``: its view read once, as a started broker's is."""
    config = BrokerConfig.build(
        broker_id, "127.0.0.1", 9000 + broker_id, str(tmp_path / str(broker_id)), "x", dict(settings or {})
    )
    view = ClusterView(store, config)
    view.register()
    if refresh:
        view.refresh()
    return view
