"""TopicView: topics composed from declarations, folded states and partition change records (SQLite store).

What matters: every view that has seen the same documents holds the same topics, whatever the
order it saw them in (a watch, a LIST at start, a LIST after a gap); a writer that missed a record
cannot append; a re-created record number below the fold never applies; a deleted and re-created
topic takes nothing of its predecessor's records.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from sluice.metadata import keys
from sluice.metadata.documents import FoldDocument, PartitionState, TopicDocument, TopicStateDocument
from sluice.metadata.store import MetadataStore, VersionConflict
from sluice.metadata.topic_view import TopicView, append_changes, changed_partitions


def _declare(store: MetadataStore, name: str = "orders", topic_id: str = "id-1", partitions: int = 3) -> TopicDocument:
    doc = TopicDocument(
        name, topic_id, replication_factor=3, partitions=[PartitionState.initial([0, 1, 2])] * partitions
    )
    store.compare_and_set(keys.topic(name), doc.to_json(), None)
    return doc


def _watching(store: MetadataStore) -> tuple[TopicView, list[int]]:
    view = TopicView()
    revision = [0]
    for doc in store.changes_since(0):
        view.apply(doc)
        revision[0] = doc.revision
    return view, revision


def _catch_up(store: MetadataStore, view: TopicView, revision: list[int]) -> set[str]:
    changed: set[str] = set()
    for doc in store.changes_since(revision[0]):
        changed |= view.apply(doc)
        revision[0] = doc.revision
    return changed


def _elect(topic: TopicDocument, index: int, leader: int) -> dict[int, PartitionState]:
    """Partition ``index`` led by ``leader`` at the next epoch, the others out of its ISR."""
    p = topic.partitions[index]
    new = dataclasses.replace(p, leader=leader, leader_epoch=p.leader_epoch + 1, isr=[leader])
    return changed_partitions(topic, topic.with_partition(index, new))


def test_records_compose_over_the_declaration_and_a_writer_behind_cannot_append(store: MetadataStore) -> None:
    _declare(store)
    a, rev_a = _watching(store)
    b, rev_b = _watching(store)
    first = append_changes(store, a, {"orders": _elect(a.topic("orders"), 0, 1)}, "controller", 1)  # type: ignore[arg-type]
    assert a.apply(first) == {"orders"}
    assert a.topic("orders").partitions[0].leader == 1  # type: ignore[union-attr]
    # b has not seen record 1: its append at number 1 is refused, so it cannot decide from a stale view
    with pytest.raises(VersionConflict):
        append_changes(store, b, {"orders": _elect(b.topic("orders"), 1, 2)}, "other", 2)  # type: ignore[arg-type]
    assert _catch_up(store, b, rev_b) == {"orders"}
    second = append_changes(store, b, {"orders": _elect(b.topic("orders"), 1, 2)}, "other", 2)  # type: ignore[arg-type]
    b.apply(second)
    _catch_up(store, a, rev_a)
    assert a.topic("orders") == b.topic("orders") == TopicView.load(store).topic("orders")
    assert [p.leader for p in a.topic("orders").partitions] == [1, 2, 0]  # type: ignore[union-attr]
    assert [p.partition_epoch for p in a.topic("orders").partitions] == [1, 1, 0]  # type: ignore[union-attr]
    # the declaration itself was never rewritten
    declared = store.get(keys.topic("orders"))
    assert declared is not None and declared.version == 1


def test_every_order_of_the_same_documents_composes_the_same_topics(store: MetadataStore) -> None:
    declared = _declare(store)
    view, revision = _watching(store)
    for leader in (1, 2, 0, 1):  # four records on partition 0, one of them with partition 2 too
        topic = view.topic("orders")
        assert topic is not None
        changes = _elect(topic, 0, leader)
        if leader == 0:
            changes |= _elect(topic, 2, 1)
        view.apply(append_changes(store, view, {"orders": changes}, "controller", 1))
    # a config change rewrites the declaration with the states its writer read (stale ones, here)
    bumped = dataclasses.replace(declared, config={"retention.ms": "1000"})
    store.compare_and_set(keys.topic("orders"), bumped.to_json(), 1)
    _catch_up(store, view, revision)
    expected = view.topic("orders")
    assert expected is not None and expected.config == {"retention.ms": "1000"}
    docs = [d for d in store.changes_since(0) if d.value is not None]
    declarations = [d for d in docs if d.key.startswith(keys.TOPICS)]
    records = [d for d in docs if not d.key.startswith(keys.TOPICS)]
    # the declaration first (as any watch or load has it), then the records in any order
    for order in itertools.permutations(records):
        other = TopicView()
        other.apply_all([declarations[-1], *order])
        assert other.topic("orders") == expected
        assert [p.partition_epoch for p in other.topic("orders").partitions] == [  # type: ignore[union-attr]
            p.partition_epoch for p in expected.partitions
        ]


def test_a_fold_changes_nothing_and_a_view_past_a_gap_reads_the_folded_states(store: MetadataStore) -> None:
    _declare(store)
    writer, _ = _watching(store)
    late, late_revision = _watching(store)
    for leader in (1, 2):
        writer.apply(
            append_changes(store, writer, {"orders": _elect(writer.topic("orders"), 0, leader)}, "controller", 1)  # type: ignore[arg-type]
        )
    before = writer.topic("orders")
    assert before is not None
    # the controller's fold: the states up to record 2, then the fold mark, then the records go
    state = TopicStateDocument("orders", "id-1", writer.head, list(before.partitions))
    store.compare_and_set(keys.topic_state("orders"), state.to_json(), None)
    store.compare_and_set(keys.PARTITION_CHANGES_FOLD, FoldDocument(writer.head, 1).to_json(), None)
    for seq in (1, 2):
        doc = store.get(keys.partition_changes(seq))
        assert doc is not None
        store.delete(doc.key, doc.version)
    # a view that watched it all holds the same topics (deleting folded records changes nothing)
    _catch_up(store, writer, [0])
    assert writer.topic("orders") == before and writer.records == {}
    # one whose watch missed the records (a re-list: only what is left, and no topic_states, as the
    # Kubernetes store's watch leaves them out) sees the fold pass its head: a gap
    for doc in store.changes_since(late_revision[0]):
        if not doc.key.startswith(keys.TOPIC_STATES) and doc.value is not None:
            late.apply(doc)
    assert late.gap and late.topic("orders") != before
    assert late.load_states(store) == {"orders"}
    assert not late.gap and late.topic("orders") == before
    assert TopicView.load(store).topic("orders") == before


def test_a_record_number_recreated_below_the_fold_never_applies(store: MetadataStore) -> None:
    _declare(store)
    view, revision = _watching(store)
    stale = TopicView()
    stale.apply_all(store.list(keys.TOPICS))  # a writer that saw nothing after the declaration
    view.apply(append_changes(store, view, {"orders": _elect(view.topic("orders"), 0, 1)}, "controller", 1))  # type: ignore[arg-type]
    store.compare_and_set(keys.PARTITION_CHANGES_FOLD, FoldDocument(1, 1).to_json(), None)
    state = TopicStateDocument("orders", "id-1", 1, list(view.topic("orders").partitions))  # type: ignore[union-attr]
    store.compare_and_set(keys.topic_state("orders"), state.to_json(), None)
    record = store.get(keys.partition_changes(1))
    assert record is not None
    store.delete(record.key, record.version)
    expected = view.topic("orders")
    # number 1 is free again: the stale writer's create succeeds, and nobody applies it
    append_changes(store, stale, {"orders": _elect(stale.topic("orders"), 0, 2)}, "zombie", 2)  # type: ignore[arg-type]
    _catch_up(store, view, revision)
    assert view.topic("orders") == expected
    assert TopicView.load(store).topic("orders") == expected


def test_a_recreated_topic_takes_none_of_its_predecessors_records(store: MetadataStore) -> None:
    _declare(store)
    view, revision = _watching(store)
    view.apply(append_changes(store, view, {"orders": _elect(view.topic("orders"), 0, 1)}, "controller", 1))  # type: ignore[arg-type]
    old = store.get(keys.topic("orders"))
    assert old is not None
    store.delete(old.key, old.version)
    fresh = TopicDocument("orders", "id-2", replication_factor=3, partitions=[PartitionState.initial([2, 0, 1])] * 3)
    store.compare_and_set(keys.topic("orders"), fresh.to_json(), None)
    _catch_up(store, view, revision)
    assert view.topic("orders") == fresh
    assert TopicView.load(store).topic("orders") == fresh


def test_before_any_record_the_declaration_is_the_state_even_without_partition_epochs(store: MetadataStore) -> None:
    """A broker of code from before the partition epoch changed ISRs without counting it."""
    declared = _declare(store)
    view, revision = _watching(store)
    p = declared.partitions[0]
    old_style = dataclasses.replace(declared, partitions=[dataclasses.replace(p, isr=[0, 1]), *declared.partitions[1:]])
    store.compare_and_set(keys.topic("orders"), old_style.to_json(), 1)
    assert _catch_up(store, view, revision) == {"orders"}
    assert view.topic("orders").partitions[0].isr == [0, 1]  # type: ignore[union-attr]
