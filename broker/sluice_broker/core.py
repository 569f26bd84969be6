"""The broker's core, built in one place: what :mod:`sluice.broker.main` and the unit tests run.

:func:`build_core` wires every object the two protocol adapters call, explicitly and in one
order, so no object reaches into another to attach itself:

1. the cluster view (the broker's view of the metadata store);
2. the log manager (the partitions' logs on disk) and the replica manager over it
   (leadership, replication, the data path), with the channels to the other brokers;
3. the transaction coordinator, with channels of its own for WriteTxnMarkers (as Kafka's
   TransactionMarkerChannelManager has its own connections: markers never queue behind a
   follower's large ReplicaFetch answers on the same connection), and the replica manager
   then verifies transactional produces with it (KIP-890);
4. the group coordinator, which verifies transactional offset commits the same way;
5. the request gate, the policy both adapters apply (:mod:`sluice.broker.security.gate`).

Start and stop run in dependency order: coordinators start after the replica manager exists
and stop before the channels and the log directory close.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.broker.channels import BrokerChannels
from sluice.broker.cluster import ClusterView
from sluice.broker.config import BrokerConfig
from sluice.broker.group import GroupCoordinator
from sluice.broker.log.manager import LogManager
from sluice.broker.log.storage import Storage
from sluice.broker.replica_manager import ReplicaManager
from sluice.broker.security.gate import RequestGate, build_gate
from sluice.broker.txn import TransactionCoordinator
from sluice.metadata.store import MetadataStore


@dataclass(eq=False)
class BrokerCore:
    """Everything behind the adapters, for one broker."""

    config: BrokerConfig
    store: MetadataStore
    storage: Storage
    cluster: ClusterView
    logs: LogManager
    channels: BrokerChannels  # replication's
    marker_channels: BrokerChannels  # the transaction coordinator's
    replicas: ReplicaManager
    txn: TransactionCoordinator
    groups: GroupCoordinator
    gate: RequestGate

    async def start(self) -> None:
        """Start the coordinators (their partitions load as leadership comes)."""
        await self.txn.start()
        await self.groups.start()

    async def stop(self) -> None:
        """Stop following, checkpoint, stop the coordinators, close the channels and the log directory.

        The metadata store is the caller's (it opened it)."""
        await self.replicas.fetchers.stop()
        self.logs.checkpoint_high_watermarks()
        await self.channels.close()
        await self.groups.stop()
        await self.txn.stop()
        await self.marker_channels.close()
        self.logs.close()
        self.storage.close()


def build_core(config: BrokerConfig, store: MetadataStore, storage: Storage) -> BrokerCore:
    """Wire a broker's core over its metadata ``store`` and log directory ``storage`` (see the module)."""
    cluster = ClusterView(store, config)
    logs = LogManager(storage, cluster, config)
    channels = BrokerChannels(cluster)
    replicas = ReplicaManager(logs, cluster, config, channels)
    marker_channels = BrokerChannels(cluster)
    txn = TransactionCoordinator(replicas, cluster, config, marker_channels)
    replicas.verify_transactions_with(txn.verify_partition)
    groups = GroupCoordinator(replicas, cluster, config)
    gate = build_gate(config, store)
    return BrokerCore(config, store, storage, cluster, logs, channels, marker_channels, replicas, txn, groups, gate)
