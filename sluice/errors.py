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

``SluiceError.category`` says what the *application* does about an error,
in the four categories of Kafka's KIP-1050 (docs/errors.md has the table):

- RETRIABLE: the client retries by itself within its timeout; an application
  sees one only when that ran out, and may repeat the call (or, inside a
  transaction, abort it).
- ABORTABLE: this transaction (or this record) failed, the producer did not:
  ``abort_transaction()`` and begin the next one with the same producer.
- APPLICATION_RECOVERABLE: this producer can go no further (fenced, or its
  producer id is gone): close it; a new producer with the same transactional
  id recovers (its ``init_transactions()`` ends what was left open).
- FATAL: retrying, aborting or a new producer will not help until the
  configuration, the authorization or the request itself is fixed.

A class that names no category gets RETRIABLE if it is retriable and FATAL
otherwise (``__init_subclass__``), so a new error is never silently abortable.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar

from sluice.api.v1 import records_pb2

ErrorCode = records_pb2.ErrorCode


class ErrorCategory(StrEnum):
    """What the application does about an error (Kafka's KIP-1050 categories)."""

    RETRIABLE = "retriable"
    ABORTABLE = "abortable"
    APPLICATION_RECOVERABLE = "application-recoverable"
    FATAL = "fatal"


Category = ErrorCategory


class SluiceError(Exception):
    """Base of every Sluice error. ``code`` is the wire ErrorCode (NONE for client-side errors)."""

    code: ClassVar[ErrorCode] = records_pb2.UNKNOWN_SERVER_ERROR
    retriable: ClassVar[bool] = False
    category: ClassVar[ErrorCategory] = ErrorCategory.FATAL

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        named = any("category" in c.__dict__ for c in cls.__mro__[:-1] if c is not SluiceError)
        if not named:  # no class on the way names one: follow ``retriable``, never abortable by accident
            cls.category = ErrorCategory.RETRIABLE if cls.retriable else ErrorCategory.FATAL

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


class BufferExhaustedError(KafkaTimeoutError):
    """send() waited max_block_ms for room in the producer's buffer_memory (Kafka's BufferExhaustedException)."""


class BrokerNotAvailableError(SluiceError):
    """No broker of the bootstrap list or the metadata answered."""

    code = records_pb2.NONE
    retriable = True


class NoBrokersAvailableError(SluiceError):
    """Nothing listens at any address the client knows (every connection refused), or nothing there
    speaks gRPC (a Kafka port), and it never reached a broker: a wrong bootstrap address or a stopped
    cluster. Raised at once, naming the addresses."""

    code = records_pb2.NONE


class InvalidArgumentError(SluiceError):
    """The broker refused the request as malformed (gRPC INVALID_ARGUMENT)."""

    code = records_pb2.INVALID_REQUEST
    category = Category.ABORTABLE


# -- one class per wire error code: the table ------------------------------------------------------
#
# Each class is one row: the Kafka name (the wire ErrorCode), whether it is retriable, and the
# exception raised for it. Broker code raises these (sluice.broker.errors) and the client raises
# them from response codes (error_for), so both sides read the same table.

E = records_pb2


class UnknownServerError(SluiceError):
    """Unexpected broker error."""

    code = E.UNKNOWN_SERVER_ERROR
    retriable = False
    category = Category.ABORTABLE


class OffsetOutOfRangeError(SluiceError):
    """The offset is outside the log's range."""

    code = E.OFFSET_OUT_OF_RANGE
    retriable = False
    category = Category.ABORTABLE


class CorruptMessageError(SluiceError):
    """The batch failed its CRC check or could not be decoded."""

    code = E.CORRUPT_MESSAGE
    retriable = True


class UnknownTopicOrPartitionError(SluiceError):
    """The topic or partition does not exist."""

    code = E.UNKNOWN_TOPIC_OR_PARTITION
    retriable = True


class InvalidFetchSizeError(SluiceError):
    """Invalid fetch size."""

    code = E.INVALID_FETCH_SIZE
    retriable = False
    category = Category.ABORTABLE


class LeaderNotAvailableError(SluiceError):
    """The partition has no leader right now."""

    code = E.LEADER_NOT_AVAILABLE
    retriable = True


class NotLeaderOrFollowerError(SluiceError):
    """This broker does not lead the partition."""

    code = E.NOT_LEADER_OR_FOLLOWER
    retriable = True


class RequestTimedOutError(SluiceError):
    """The request timed out."""

    code = E.REQUEST_TIMED_OUT
    retriable = True


class MessageTooLargeError(SluiceError):
    """The batch is larger than max.message.bytes."""

    code = E.MESSAGE_TOO_LARGE
    retriable = False
    category = Category.ABORTABLE


class CoordinatorLoadInProgressError(SluiceError):
    """The coordinator is loading its state."""

    code = E.COORDINATOR_LOAD_IN_PROGRESS
    retriable = True


class CoordinatorNotAvailableError(SluiceError):
    """The coordinator is not available."""

    code = E.COORDINATOR_NOT_AVAILABLE
    retriable = True


class NotCoordinatorError(SluiceError):
    """This broker is not the coordinator for the key."""

    code = E.NOT_COORDINATOR
    retriable = True


class InvalidTopicError(SluiceError):
    """Invalid topic name, or a write to an internal topic."""

    code = E.INVALID_TOPIC_EXCEPTION
    retriable = False
    category = Category.ABORTABLE


class RecordListTooLargeError(SluiceError):
    """The request is too large."""

    code = E.RECORD_LIST_TOO_LARGE
    retriable = False
    category = Category.ABORTABLE


class NotEnoughReplicasError(SluiceError):
    """Fewer in-sync replicas than min.insync.replicas."""

    code = E.NOT_ENOUGH_REPLICAS
    retriable = True


class NotEnoughReplicasAfterAppendError(SluiceError):
    """Stored, but fewer in-sync replicas than min.insync.replicas acknowledged it."""

    code = E.NOT_ENOUGH_REPLICAS_AFTER_APPEND
    retriable = True


class InvalidRequiredAcksError(SluiceError):
    """acks must be -1 (all), 0 or 1."""

    code = E.INVALID_REQUIRED_ACKS
    retriable = False


class IllegalGenerationError(SluiceError):
    """Stale group generation."""

    code = E.ILLEGAL_GENERATION
    retriable = False
    category = Category.ABORTABLE


class InconsistentGroupProtocolError(SluiceError):
    """No protocol every member of the classic group supports, or the group is of the other type."""

    code = E.INCONSISTENT_GROUP_PROTOCOL
    retriable = False


class InvalidGroupIdError(SluiceError):
    """The group id is invalid."""

    code = E.INVALID_GROUP_ID
    retriable = False
    category = Category.ABORTABLE


class UnknownMemberIdError(SluiceError):
    """The group coordinator does not know this member."""

    code = E.UNKNOWN_MEMBER_ID
    retriable = False
    category = Category.ABORTABLE


class InvalidSessionTimeoutError(SluiceError):
    """The session timeout is out of range."""

    code = E.INVALID_SESSION_TIMEOUT
    retriable = False


class InvalidTimestampError(SluiceError):
    """Invalid record timestamp."""

    code = E.INVALID_TIMESTAMP
    retriable = False
    category = Category.ABORTABLE


class TopicAlreadyExistsError(SluiceError):
    """A topic of that name exists."""

    code = E.TOPIC_ALREADY_EXISTS
    retriable = False


class InvalidPartitionsError(SluiceError):
    """Invalid number of partitions."""

    code = E.INVALID_PARTITIONS
    retriable = False


class InvalidReplicationFactorError(SluiceError):
    """Invalid replication factor."""

    code = E.INVALID_REPLICATION_FACTOR
    retriable = False


class InvalidReplicaAssignmentError(SluiceError):
    """A reassignment's target replicas are invalid: empty, a broker twice, or an unknown broker."""

    code = E.INVALID_REPLICA_ASSIGNMENT
    retriable = False


class NoReassignmentInProgressError(SluiceError):
    """A reassignment was cancelled for a partition that is not being reassigned."""

    code = E.NO_REASSIGNMENT_IN_PROGRESS
    retriable = False


class InvalidConfigError(SluiceError):
    """Invalid configuration."""

    code = E.INVALID_CONFIG
    retriable = False


class InvalidRequestError(SluiceError):
    """The request is invalid."""

    code = E.INVALID_REQUEST
    retriable = False
    category = Category.ABORTABLE


class PolicyViolationError(SluiceError):
    """A configured cap is reached (producer states per partition, transactional ids); the message names its key."""

    code = E.POLICY_VIOLATION
    retriable = False
    category = Category.ABORTABLE  # the record or call fails, the client goes on (as MESSAGE_TOO_LARGE)


class OutOfOrderSequenceError(SluiceError):
    """The broker received a sequence number it did not expect: a gap in the producer's writes."""

    code = E.OUT_OF_ORDER_SEQUENCE_NUMBER
    retriable = False
    category = Category.ABORTABLE


class DuplicateSequenceNumberError(SluiceError):
    """A duplicate sequence number."""

    code = E.DUPLICATE_SEQUENCE_NUMBER
    retriable = False
    category = Category.ABORTABLE


class InvalidProducerEpochError(SluiceError):
    """The producer epoch is stale."""

    code = E.INVALID_PRODUCER_EPOCH
    retriable = False
    category = Category.ABORTABLE


class InvalidTxnStateError(SluiceError):
    """The operation is not legal in the transaction's state."""

    code = E.INVALID_TXN_STATE
    retriable = False


class InvalidProducerIdMappingError(SluiceError):
    """The producer id does not belong to this transactional id."""

    code = E.INVALID_PRODUCER_ID_MAPPING
    retriable = False
    category = Category.APPLICATION_RECOVERABLE


class InvalidTransactionTimeoutError(SluiceError):
    """The transaction timeout is above transaction.max.timeout.ms (or not positive)."""

    code = E.INVALID_TRANSACTION_TIMEOUT
    retriable = False


class ConcurrentTransactionsError(SluiceError):
    """The previous transaction of this producer is still being completed."""

    code = E.CONCURRENT_TRANSACTIONS
    retriable = True


class TransactionCoordinatorFencedError(SluiceError):
    """A newer transaction coordinator has taken over."""

    code = E.TRANSACTION_COORDINATOR_FENCED
    retriable = False
    category = Category.APPLICATION_RECOVERABLE


class RebalanceInProgressError(SluiceError):
    """The classic group is rebalancing: rejoin."""

    code = E.REBALANCE_IN_PROGRESS
    retriable = False
    category = Category.ABORTABLE


class TopicAuthorizationFailedError(SluiceError):
    """The principal is not authorized for this operation on the topic (no ACL allows it, or one denies it)."""

    code = E.TOPIC_AUTHORIZATION_FAILED
    retriable = False
    # In a transaction Kafka's producer takes it as abortable: abort, fix the ACLs, go on (KIP-1050).
    category = Category.ABORTABLE


class GroupAuthorizationFailedError(SluiceError):
    """The principal is not authorized for this operation on the consumer group."""

    code = E.GROUP_AUTHORIZATION_FAILED
    retriable = False
    # In a transaction Kafka's producer takes it as abortable: abort, fix the ACLs, go on (KIP-1050).
    category = Category.ABORTABLE


class ClusterAuthorizationFailedError(SluiceError):
    """The principal is not authorized for this cluster-level operation."""

    code = E.CLUSTER_AUTHORIZATION_FAILED
    retriable = False


class TransactionalIdAuthorizationFailedError(SluiceError):
    """The transactional id is not declared or not allowed."""

    code = E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    retriable = False


class SecurityDisabledError(SluiceError):
    """The broker's authorizer is off (authorizer.enabled=false): there are no ACLs to manage."""

    code = E.SECURITY_DISABLED
    retriable = False


class SaslAuthenticationFailedError(SluiceError):
    """The broker could not authenticate the client: no token, or one that is invalid, expired or
    issued for another audience (a token listener, docs/security.md). Kafka's SaslAuthenticationException."""

    code = E.SASL_AUTHENTICATION_FAILED
    retriable = False


class OperationNotAttemptedError(SluiceError):
    """Not tried: another part of the same request was refused (an authorization failure)."""

    code = E.OPERATION_NOT_ATTEMPTED
    retriable = False


class KafkaStorageError(SluiceError):
    """The broker's storage failed."""

    code = E.KAFKA_STORAGE_ERROR
    retriable = True


class UnknownProducerIdError(SluiceError):
    """The partition has no state for this producer id and the sequence is not 0."""

    code = E.UNKNOWN_PRODUCER_ID
    retriable = False
    category = Category.ABORTABLE


class NonEmptyGroupError(SluiceError):
    """The group still has members: it cannot be deleted (and its offsets cannot be reset) now."""

    code = E.NON_EMPTY_GROUP
    retriable = False


class GroupIdNotFoundError(SluiceError):
    """The group does not exist."""

    code = E.GROUP_ID_NOT_FOUND
    retriable = False
    category = Category.ABORTABLE


class FencedLeaderEpochError(SluiceError):
    """The leader epoch in the request is stale."""

    code = E.FENCED_LEADER_EPOCH
    retriable = True


class UnknownLeaderEpochError(SluiceError):
    """The leader epoch in the request is newer."""

    code = E.UNKNOWN_LEADER_EPOCH
    retriable = True


class OffsetNotAvailableError(SluiceError):
    """The leader cannot answer this offset yet: it was just elected and its high watermark is still catching up."""

    code = E.OFFSET_NOT_AVAILABLE
    retriable = True


class MemberIdRequiredError(SluiceError):
    """Classic JoinGroup (KIP-394): join again with the member id the coordinator gave."""

    code = E.MEMBER_ID_REQUIRED
    retriable = False


class GroupMaxSizeReachedError(SluiceError):
    """The classic group has as many members as it may have."""

    code = E.GROUP_MAX_SIZE_REACHED
    retriable = False


class FencedInstanceIdError(SluiceError):
    """A newer member joined with this static member's group instance id (KIP-345)."""

    code = E.FENCED_INSTANCE_ID
    retriable = False
    category = Category.ABORTABLE


class UnsupportedCompressionTypeError(SluiceError):
    """Unsupported compression."""

    code = E.UNSUPPORTED_COMPRESSION_TYPE
    retriable = False


class InvalidRecordError(SluiceError):
    """The batch's header is invalid."""

    code = E.INVALID_RECORD
    retriable = False
    category = Category.ABORTABLE


class UnstableOffsetCommitError(SluiceError):
    """The group has transactional offsets pending for this partition."""

    code = E.UNSTABLE_OFFSET_COMMIT
    retriable = True


class ThrottlingQuotaExceededError(SluiceError):
    """A quota is spent for now (producer ids per principal ...); the message names its key. Retry later."""

    code = E.THROTTLING_QUOTA_EXCEEDED
    retriable = True


class ProducerFencedError(SluiceError):
    """Another producer with the same transactional.id has taken over (a newer epoch)."""

    code = E.PRODUCER_FENCED
    retriable = False
    category = Category.APPLICATION_RECOVERABLE


class TransactionalIdNotFoundError(SluiceError):
    """No such transactional id."""

    code = E.TRANSACTIONAL_ID_NOT_FOUND
    retriable = False
    category = Category.APPLICATION_RECOVERABLE


class FencedMemberEpochError(SluiceError):
    """The group member's epoch is stale: rejoin."""

    code = E.FENCED_MEMBER_EPOCH
    retriable = False
    category = Category.ABORTABLE


class UnreleasedInstanceIdError(SluiceError):
    """The instance id is still in use."""

    code = E.UNRELEASED_INSTANCE_ID
    retriable = False


del E

# Every class of the table; the code -> class map is built from it, so a code has exactly one class.
ERRORS: tuple[type[SluiceError], ...] = (
    UnknownServerError,
    OffsetOutOfRangeError,
    CorruptMessageError,
    UnknownTopicOrPartitionError,
    InvalidFetchSizeError,
    LeaderNotAvailableError,
    NotLeaderOrFollowerError,
    RequestTimedOutError,
    MessageTooLargeError,
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    NotCoordinatorError,
    InvalidTopicError,
    RecordListTooLargeError,
    NotEnoughReplicasError,
    NotEnoughReplicasAfterAppendError,
    InvalidRequiredAcksError,
    IllegalGenerationError,
    InconsistentGroupProtocolError,
    InvalidGroupIdError,
    UnknownMemberIdError,
    InvalidSessionTimeoutError,
    RebalanceInProgressError,
    TopicAuthorizationFailedError,
    GroupAuthorizationFailedError,
    ClusterAuthorizationFailedError,
    InvalidTimestampError,
    TopicAlreadyExistsError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidConfigError,
    InvalidRequestError,
    PolicyViolationError,
    OutOfOrderSequenceError,
    DuplicateSequenceNumberError,
    InvalidProducerEpochError,
    InvalidTxnStateError,
    InvalidProducerIdMappingError,
    InvalidTransactionTimeoutError,
    ConcurrentTransactionsError,
    TransactionCoordinatorFencedError,
    TransactionalIdAuthorizationFailedError,
    SecurityDisabledError,
    SaslAuthenticationFailedError,
    OperationNotAttemptedError,
    KafkaStorageError,
    UnknownProducerIdError,
    NonEmptyGroupError,
    GroupIdNotFoundError,
    FencedLeaderEpochError,
    UnknownLeaderEpochError,
    OffsetNotAvailableError,
    MemberIdRequiredError,
    GroupMaxSizeReachedError,
    FencedInstanceIdError,
    UnsupportedCompressionTypeError,
    InvalidRecordError,
    UnstableOffsetCommitError,
    ThrottlingQuotaExceededError,
    ProducerFencedError,
    TransactionalIdNotFoundError,
    FencedMemberEpochError,
    UnreleasedInstanceIdError,
    InvalidReplicaAssignmentError,
    NoReassignmentInProgressError,
)
_BY_CODE: dict[int, type[SluiceError]] = {cls.code: cls for cls in ERRORS}


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
