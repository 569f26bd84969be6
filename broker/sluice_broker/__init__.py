"""The Sluice broker process (imported as ``sluice.broker``).

Layers, top to bottom (imports point down only):

``main``            process entry: arguments, signals, the asyncio loop
``server``          gRPC servicers: thin, validate and hand over to the core
``txn/``, ``group/`` transaction and group coordinators
``replica_manager`` the partitions this broker holds, produce/fetch/markers
``partition``       one partition's log: offsets, HW, LSO, idempotence, aborted index
``producer_state``  pure logic of the idempotence checks (no I/O)
``storage``         the narrow key-value interface over RocksDB
``config``          Kafka-named settings with Kafka's defaults
"""
