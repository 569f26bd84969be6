"""What every client shares: channels, typed RPCs, metadata, coordinator lookup, retries.

* :mod:`.rpc`: one typed descriptor per Broker RPC (request type -> response type).
* :mod:`.cluster`: :class:`Cluster`, the channels to brokers, the metadata
  cache, coordinator lookup and the typed calls (one broker, any broker,
  every broker, a coordinator with its retry loop).
* :mod:`.error_mapping`: gRPC status codes and response error codes to
  :mod:`sluice.errors`.
* :mod:`.leaders`: :func:`~.leaders.call_leaders`, one request per partition
  leader, retried per partition (ListOffsets, DescribeProducers, AbortTransaction).
* :mod:`.retry`: :class:`Deadline`, :class:`Backoff` and :func:`retry`.

The names below are re-exported so clients (and ``sluice.spark``) import
them from one place.
"""

from sluice.client._network.cluster import (
    CHANNEL_OPTIONS,
    GROUP,
    MAX_MESSAGE_BYTES,
    TRANSACTION,
    Cluster,
    PartitionInfo,
    TopicInfo,
    broker_address,
    parse_bootstrap,
)
from sluice.client._network.error_mapping import (
    COORDINATOR_MOVED_CODES,
    METADATA_REFRESH_CODES,
    first_error,
    map_rpc_error,
    response_error,
)
from sluice.client._network.retry import Backoff, Deadline, retry
from sluice.client._network.rpc import Rpc

__all__ = [
    "CHANNEL_OPTIONS",
    "COORDINATOR_MOVED_CODES",
    "GROUP",
    "MAX_MESSAGE_BYTES",
    "METADATA_REFRESH_CODES",
    "TRANSACTION",
    "Backoff",
    "Cluster",
    "Deadline",
    "PartitionInfo",
    "Rpc",
    "TopicInfo",
    "broker_address",
    "first_error",
    "map_rpc_error",
    "parse_bootstrap",
    "response_error",
    "retry",
]
