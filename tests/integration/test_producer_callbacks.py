"""send(callback=...), Kafka's send(record, callback), against a real broker: each record's callback
runs once with its stored offset, in send order for a partition; a record send() refuses at once
gets its error through the callback before send() returns."""

from __future__ import annotations

import threading
from pathlib import Path

from sluice import errors
from sluice.client import Admin, Producer, RecordMetadata
from sluice.testing import LocalCluster

from .helpers import read_topic


def test_delivery_callbacks_give_each_records_offset_in_order_and_refusals_at_once(tmp_path: Path) -> None:
    with LocalCluster(brokers=1, data_dir=tmp_path) as cluster:
        with Admin(bootstrap_servers=cluster.bootstrap_servers) as admin:
            admin.create_topic("cb", partitions=2, replication_factor=1)
        seen: list[tuple[int, int, BaseException | None]] = []
        lock = threading.Lock()

        def delivered(md: RecordMetadata, exc: BaseException | None) -> None:
            with lock:
                seen.append((md.partition, md.offset, exc))

        with Producer(bootstrap_servers=cluster.bootstrap_servers, batch_size=4096, max_request_size=65_536) as p:
            futures = [p.send("cb", value=b"v%d" % i, partition=i % 2, callback=delivered) for i in range(2000)]
            p.flush(60)
            assert len(seen) == 2000 and all(exc is None for _p, _o, exc in seen)
            # the same offsets as the futures, and in send order within each partition
            assert sorted((p_, o) for p_, o, _e in seen) == sorted(
                (f.result(0).partition, f.result(0).offset) for f in futures
            )
            for part in (0, 1):
                offsets = [o for p_, o, _e in seen if p_ == part]
                assert offsets == sorted(offsets) and len(offsets) == 1000

            # refused at once: the callback has run, on this thread, when send() returns
            refused: list[tuple[str, int, BaseException | None, str]] = []

            def on_refusal(md: RecordMetadata, exc: BaseException | None) -> None:
                refused.append((md.topic, md.offset, exc, threading.current_thread().name))

            f = p.send("cb", value=b"x" * 70_000, callback=on_refusal)
            assert len(refused) == 1 and isinstance(refused[0][2], errors.MessageTooLargeError)
            assert refused[0][:2] == ("cb", -1) and refused[0][3] == threading.current_thread().name
            assert isinstance(f.exception(0), errors.MessageTooLargeError)
            p.send("cb", value=b"y", partition=7, callback=on_refusal)
            assert len(refused) == 2 and isinstance(refused[1][2], errors.UnknownTopicOrPartitionError)
        assert len(read_topic(cluster.bootstrap_servers, "cb")) == 2000
