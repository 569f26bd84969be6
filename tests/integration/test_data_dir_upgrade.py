"""A data directory written by an older commit opens and serves with this code.

tests/data/data-dir-d37a648.tgz was written by tests/data/write_data_dir.py at d37a648, the last
commit before Kafka clients' batches were stored as sent (``records_format``): every batch in it is in
Sluice's record encoding, the Kafka client's too. After the upgrade the same partition gets new
batches in Kafka's encoding, and both kinds of client read both encodings in one partition.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from sluice.api.v1 import records_pb2 as pb
from sluice.client import Admin, TopicPartition
from sluice.testing import LocalCluster

from .helpers import read_topic
from .test_kafka_produce_fetch import kafka_read
from .wire import Wire

kafka = pytest.importorskip("kafka")  # the dev extra installs kafka-python

FIXTURE = Path(__file__).resolve().parent.parent / "data" / "data-dir-d37a648.tgz"
TS = 1_700_000_000_000
OLD = [(0, b"k0", b"grpc-0"), (1, b"k1", b"grpc-1"), (2, b"k2", b"grpc-2")] + [
    (4 + i, f"kk{i}".encode(), f"kafka-{i}".encode()) for i in range(3)
]


def test_an_older_data_directory_serves_both_protocols_and_takes_new_batches(tmp_path: Path) -> None:
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(tmp_path, filter="data")
    with LocalCluster(brokers=1, data_dir=tmp_path, kafka_listener=True) as cluster:
        assert [(o, k, v) for _p, o, k, v in read_topic(cluster.bootstrap_servers, "old")] == OLD
        assert [(o, k, v) for o, k, v, _h, _t in kafka_read(cluster, "old", "read_committed")] == OLD
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        try:
            assert admin.list_consumer_group_offsets("old-group") == {TopicPartition("old", 0): 4}
        finally:
            admin.close()
        producer = kafka.KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap_servers, request_timeout_ms=60000)
        producer.send("old", key=b"new", value=b"after-upgrade", partition=0, timestamp_ms=TS).get(timeout=60)
        producer.close()
        both = [*OLD, (7, b"new", b"after-upgrade")]
        assert [(o, k, v) for _p, o, k, v in read_topic(cluster.bootstrap_servers, "old")] == both
        kafka_rows = kafka_read(cluster, "old", "read_committed")
        assert [(o, k, v) for o, k, v, _h, _t in kafka_rows] == both
        assert [h for _o, _k, _v, h, _t in kafka_rows] == [[("h", b"g")]] * 3 + [[("h", b"k")]] * 3 + [[]]
        wire = Wire(cluster.brokers[0].address)
        try:
            stored = wire.fetch("old", 0, kafka_v2_records=True).batches
        finally:
            wire.close()
        formats = {b.base_offset: b.records_format for b in stored}
        assert formats[0] == formats[4] == pb.RECORDS_FORMAT_SLUICE  # written before, the Kafka client's too
        assert formats[7] == pb.RECORDS_FORMAT_KAFKA_V2  # written after: as sent
