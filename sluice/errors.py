"""Errors of the Sluice client and broker, one class per Kafka error code.

Every broker response carries an ``ErrorCode`` (proto/sluice/v1/records.proto,
Kafka's numbers and names). :func:`error_for` turns one into an exception of the
matching class, so callers catch what they mean::

    try:
        producer.commit_transaction()
    except errors.ProducerFencedError:
        ...                       # another instance took over: close, do not retry

``SluiceError.retriable`` says whether trying the same request again may
succeed (after refreshing metadata or finding the coordinator again). The
client retries retriable errors itself within its delivery timeout; what
reaches the application is fatal, or a retriable one that ran out of time.

The table below is the single place that maps codes to classes and says what
is retriable; broker and client both read it.
"""

from __future__ import annotations

from typing import ClassVar

from sluice.api.v1 import records_pb2

ErrorCode = records_pb2.ErrorCode


class SluiceError(Exception):
    """Base of every Sluice error. ``code`` is the wire ErrorCode (NONE for client-side errors)."""

    code: ClassVar[ErrorCode] = records_pb2.UNKNOWN_SERVER_ERROR
    retriable: ClassVar[bool] = False

    def __init__(self, message: str = "") -> None:
        self.message = message or self.__class__.__doc__ or self.__class__.__name__
        super().__init__(self.message)

    @property
    def code_name(self) -> str:
        return records_pb2.ErrorCode.Name(self.code) if self.code in _BY_CODE else "CLIENT_ERROR"


# -- client-side errors (no wire code) -------------------------------------------------------------


class IllegalStateError(SluiceError):
    """The call is not legal in the client's current state (e.g. init_transactions twice)."""

    code = records_pb2.NONE


class KafkaTimeoutError(SluiceError):
    """The operation did not complete within its timeout (delivery_timeout_ms, max_block_ms ...)."""

    code = records_pb2.NONE
    retriable = True


class BrokerNotAvailableError(SluiceError):
    """No broker of the bootstrap list or the metadata answered."""

    code = records_pb2.NONE
    retriable = True


class InvalidArgumentError(SluiceError):
    """The broker refused the request as malformed (gRPC INVALID_ARGUMENT)."""

    code = records_pb2.INVALID_REQUEST


# -- one class per wire error code ----------------------------------------------------------------

_BY_CODE: dict[int, type[SluiceError]] = {}


def _define(name: str, code: ErrorCode, retriable: bool, doc: str) -> type[SluiceError]:
    cls = type(name, (SluiceError,), {"code": code, "retriable": retriable, "__doc__": doc})
    _BY_CODE[code] = cls
    return cls


E = records_pb2
UnknownServerError = _define("UnknownServerError", E.UNKNOWN_SERVER_ERROR, False, "Unexpected broker error.")
OffsetOutOfRangeError = _define(
    "OffsetOutOfRangeError", E.OFFSET_OUT_OF_RANGE, False, "The offset is outside the log's range."
)
CorruptMessageError = _define(
    "CorruptMessageError", E.CORRUPT_MESSAGE, True, "The batch failed its CRC check or could not be decoded."
)
UnknownTopicOrPartitionError = _define(
    "UnknownTopicOrPartitionError", E.UNKNOWN_TOPIC_OR_PARTITION, True, "The topic or partition does not exist."
)
InvalidFetchSizeError = _define("InvalidFetchSizeError", E.INVALID_FETCH_SIZE, False, "Invalid fetch size.")
LeaderNotAvailableError = _define(
    "LeaderNotAvailableError", E.LEADER_NOT_AVAILABLE, True, "The partition has no leader right now."
)
NotLeaderOrFollowerError = _define(
    "NotLeaderOrFollowerError", E.NOT_LEADER_OR_FOLLOWER, True, "This broker does not lead the partition."
)
RequestTimedOutError = _define("RequestTimedOutError", E.REQUEST_TIMED_OUT, True, "The request timed out.")
MessageTooLargeError = _define(
    "MessageTooLargeError", E.MESSAGE_TOO_LARGE, False, "The batch is larger than max.message.bytes."
)
CoordinatorLoadInProgressError = _define(
    "CoordinatorLoadInProgressError", E.COORDINATOR_LOAD_IN_PROGRESS, True, "The coordinator is loading its state."
)
CoordinatorNotAvailableError = _define(
    "CoordinatorNotAvailableError", E.COORDINATOR_NOT_AVAILABLE, True, "The coordinator is not available."
)
NotCoordinatorError = _define(
    "NotCoordinatorError", E.NOT_COORDINATOR, True, "This broker is not the coordinator for the key."
)
InvalidTopicError = _define(
    "InvalidTopicError", E.INVALID_TOPIC_EXCEPTION, False, "Invalid topic name, or a write to an internal topic."
)
RecordListTooLargeError = _define(
    "RecordListTooLargeError", E.RECORD_LIST_TOO_LARGE, False, "The request is too large."
)
NotEnoughReplicasError = _define(
    "NotEnoughReplicasError", E.NOT_ENOUGH_REPLICAS, True, "Fewer in-sync replicas than min.insync.replicas."
)
NotEnoughReplicasAfterAppendError = _define(
    "NotEnoughReplicasAfterAppendError",
    E.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    True,
    "Stored, but fewer in-sync replicas than min.insync.replicas acknowledged it.",
)
InvalidRequiredAcksError = _define(
    "InvalidRequiredAcksError", E.INVALID_REQUIRED_ACKS, False, "acks must be -1 (all), 0 or 1."
)
IllegalGenerationError = _define("IllegalGenerationError", E.ILLEGAL_GENERATION, False, "Stale group generation.")
InvalidGroupIdError = _define("InvalidGroupIdError", E.INVALID_GROUP_ID, False, "The group id is invalid.")
UnknownMemberIdError = _define(
    "UnknownMemberIdError", E.UNKNOWN_MEMBER_ID, False, "The group coordinator does not know this member."
)
InvalidSessionTimeoutError = _define(
    "InvalidSessionTimeoutError", E.INVALID_SESSION_TIMEOUT, False, "The session timeout is out of range."
)
InvalidTimestampError = _define("InvalidTimestampError", E.INVALID_TIMESTAMP, False, "Invalid record timestamp.")
TopicAlreadyExistsError = _define(
    "TopicAlreadyExistsError", E.TOPIC_ALREADY_EXISTS, False, "A topic of that name exists."
)
InvalidPartitionsError = _define(
    "InvalidPartitionsError", E.INVALID_PARTITIONS, False, "Invalid number of partitions."
)
InvalidReplicationFactorError = _define(
    "InvalidReplicationFactorError", E.INVALID_REPLICATION_FACTOR, False, "Invalid replication factor."
)
InvalidConfigError = _define("InvalidConfigError", E.INVALID_CONFIG, False, "Invalid configuration.")
InvalidRequestError = _define("InvalidRequestError", E.INVALID_REQUEST, False, "The request is invalid.")
OutOfOrderSequenceError = _define(
    "OutOfOrderSequenceError",
    E.OUT_OF_ORDER_SEQUENCE_NUMBER,
    False,
    "The broker received a sequence number it did not expect: a gap in the producer's writes.",
)
DuplicateSequenceNumberError = _define(
    "DuplicateSequenceNumberError", E.DUPLICATE_SEQUENCE_NUMBER, False, "A duplicate sequence number."
)
InvalidProducerEpochError = _define(
    "InvalidProducerEpochError", E.INVALID_PRODUCER_EPOCH, False, "The producer epoch is stale."
)
InvalidTxnStateError = _define(
    "InvalidTxnStateError", E.INVALID_TXN_STATE, False, "The operation is not legal in the transaction's state."
)
InvalidProducerIdMappingError = _define(
    "InvalidProducerIdMappingError",
    E.INVALID_PRODUCER_ID_MAPPING,
    False,
    "The producer id does not belong to this transactional id.",
)
InvalidTransactionTimeoutError = _define(
    "InvalidTransactionTimeoutError",
    E.INVALID_TRANSACTION_TIMEOUT,
    False,
    "The transaction timeout is above transaction.max.timeout.ms (or not positive).",
)
ConcurrentTransactionsError = _define(
    "ConcurrentTransactionsError",
    E.CONCURRENT_TRANSACTIONS,
    True,
    "The previous transaction of this producer is still being completed.",
)
TransactionCoordinatorFencedError = _define(
    "TransactionCoordinatorFencedError",
    E.TRANSACTION_COORDINATOR_FENCED,
    False,
    "A newer transaction coordinator has taken over.",
)
TransactionalIdAuthorizationFailedError = _define(
    "TransactionalIdAuthorizationFailedError",
    E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    False,
    "The transactional id is not declared or not allowed.",
)
KafkaStorageError = _define("KafkaStorageError", E.KAFKA_STORAGE_ERROR, True, "The broker's storage failed.")
UnknownProducerIdError = _define(
    "UnknownProducerIdError",
    E.UNKNOWN_PRODUCER_ID,
    False,
    "The partition has no state for this producer id and the sequence is not 0.",
)
GroupIdNotFoundError = _define("GroupIdNotFoundError", E.GROUP_ID_NOT_FOUND, False, "The group does not exist.")
FencedLeaderEpochError = _define(
    "FencedLeaderEpochError", E.FENCED_LEADER_EPOCH, True, "The leader epoch in the request is stale."
)
UnknownLeaderEpochError = _define(
    "UnknownLeaderEpochError", E.UNKNOWN_LEADER_EPOCH, True, "The leader epoch in the request is newer."
)
UnsupportedCompressionTypeError = _define(
    "UnsupportedCompressionTypeError", E.UNSUPPORTED_COMPRESSION_TYPE, False, "Unsupported compression."
)
InvalidRecordError = _define("InvalidRecordError", E.INVALID_RECORD, False, "The batch's header is invalid.")
UnstableOffsetCommitError = _define(
    "UnstableOffsetCommitError",
    E.UNSTABLE_OFFSET_COMMIT,
    True,
    "The group has transactional offsets pending for this partition.",
)
ProducerFencedError = _define(
    "ProducerFencedError",
    E.PRODUCER_FENCED,
    False,
    "Another producer with the same transactional.id has taken over (a newer epoch).",
)
TransactionalIdNotFoundError = _define(
    "TransactionalIdNotFoundError", E.TRANSACTIONAL_ID_NOT_FOUND, False, "No such transactional id."
)
FencedMemberEpochError = _define(
    "FencedMemberEpochError", E.FENCED_MEMBER_EPOCH, False, "The group member's epoch is stale: rejoin."
)
UnreleasedInstanceIdError = _define(
    "UnreleasedInstanceIdError", E.UNRELEASED_INSTANCE_ID, False, "The instance id is still in use."
)
del E


def error_class(code: int) -> type[SluiceError]:
    """The exception class for a wire ErrorCode (UnknownServerError for unknown codes)."""
    return _BY_CODE.get(code, UnknownServerError)


def error_for(code: int, message: str = "") -> SluiceError:
    """An exception instance for a wire ErrorCode and the broker's message."""
    return error_class(code)(message)


def is_retriable(code: int) -> bool:
    return code != records_pb2.NONE and error_class(code).retriable


def check(code: int, message: str = "") -> None:
    """Raise the matching error unless ``code`` is NONE."""
    if code != records_pb2.NONE:
        raise error_for(code, message)
