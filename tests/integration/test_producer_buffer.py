"""The producer's buffer_memory against a real broker: send() waits for room, and a broker that
answers nothing makes it fail with BufferExhaustedError (retriable) without losing what was queued.

A broker stopped with SIGSTOP keeps its connections open and answers nothing: acknowledgements
stop, so the buffer fills. Every loop is bounded in count and time.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice import errors
from sluice.client import Admin, Producer
from sluice.client.types import FutureRecordMetadata
from sluice.testing import LocalCluster

from .helpers import read_topic

MIB = 1_048_576
RECORD = b"r" * 1000


def test_a_full_buffer_blocks_send_then_fails_it_and_loses_nothing_queued(tmp_path: Path) -> None:
    with LocalCluster(brokers=1, data_dir=tmp_path) as cluster:
        with Admin(bootstrap_servers=cluster.bootstrap_servers) as admin:
            admin.create_topic("buf", partitions=2, replication_factor=1)
        producer = Producer(
            bootstrap_servers=cluster.bootstrap_servers,
            buffer_memory=MIB,
            batch_size=65_536,
            max_block_ms=1500,
            request_timeout_ms=60_000,
        )
        try:
            # Unpaused, 8 MiB go through a 1 MiB buffer: send() waits for acknowledgements instead of
            # holding everything, and the buffer never counts more than its bound.
            first, peak = [], 0
            for _ in range(8000):
                first.append(producer.send("buf", value=RECORD))
                peak = max(peak, producer._accumulator._buffered)
            assert 0 < peak <= MIB
            producer.flush(60)
            assert all(f.result(0).offset >= 0 for f in first)

            cluster.pause(0)
            try:
                queued: list[FutureRecordMetadata] = []
                refused: FutureRecordMetadata | None = None
                for _ in range(5000):  # 1 MiB holds about 16 batches of 64 records: far fewer than this
                    f = producer.send("buf", value=RECORD)
                    if f.done() and f.exception(0) is not None:
                        refused = f
                        break
                    queued.append(f)
                assert refused is not None, "the buffer never filled"
                exc = refused.exception(0)
                assert isinstance(exc, errors.BufferExhaustedError) and exc.retriable
                assert "max_block_ms (1500 ms)" in str(exc)
                assert 0 < len(queued) <= MIB // len(RECORD)
            finally:
                cluster.resume(0)
            producer.flush(60)
            offsets = {(f.result(0).partition, f.result(0).offset) for f in queued}
            assert len(offsets) == len(queued)
        finally:
            producer.close()
        stored = read_topic(cluster.bootstrap_servers, "buf")
        assert len(stored) == len(first) + len(queued)  # every queued record once, the refused one not at all
        assert {(p, o) for p, o, _k, _v in stored} >= offsets


def test_a_record_refused_for_buffer_space_breaks_its_transaction_and_the_next_one_commits(tmp_path: Path) -> None:
    with LocalCluster(brokers=1, data_dir=tmp_path) as cluster:
        with Admin(bootstrap_servers=cluster.bootstrap_servers) as admin:
            admin.create_topic("txbuf", partitions=1, replication_factor=1)
        producer = Producer(
            bootstrap_servers=cluster.bootstrap_servers,
            transactional_id="txbuf",
            buffer_memory=MIB,
            batch_size=65_536,
            max_block_ms=1500,
        )
        try:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send("txbuf", value=b"first").result(30)  # the partition is in the transaction
            cluster.pause(0)
            try:
                refused = None
                for _ in range(5000):  # bounded: 1 MiB holds about 16 batches of 64 records
                    f = producer.send("txbuf", value=RECORD)
                    if f.done() and f.exception(0) is not None:
                        refused = f
                        break
                assert refused is not None and isinstance(refused.exception(0), errors.BufferExhaustedError)
            finally:
                cluster.resume(0)
            # A commit never succeeds without one of its records: it raises the error that broke it.
            with pytest.raises(errors.BufferExhaustedError):
                producer.commit_transaction()
            producer.abort_transaction()
            producer.begin_transaction()
            producer.send("txbuf", value=b"second")
            producer.commit_transaction()
        finally:
            producer.close()
        assert [v for _p, _o, _k, v in read_topic(cluster.bootstrap_servers, "txbuf")] == [b"second"]
