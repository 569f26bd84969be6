"""The records-format gate: a leader stores Kafka clients' batches as sent (KAFKA_V2) only while every
replica of the partition registered with code that reads that encoding (docs/architecture.md, "Record
formats across versions"). Three ClusterViews on one real metadata store play the brokers; a broker
document without ``records_formats`` is what d37a648 and older write."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from sluice.broker.cluster import ClusterView
from sluice.metadata import documents, keys
from sluice.metadata.documents import RECORDS_FORMAT_NAMES, BrokerDocument, TopicDocument
from sluice.metadata.store import MetadataStore
from tests.support.views import registered_view


def broker(store: MetadataStore, tmp_path: Path, broker_id: int) -> ClusterView:
    return registered_view(store, tmp_path, broker_id)


def register_as_old(store: MetadataStore, broker_id: int) -> None:
    """What a d37a648 broker writes at start: its endpoint, no records_formats."""
    old = {"broker_id": broker_id, "host": "127.0.0.1", "port": 9000 + broker_id, "rack": "", "started_ms": 1}
    documents.update_document(store, keys.broker(broker_id), BrokerDocument, lambda _v: BrokerDocument.from_json(old))


def test_a_broker_advertises_both_formats_and_an_old_document_none(store: MetadataStore, tmp_path: Path) -> None:
    broker(store, tmp_path, 0)
    read = documents.read(store, keys.broker(0), BrokerDocument)
    assert read is not None
    doc = read.value
    assert doc.records_formats == RECORDS_FORMAT_NAMES == ("sluice", "kafka_v2")
    assert BrokerDocument.from_json(doc.to_json()) == doc
    register_as_old(store, 0)
    old = documents.read(store, keys.broker(0), BrokerDocument)
    assert old is not None and old.value.records_formats == () and "records_formats" not in old.value.to_json()


def test_kafka_v2_is_stored_as_sent_only_while_every_replica_reads_it(store: MetadataStore, tmp_path: Path) -> None:
    views = [broker(store, tmp_path, i) for i in range(3)]
    leader = views[0]
    leader.refresh()
    leader.create_topic("t", 2, 2, {})
    leader.refresh()
    assert leader.kafka_v2_writable("t", 0) and leader.kafka_v2_writable("t", 1)
    assert not leader.kafka_v2_writable("t", 2) and not leader.kafka_v2_writable("missing", 0)

    register_as_old(store, 2)  # a rolling upgrade: broker 2 still runs the old code
    leader.refresh()
    for p, state in enumerate(leader.topics["t"].partitions):
        assert leader.kafka_v2_writable("t", p) == (2 not in state.replicas), state.replicas

    views[2].register()  # upgraded: the gate opens again
    leader.refresh()
    assert all(leader.kafka_v2_writable("t", p) for p in range(2))


def test_an_unregistered_replica_or_one_being_added_counts(store: MetadataStore, tmp_path: Path) -> None:
    leader = broker(store, tmp_path, 0)
    broker(store, tmp_path, 1)
    leader.refresh()
    leader.create_topic("t", 1, 2, {})
    leader.refresh()
    assert leader.kafka_v2_writable("t", 0)

    def adding(broker_id: int) -> None:
        def change(doc: TopicDocument | None) -> TopicDocument | None:
            assert doc is not None
            p = doc.partitions[0]
            moved = dataclasses.replace(p, replicas=[*p.replicas, broker_id], adding_replicas=[broker_id])
            return dataclasses.replace(doc, partitions=[moved])

        documents.update_document(store, keys.topic("t"), TopicDocument, change)
        leader.refresh()

    adding(5)  # a reassignment onto a broker that never registered
    assert not leader.kafka_v2_writable("t", 0)
    register_as_old(store, 5)
    leader.refresh()
    assert not leader.kafka_v2_writable("t", 0)
    broker(store, tmp_path, 5)
    leader.refresh()
    assert leader.kafka_v2_writable("t", 0)
