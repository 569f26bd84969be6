"""Partition logs and the storage under them.

``storage``         the one narrow key-value interface between the broker and its disk, and its
                    RocksDB engine: everything below it can change without the rest noticing
``partition``       one partition's log: offsets, high watermark, LSO, idempotence, aborted index
``producer_state``  the idempotent producer's checks, pure logic (no I/O)
``record_check``    the records of every produced batch in Kafka's v2 format, checked as Kafka's
                    LogValidator checks them, whichever protocol brought the batch
``fetch_response``  Fetch and ReplicaFetch answers written from the stored batch bytes
"""
