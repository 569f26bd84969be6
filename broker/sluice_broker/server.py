"""The broker's gRPC surface: both services of :mod:`sluice.broker.servicers`, ready to register.

``main`` builds a :class:`BrokerServicer` and adds :meth:`BrokerServicer.handlers`
to its ``grpc.aio`` server. The services themselves are thin (one module per
service in ``servicers/``); everything they hand over is the core's.
"""

from __future__ import annotations

from typing import Any

import grpc

from sluice.broker.cluster import ClusterView
from sluice.broker.config import BrokerConfig
from sluice.broker.group import GroupCoordinator
from sluice.broker.replica_manager import ReplicaManager
from sluice.broker.servicers import BrokerService, InterBrokerService
from sluice.broker.txn import TransactionCoordinator


class BrokerServicer:
    """sluice.v1.Broker and sluice.v1.InterBroker of one broker."""

    def __init__(
        self,
        config: BrokerConfig,
        cluster: ClusterView,
        replicas: ReplicaManager,
        txn: TransactionCoordinator,
        groups: GroupCoordinator,
    ) -> None:
        self.config = config
        self.broker = BrokerService(cluster, replicas, txn, groups)
        self.interbroker = InterBrokerService(replicas)

    def handlers(self) -> list[grpc.GenericRpcHandler[Any, Any]]:
        return [self.broker.handler(), self.interbroker.handler()]
