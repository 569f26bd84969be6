"""The Sluice broker process (imported as ``sluice.broker``).

Layers, top to bottom (imports point down only):

``main``              process entry: arguments, signals, the asyncio loop
``server``            the gRPC surface: registers the services of ``servicers/``
``servicers/``        thin gRPC servicers, one module per service (``broker``, ``interbroker``),
                      on shared ``registration`` plumbing: validate and hand over to the core
``txn/``, ``group/``  the transaction and the group coordinator: shards on the runtime below
``coordination/``     ONE coordinator runtime: loads, retries and unloads the internal-topic
                      partitions this broker leads (``__transaction_state``, ``__consumer_offsets``)
``replica_manager``   the partitions this broker holds: produce, fetch, markers, the leader side
                      of replication
``replication/``      follower fetchers, leader epochs, divergence and truncation
``log/``              one partition's log (``partition``: offsets, HW, LSO, idempotence, aborted
                      index), ``producer_state`` (pure idempotence checks), ``storage`` (the narrow
                      key-value interface over RocksDB), ``fetch_response``
``cluster``           the broker's view of cluster metadata, topic admin, producer-id blocks
``channels``          one reused gRPC channel per other broker
``config``            Kafka-named settings with Kafka's defaults
``errors``            refusals are :mod:`sluice.errors` classes (one per Kafka code); ``answer``
                      puts one into a response
"""
