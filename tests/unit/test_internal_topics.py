"""The internal topics are created with their configured replication factor, never fewer.

A cluster whose last broker registers late (a slow pod on Kubernetes) must not
end up with coordinator partitions of two replicas for good: as in Kafka, the
internal topics wait for as many live brokers as their replication factor, and
FindCoordinator says why meanwhile. Three ClusterViews on one real metadata
store play the three brokers.
"""

from __future__ import annotations

from pathlib import Path

from sluice.broker.cluster import CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC, ClusterView
from sluice.metadata import documents, keys
from sluice.metadata.documents import ControllerDocument
from sluice.metadata.store import MetadataStore
from tests.support.views import registered_view

RF = {"transaction.state.log.replication.factor": "3", "offsets.topic.replication.factor": "3"}


def broker(store: MetadataStore, tmp_path: Path, broker_id: int) -> ClusterView:
    return registered_view(store, tmp_path, broker_id, RF, refresh=True)


def test_internal_topics_wait_for_as_many_brokers_as_their_replication_factor(
    store: MetadataStore, tmp_path: Path
) -> None:
    first = broker(store, tmp_path, 0)
    broker(store, tmp_path, 1)
    first.refresh()
    waiting = first.ensure_internal_topics()
    assert len(waiting) == 2
    assert store.get(keys.topic(TRANSACTION_STATE_TOPIC)) is None
    assert store.get(keys.topic(CONSUMER_OFFSETS_TOPIC)) is None
    reason = first.internal_topic_missing(TRANSACTION_STATE_TOPIC)
    assert "once 3 broker(s) are alive" in reason and "and 2 are" in reason
    assert "transaction.state.log.replication.factor" in reason

    broker(store, tmp_path, 2)
    first.refresh()
    assert first.ensure_internal_topics() == []
    first.refresh()
    for name in (TRANSACTION_STATE_TOPIC, CONSUMER_OFFSETS_TOPIC):
        topic = first.topics[name]
        assert topic.internal and topic.replication_factor == 3
        assert all(sorted(p.replicas) == [0, 1, 2] for p in topic.partitions)
    assert first.ensure_internal_topics() == []  # once: nothing more to do


def test_a_registered_broker_the_controller_declared_dead_does_not_count(store: MetadataStore, tmp_path: Path) -> None:
    views = [broker(store, tmp_path, b) for b in range(3)]
    documents.update_document(
        store, keys.CONTROLLER, ControllerDocument, lambda _v: ControllerDocument(dead_brokers=[2])
    )
    views[0].refresh()
    assert len(views[0].ensure_internal_topics()) == 2
    assert "and 2 are" in views[0].internal_topic_missing(CONSUMER_OFFSETS_TOPIC)
    assert store.get(keys.topic(CONSUMER_OFFSETS_TOPIC)) is None
