"""The Broker service's RPCs as typed descriptors: one :class:`Rpc` per method.

Design:

* An :class:`Rpc` names one method of ``sluice.v1.Broker`` together with the
  types of its request and its response (``Rpc[MetadataRequest,
  MetadataResponse]``). :class:`~sluice.client._network.cluster.Cluster`'s
  calls are generic in them, so ``cluster.call(addr, METADATA, request)`` is a
  ``MetadataResponse`` to mypy, a request of the wrong type is a type error,
  and so is a misspelt RPC (it is a module attribute, not a string).
* The descriptors are built once, at import; a call looks its gRPC
  callable up by the descriptor's identity (no per-call objects, no
  ``getattr`` by name). The generated ``BrokerStub`` is not used: it builds a
  callable for every method on every channel and types them all as ``Any``.
* :data:`PRODUCE_SERIALIZED` is Produce with a request that is already bytes:
  the producer composes Produce requests from batches it serialized once
  (see ``producer/sender.py``), so gRPC must send them as they are
  (no request serializer).

The list below must follow ``proto/sluice/v1/broker.proto``;
``tests/unit/test_client_rpc.py`` checks it against the service descriptor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar
from urllib.parse import quote

from google.protobuf.message import Message

from sluice.api.v1 import broker_pb2

SERVICE = "sluice.v1.Broker"

#: The call metadata key carrying the client's ``client_id`` (as a Kafka request header carries
#: it), percent-encoded (:func:`client_id_metadata`); the broker's client quota entities match it
#: (sluice.broker.security.client_ids reads it).
CLIENT_ID_KEY = "sluice-client-id"
_PRINTABLE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")


def client_id_metadata(client_id: str) -> tuple[tuple[str, str], ...]:
    """The metadata every call of a client sends: its client id (gRPC metadata values are ASCII)."""
    return ((CLIENT_ID_KEY, quote(client_id, safe=_PRINTABLE)),)


RequestT = TypeVar("RequestT")
ResponseT = TypeVar("ResponseT")
_M = TypeVar("_M", bound=Message)
_R = TypeVar("_R", bound=Message)


class Rpc(Generic[RequestT, ResponseT]):
    """One unary method of the Broker service: name, request serializer, response deserializer.

    Compared and hashed by identity: a descriptor is a key of the per-channel
    callable cache.
    """

    __slots__ = ("name", "path", "request_serializer", "response_deserializer")

    def __init__(
        self,
        name: str,
        request_serializer: Callable[[RequestT], bytes] | None,
        response_deserializer: Callable[[bytes], ResponseT],
    ) -> None:
        self.name = name
        self.path = f"/{SERVICE}/{name}"
        self.request_serializer = request_serializer
        self.response_deserializer = response_deserializer

    def __repr__(self) -> str:
        return f"Rpc({self.name})"


def _rpc(name: str, request_type: type[_M], response_type: type[_R]) -> Rpc[_M, _R]:
    return Rpc(name, request_type.SerializeToString, response_type.FromString)


METADATA = _rpc("Metadata", broker_pb2.MetadataRequest, broker_pb2.MetadataResponse)
PRODUCE = _rpc("Produce", broker_pb2.ProduceRequest, broker_pb2.ProduceResponse)
#: Produce with the request serialized by the caller (sent as it is).
PRODUCE_SERIALIZED: Rpc[bytes, broker_pb2.ProduceResponse] = Rpc("Produce", None, broker_pb2.ProduceResponse.FromString)
FETCH = _rpc("Fetch", broker_pb2.FetchRequest, broker_pb2.FetchResponse)
LIST_OFFSETS = _rpc("ListOffsets", broker_pb2.ListOffsetsRequest, broker_pb2.ListOffsetsResponse)
CREATE_TOPICS = _rpc("CreateTopics", broker_pb2.CreateTopicsRequest, broker_pb2.CreateTopicsResponse)
DELETE_TOPICS = _rpc("DeleteTopics", broker_pb2.DeleteTopicsRequest, broker_pb2.DeleteTopicsResponse)
CREATE_PARTITIONS = _rpc("CreatePartitions", broker_pb2.CreatePartitionsRequest, broker_pb2.CreatePartitionsResponse)
ALTER_TOPIC_CONFIGS = _rpc(
    "AlterTopicConfigs", broker_pb2.AlterTopicConfigsRequest, broker_pb2.AlterTopicConfigsResponse
)
ALTER_PARTITION_REASSIGNMENTS = _rpc(
    "AlterPartitionReassignments",
    broker_pb2.AlterPartitionReassignmentsRequest,
    broker_pb2.AlterPartitionReassignmentsResponse,
)
LIST_PARTITION_REASSIGNMENTS = _rpc(
    "ListPartitionReassignments",
    broker_pb2.ListPartitionReassignmentsRequest,
    broker_pb2.ListPartitionReassignmentsResponse,
)
DESCRIBE_LOG_DIRS = _rpc("DescribeLogDirs", broker_pb2.DescribeLogDirsRequest, broker_pb2.DescribeLogDirsResponse)
DESCRIBE_TOPICS = _rpc("DescribeTopics", broker_pb2.MetadataRequest, broker_pb2.MetadataResponse)
FIND_COORDINATOR = _rpc("FindCoordinator", broker_pb2.FindCoordinatorRequest, broker_pb2.FindCoordinatorResponse)
INIT_PRODUCER_ID = _rpc("InitProducerId", broker_pb2.InitProducerIdRequest, broker_pb2.InitProducerIdResponse)
ADD_PARTITIONS_TO_TXN = _rpc(
    "AddPartitionsToTxn", broker_pb2.AddPartitionsToTxnRequest, broker_pb2.AddPartitionsToTxnResponse
)
ADD_OFFSETS_TO_TXN = _rpc("AddOffsetsToTxn", broker_pb2.AddOffsetsToTxnRequest, broker_pb2.AddOffsetsToTxnResponse)
END_TXN = _rpc("EndTxn", broker_pb2.EndTxnRequest, broker_pb2.EndTxnResponse)
PREPARE_TXN = _rpc("PrepareTxn", broker_pb2.PrepareTxnRequest, broker_pb2.PrepareTxnResponse)
DESCRIBE_TRANSACTIONS = _rpc(
    "DescribeTransactions", broker_pb2.DescribeTransactionsRequest, broker_pb2.DescribeTransactionsResponse
)
LIST_TRANSACTIONS = _rpc("ListTransactions", broker_pb2.ListTransactionsRequest, broker_pb2.ListTransactionsResponse)
DESCRIBE_PRODUCERS = _rpc(
    "DescribeProducers", broker_pb2.DescribeProducersRequest, broker_pb2.DescribeProducersResponse
)
ABORT_TRANSACTION = _rpc("AbortTransaction", broker_pb2.AbortTransactionRequest, broker_pb2.AbortTransactionResponse)
TXN_OFFSET_COMMIT = _rpc("TxnOffsetCommit", broker_pb2.TxnOffsetCommitRequest, broker_pb2.TxnOffsetCommitResponse)
OFFSET_COMMIT = _rpc("OffsetCommit", broker_pb2.OffsetCommitRequest, broker_pb2.OffsetCommitResponse)
OFFSET_FETCH = _rpc("OffsetFetch", broker_pb2.OffsetFetchRequest, broker_pb2.OffsetFetchResponse)
CONSUMER_GROUP_HEARTBEAT = _rpc(
    "ConsumerGroupHeartbeat", broker_pb2.ConsumerGroupHeartbeatRequest, broker_pb2.ConsumerGroupHeartbeatResponse
)
LIST_GROUPS = _rpc("ListGroups", broker_pb2.ListGroupsRequest, broker_pb2.ListGroupsResponse)
DESCRIBE_GROUPS = _rpc("DescribeGroups", broker_pb2.DescribeGroupsRequest, broker_pb2.DescribeGroupsResponse)
DELETE_GROUPS = _rpc("DeleteGroups", broker_pb2.DeleteGroupsRequest, broker_pb2.DeleteGroupsResponse)
CREATE_ACLS = _rpc("CreateAcls", broker_pb2.CreateAclsRequest, broker_pb2.CreateAclsResponse)
DESCRIBE_ACLS = _rpc("DescribeAcls", broker_pb2.DescribeAclsRequest, broker_pb2.DescribeAclsResponse)
DELETE_ACLS = _rpc("DeleteAcls", broker_pb2.DeleteAclsRequest, broker_pb2.DeleteAclsResponse)
DESCRIBE_CLIENT_QUOTAS = _rpc(
    "DescribeClientQuotas", broker_pb2.DescribeClientQuotasRequest, broker_pb2.DescribeClientQuotasResponse
)
ALTER_CLIENT_QUOTAS = _rpc(
    "AlterClientQuotas", broker_pb2.AlterClientQuotasRequest, broker_pb2.AlterClientQuotasResponse
)
