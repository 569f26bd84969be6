"""One broker's core in the test's own process: the unit tests' one in-process harness.

It is what the broker process runs (:func:`sluice.broker.core.build_core`: the cluster view, the
log manager and replica manager, both coordinators, the request gate) over a real SQLite
metadata store and a real RocksDB log directory in the test's temporary directory, without the
gRPC or Kafka listeners: tests call the core directly and can reach into it (replace the group
coordinator's clock, hand it a storage that fails on purpose, stop and reopen it on the same
directories). Tests that need real processes and ports use :class:`sluice.testing.LocalCluster`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sluice.broker.cluster import ClusterView
from sluice.broker.config import BrokerConfig
from sluice.broker.core import BrokerCore, build_core
from sluice.broker.group import GroupCoordinator
from sluice.broker.log.manager import LogManager
from sluice.broker.log.storage import RocksStorage, Storage
from sluice.broker.replica_manager import ReplicaManager
from sluice.broker.txn import TransactionCoordinator
from sluice.metadata import open_store
from sluice.metadata.store import MetadataStore
from tests.support.waiting import until


class InProcessBroker:
    """A broker's core on ``tmp``'s directories: ``await open()``, use it, ``await close()``.

    ``config`` holds broker settings (Kafka's keys); ``storage`` builds the log directory from
    its path (a test may pass a subclass of RocksStorage that fails on purpose); ``port`` and
    ``tls_dir`` matter only to tests whose brokers talk to each other.
    """

    def __init__(
        self,
        tmp: Path,
        config: Mapping[str, Any] | None = None,
        *,
        broker_id: int = 0,
        port: int = 1,
        metadata: str = "metadata.sqlite",
        data: str = "data",
        storage: Callable[[str], Storage] = RocksStorage,
        inter_broker_port: int = 0,
        tls_dir: str = "",
    ) -> None:
        self.tmp = tmp
        self.metadata_path = str(tmp / metadata)
        self.data_dir = str(tmp / data)
        self.overrides = dict(config or {})
        self.broker_id = broker_id
        self.port = port
        self.inter_broker_port = inter_broker_port
        self.tls_dir = tls_dir
        self.make_storage = storage
        self._core: BrokerCore | None = None

    @property
    def core(self) -> BrokerCore:
        assert self._core is not None, "open() first"
        return self._core

    @property
    def config(self) -> BrokerConfig:
        return self.core.config

    @property
    def store(self) -> MetadataStore:
        return self.core.store

    @property
    def storage(self) -> Storage:
        return self.core.storage

    @property
    def cluster(self) -> ClusterView:
        return self.core.cluster

    @property
    def logs(self) -> LogManager:
        return self.core.logs

    @property
    def replicas(self) -> ReplicaManager:
        return self.core.replicas

    @property
    def txn(self) -> TransactionCoordinator:
        return self.core.txn

    @property
    def groups(self) -> GroupCoordinator:
        return self.core.groups

    def build(self) -> BrokerCore:
        """Build (not start) the core on the directories, registered as a live broker."""
        os.makedirs(self.data_dir, exist_ok=True)
        store = open_store(self.metadata_path)
        config = BrokerConfig.build(
            self.broker_id,
            "127.0.0.1",
            self.port,
            self.data_dir,
            self.metadata_path,
            self.overrides,
            inter_broker_port=self.inter_broker_port,
            tls_dir=self.tls_dir,
        )
        self._core = build_core(config, store, self.make_storage(os.path.join(self.data_dir, "rocksdb")))
        self._core.cluster.register()
        return self._core

    async def open(
        self, *, topics: Mapping[str, int] | None = None, internal_topics: bool = True, wait_ready: bool = True
    ) -> InProcessBroker:
        """Build and start the core; create the internal topics and ``topics`` (name: partitions, RF 1)
        unless they exist; wait for both coordinators to load (``wait_ready``)."""
        core = self.build()
        await core.start()
        if internal_topics:
            core.cluster.ensure_internal_topics()
        core.cluster.refresh()
        for name, partitions in (topics or {}).items():
            if name not in core.cluster.topics:
                core.cluster.create_topic(name, partitions, 1, {})
        if wait_ready:
            await until(lambda: core.txn.is_ready() and core.groups.is_ready(), "the coordinators to load")
        return self

    async def close(self) -> None:
        """Stop the core and close its store (reopen with ``open()`` on the same directories)."""
        if self._core is None:
            return
        core, self._core = self._core, None
        await core.stop()
        core.store.close()
