"""Kafka API handlers: one module per API, each thin over the broker's core.

A handler serves a version range (:attr:`Handler.versions`, within what the
generated codec knows) and turns a decoded request into a response message.
:data:`HANDLERS` is what the listener dispatches on and what ApiVersions
advertises: an API is advertised exactly when it has a handler here.
"""

from __future__ import annotations

from sluice.broker.kafka.handlers.api_versions import ApiVersionsHandler
from sluice.broker.kafka.handlers.base import Handler
from sluice.broker.kafka.handlers.classic_groups import (
    HeartbeatHandler,
    JoinGroupHandler,
    LeaveGroupHandler,
    SyncGroupHandler,
)
from sluice.broker.kafka.handlers.client_quotas import AlterClientQuotasHandler, DescribeClientQuotasHandler
from sluice.broker.kafka.handlers.consumer_group_heartbeat import ConsumerGroupHeartbeatHandler
from sluice.broker.kafka.handlers.describe_cluster import DescribeClusterHandler
from sluice.broker.kafka.handlers.describe_configs import DescribeConfigsHandler
from sluice.broker.kafka.handlers.describe_log_dirs import DescribeLogDirsHandler
from sluice.broker.kafka.handlers.describe_producers import DescribeProducersHandler
from sluice.broker.kafka.handlers.describe_transactions import (
    DescribeTransactionsHandler,
    ListTransactionsHandler,
)
from sluice.broker.kafka.handlers.fetch import FetchHandler
from sluice.broker.kafka.handlers.find_coordinator import FindCoordinatorHandler
from sluice.broker.kafka.handlers.groups import (
    ConsumerGroupDescribeHandler,
    DeleteGroupsHandler,
    DescribeGroupsHandler,
    ListGroupsHandler,
)
from sluice.broker.kafka.handlers.incremental_alter_configs import IncrementalAlterConfigsHandler
from sluice.broker.kafka.handlers.init_producer_id import InitProducerIdHandler
from sluice.broker.kafka.handlers.list_offsets import ListOffsetsHandler
from sluice.broker.kafka.handlers.metadata import MetadataHandler
from sluice.broker.kafka.handlers.offset_for_leader_epoch import OffsetForLeaderEpochHandler
from sluice.broker.kafka.handlers.offsets import OffsetCommitHandler, OffsetFetchHandler, TxnOffsetCommitHandler
from sluice.broker.kafka.handlers.produce import ProduceHandler
from sluice.broker.kafka.handlers.reassignments import (
    AlterPartitionReassignmentsHandler,
    ListPartitionReassignmentsHandler,
)
from sluice.broker.kafka.handlers.sasl import SaslAuthenticateHandler, SaslHandshakeHandler
from sluice.broker.kafka.handlers.topics import CreatePartitionsHandler, CreateTopicsHandler, DeleteTopicsHandler
from sluice.broker.kafka.handlers.transactions import (
    AddOffsetsToTxnHandler,
    AddPartitionsToTxnHandler,
    EndTxnHandler,
)
from sluice.broker.kafka.handlers.write_txn_markers import WriteTxnMarkersHandler


def build_handlers(sasl: bool = False) -> dict[int, Handler]:
    """The handlers of a listener; ``sasl``: with SaslHandshake and SaslAuthenticate (a token listener)."""
    handlers: dict[int, Handler] = {}
    served: list[Handler] = [
        MetadataHandler(),
        ProduceHandler(),
        FetchHandler(),
        FindCoordinatorHandler(),
        CreateTopicsHandler(),
        DeleteTopicsHandler(),
        CreatePartitionsHandler(),
        AlterPartitionReassignmentsHandler(),
        ListPartitionReassignmentsHandler(),
        DescribeLogDirsHandler(),
        DescribeClusterHandler(),
        ListOffsetsHandler(),
        InitProducerIdHandler(),
        AddPartitionsToTxnHandler(),
        AddOffsetsToTxnHandler(),
        EndTxnHandler(),
        DescribeTransactionsHandler(),
        ListTransactionsHandler(),
        OffsetCommitHandler(),
        OffsetFetchHandler(),
        TxnOffsetCommitHandler(),
        OffsetForLeaderEpochHandler(),
        DescribeConfigsHandler(),
        IncrementalAlterConfigsHandler(),
        ListGroupsHandler(),
        DeleteGroupsHandler(),
        DescribeGroupsHandler(),
        JoinGroupHandler(),
        SyncGroupHandler(),
        HeartbeatHandler(),
        LeaveGroupHandler(),
        ConsumerGroupHeartbeatHandler(),
        ConsumerGroupDescribeHandler(),
        DescribeProducersHandler(),
        WriteTxnMarkersHandler(),
        DescribeClientQuotasHandler(),
        AlterClientQuotasHandler(),
    ]
    if sasl:
        served += [SaslHandshakeHandler(), SaslAuthenticateHandler()]
    for handler in served:
        handlers[handler.api_key] = handler
    api_versions = ApiVersionsHandler(handlers)  # advertises every handler, itself included
    handlers[api_versions.api_key] = api_versions
    return handlers


__all__ = ["Handler", "build_handlers"]
