"""The Sluice Python client: Producer, Consumer and Admin, with Kafka's semantics.

::

    from sluice.client import Producer, Consumer, Admin, TopicPartition
    from sluice import errors

    admin = Admin(bootstrap_servers="127.0.0.1:9092")
    admin.create_topic("orders", partitions=3, replication_factor=1)

    producer = Producer(bootstrap_servers="127.0.0.1:9092", transactional_id="tx-1")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("orders", value=b"v", key=b"k")
    producer.commit_transaction()

    consumer = Consumer(bootstrap_servers="127.0.0.1:9092", group_id="g")  # read_committed
    consumer.subscribe(["orders"])
    for record in consumer.poll(timeout=1.0):
        ...

Package map (each module's docstring explains its design):

* ``producer/``: the Producer; ``accumulator`` (batches per partition),
  ``sender`` (the background sender thread), ``transaction_manager`` (the
  transaction state machine, no I/O), ``partitioner`` (crc32 / sticky).
* ``consumer/``: the Consumer; ``fetcher`` (Fetch and ListOffsets, the record
  buffer), ``subscription_state`` (assignment and positions), ``coordinator``
  (group membership heartbeats, committed offsets).
* ``admin``: the Admin client.
* ``_network/``: what every client shares: typed RPC descriptors (``rpc``),
  channels, metadata cache and coordinator lookup (``cluster``), error mapping,
  deadlines and retries.
* ``types``: TopicPartition, RecordMetadata, ConsumerRecord, GroupMetadata, ...

Errors are the classes of :mod:`sluice.errors`, one per Kafka error code.
"""

from sluice.acls import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)
from sluice.client.admin import (
    Admin,
    BrokerDescription,
    ClusterDescription,
    ConsumerGroupDescription,
    ConsumerGroupListing,
    ListedTransaction,
    LogDirDescription,
    MemberDescription,
    PartitionDescription,
    ProducerState,
    TopicDescription,
    TransactionDescription,
)
from sluice.client.consumer import Consumer
from sluice.client.producer import Producer
from sluice.client.producer.partitioner import partition_for_key
from sluice.client.producer.sender import ProducerClosedError, TransactionAbortedError
from sluice.client.producer.transaction_manager import TransactionState
from sluice.client.quotas import ClientQuotaAlteration, ClientQuotaEntity, ClientQuotaFilter, ClientQuotaFilterComponent
from sluice.client.types import (
    ConsumerRecord,
    DeliveryCallback,
    FutureRecordMetadata,
    GroupMetadata,
    OffsetAndTimestamp,
    PreparedTransaction,
    RecordMetadata,
    SentRecords,
    TopicPartition,
)

__all__ = [
    "AclBinding",
    "AclBindingFilter",
    "AclOperation",
    "AclPermissionType",
    "Admin",
    "BrokerDescription",
    "ClientQuotaAlteration",
    "ClientQuotaEntity",
    "ClientQuotaFilter",
    "ClientQuotaFilterComponent",
    "ClusterDescription",
    "Consumer",
    "ConsumerGroupDescription",
    "ConsumerGroupListing",
    "ConsumerRecord",
    "DeliveryCallback",
    "FutureRecordMetadata",
    "GroupMetadata",
    "ListedTransaction",
    "LogDirDescription",
    "MemberDescription",
    "OffsetAndTimestamp",
    "PartitionDescription",
    "PreparedTransaction",
    "Producer",
    "ProducerClosedError",
    "ProducerState",
    "RecordMetadata",
    "ResourcePatternType",
    "ResourceType",
    "SentRecords",
    "TopicDescription",
    "TopicPartition",
    "TransactionAbortedError",
    "TransactionDescription",
    "TransactionState",
    "partition_for_key",
]
