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


def small_buffer_producer(cluster: LocalCluster, **kwargs: object) -> Producer:
    """A producer whose 1 MiB buffer holds about 16 batches of 64 records, waiting 1.5 s for room."""
    return Producer(
        bootstrap_servers=cluster.bootstrap_servers, buffer_memory=MIB, batch_size=65_536, max_block_ms=1500, **kwargs
    )


def send_until_refused(producer: Producer, topic: str) -> tuple[list[FutureRecordMetadata], BaseException]:
    """Send 1 KB records to a paused broker until one is refused: the queued ones and the refusal."""
    queued: list[FutureRecordMetadata] = []
    for _ in range(5000):  # 1 MiB holds about a thousand: far fewer than this
        f = producer.send(topic, value=RECORD)
        if f.done() and f.exception(0) is not None:
            exc = f.exception(0)
            assert exc is not None
            return queued, exc
        queued.append(f)
    raise AssertionError("the buffer never filled")


def test_a_full_buffer_blocks_send_then_fails_it_and_loses_nothing_queued(tmp_path: Path) -> None:
    with LocalCluster(brokers=1, data_dir=tmp_path) as cluster:
        with Admin(bootstrap_servers=cluster.bootstrap_servers) as admin:
            admin.create_topic("buf", partitions=2, replication_factor=1)
        producer = small_buffer_producer(cluster, request_timeout_ms=60_000)
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
                queued, exc = send_until_refused(producer, "buf")
                assert isinstance(exc, errors.BufferExhaustedError) and exc.retriable
                assert "max_block_ms (1500 ms)" in str(exc)
                bulk = producer.send_many("buf", [RECORD] * 10)  # the bulk send is refused the same way
                assert len(bulk) == 10
                with pytest.raises(errors.BufferExhaustedError):
                    bulk.wait(0)
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
        producer = small_buffer_producer(cluster, transactional_id="txbuf")
        try:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send("txbuf", value=b"first").result(30)  # the partition is in the transaction
            cluster.pause(0)
            try:
                _queued, exc = send_until_refused(producer, "txbuf")
                assert isinstance(exc, errors.BufferExhaustedError)
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
