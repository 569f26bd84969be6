"""One broker's metrics: the registry of every collector, and what a scrape does.

:class:`BrokerMetrics` registers the collectors of :mod:`.collectors` (and
prometheus_client's process collector: CPU, memory, open files) in a registry
of its own (not the library's global one, so several brokers in one process,
as in unit tests, never mix). :meth:`BrokerMetrics.render` is a scrape:
refresh the end offsets consumer lag needs from other leaders, then let
prometheus_client encode every family.
"""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.exposition import choose_encoder

from sluice.broker.cluster import ClusterView
from sluice.broker.config import BrokerConfig
from sluice.broker.group import GroupCoordinator
from sluice.broker.log.storage import Storage
from sluice.broker.metrics.collectors import (
    CoordinatorCollector,
    EventsCollector,
    GroupCollector,
    ReplicaCollector,
    StorageCollector,
    TransactionCollector,
)
from sluice.broker.metrics.http import start_metrics_server
from sluice.broker.replica_manager import ReplicaManager
from sluice.broker.txn import TransactionCoordinator


class BrokerMetrics:
    def __init__(
        self,
        config: BrokerConfig,
        storage: Storage,
        cluster: ClusterView,
        replicas: ReplicaManager,
        txn: TransactionCoordinator,
        groups: GroupCoordinator,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        group_collector = GroupCollector(groups)
        self.end_offsets = group_collector.end_offsets
        for collector in (
            ReplicaCollector(replicas, cluster, config),
            CoordinatorCollector(txn, groups),
            TransactionCollector(txn),
            group_collector,
            StorageCollector(storage, config.data_dir),
            EventsCollector(replicas.events),
        ):
            self.registry.register(collector)
        ProcessCollector(registry=self.registry)
        self._server: asyncio.Server | None = None

    async def render(self, accept: str = "") -> tuple[bytes, str]:
        """One scrape: the exposition (text format, or OpenMetrics if ``accept`` asks for it) and its type."""
        await self.end_offsets.refresh()
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type

    async def start(self, host: str, port: int) -> None:
        self._server = await start_metrics_server(host, port, self.render)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
