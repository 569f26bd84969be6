"""The producer, one module per part (the split of Kafka's and aiokafka's producers).

* :mod:`.producer`: :class:`Producer`, the public class: ``send()``, the
  transaction calls that talk to the transaction coordinator, ``flush()``,
  ``close()``.
* :mod:`.accumulator`: batches per partition, sequence numbers, what is ready
  to send (no I/O).
* :mod:`.sender`: the background thread that turns ready batches into Produce
  requests and handles their answers.
* :mod:`.transaction_manager`: the transaction state machine, plain state with
  its explicit table of legal transitions and no network code.
* :mod:`.partitioner`: which partition a record goes to (CRC-32 of the key,
  sticky batches without a key).
"""

from sluice.client.producer.producer import PreparedTransaction, Producer, TransactionAbortedError
from sluice.client.producer.sender import ProducerClosedError

__all__ = ["PreparedTransaction", "Producer", "ProducerClosedError", "TransactionAbortedError"]
