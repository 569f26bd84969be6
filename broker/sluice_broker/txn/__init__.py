"""The transaction coordinator (DESIGN section 4), imported as ``sluice.broker.txn``.

Modules, from the pure core outwards:

``api``          what the coordinator takes and answers (plain values, no protocol's messages)
``state``        the states of a transactional id and the table of legal transitions (no I/O)
``log``          the encoding of state records in ``__transaction_state``, and replay
``markers``      delivering COMMIT/ABORT markers to every partition of a transaction
``channels``     gRPC channels to the other brokers
``coordinator``  :class:`TransactionCoordinator`: the requests, loading, timeouts, expiration
"""

from sluice.broker.txn.coordinator import TransactionCoordinator

__all__ = ["TransactionCoordinator"]
