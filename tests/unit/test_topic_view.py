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
from sluice.metadata.documents import (
    FoldDocument,
    PartitionChangesDocument,
    PartitionState,
    TopicChanges,
    TopicDocument,
    TopicStateDocument,
)
from sluice.metadata.store import Document, MetadataStore, VersionConflict
from sluice.metadata.topic_view import TopicView, WatchedTopics, append_changes, changed_partitions


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
    # in any order, the declaration included: a collapsed read (a LIST, the watch cache from
    # revision 0) has the declaration, rewritten last, after the records
    assert docs[-1].key == keys.topic("orders")
    for order in itertools.permutations(docs):
        other = TopicView()
        other.apply_all(order)
        assert other.topic("orders") == expected
        assert [p.partition_epoch for p in other.topic("orders").partitions] == [  # type: ignore[union-attr]
            p.partition_epoch for p in expected.partitions
        ]
    # a view that starts now (a controller taking over, a broker restarted) reads them in that order
    late, _ = _watching(store)
    assert late.topic("orders") == expected


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
    # number 1 is free again: the stale writer's create lands, finds the fold past it, and is undone
    with pytest.raises(VersionConflict, match="below the fold"):
        append_changes(store, stale, {"orders": _elect(stale.topic("orders"), 0, 2)}, "zombie", 2)  # type: ignore[arg-type]
    assert store.get(keys.partition_changes(1)) is None
    # and had it stayed (its writer killed in between), nobody would apply it
    store.compare_and_set(keys.partition_changes(1), record.value, None)  # type: ignore[arg-type]
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


def test_a_record_and_a_folded_state_of_one_epoch_compose_the_same_in_either_order(store: MetadataStore) -> None:
    """A folded state is numbered by the last record it folds: of one epoch, the higher number wins."""
    declared = _declare(store)
    p = declared.partitions[0]
    folded = dataclasses.replace(p, leader=1, leader_epoch=1, isr=[1], partition_epoch=1)
    recorded = dataclasses.replace(p, leader=2, leader_epoch=1, isr=[2], partition_epoch=1)  # decided from a stale view
    state = TopicStateDocument("orders", "id-1", 5, [folded, *declared.partitions[1:]])
    record = PartitionChangesDocument(6, [TopicChanges("orders", "id-1", {0: recorded})])
    decl = store.get(keys.topic("orders"))
    docs = [
        Document(keys.topic_state("orders"), state.to_json(), 1, 10),
        Document(keys.partition_changes(6), record.to_json(), 1, 11),
    ]
    for order in (docs, list(reversed(docs))):
        view = TopicView()
        view.apply_all([decl, *order])  # type: ignore[list-item]
        assert view.topic("orders").partitions[0] == recorded  # type: ignore[union-attr]


def test_a_skipped_number_is_a_gap_and_the_folded_states_fill_it(store: MetadataStore) -> None:
    _declare(store)
    writer, _ = _watching(store)
    watcher = TopicView()
    watcher.apply_all(store.list(keys.TOPICS))
    first = append_changes(store, writer, {"orders": _elect(writer.topic("orders"), 0, 1)}, "controller", 1)  # type: ignore[arg-type]
    writer.apply(first)
    watcher.apply(first)
    for leader in (2, 0):
        writer.apply(append_changes(store, writer, {"orders": _elect(writer.topic("orders"), 1, leader)}, "c", 1))  # type: ignore[arg-type]
    state = TopicStateDocument("orders", "id-1", 3, list(writer.topic("orders").partitions))  # type: ignore[union-attr]
    store.compare_and_set(keys.topic_state("orders"), state.to_json(), None)
    for seq in (2, 3):  # folded and gone before the watcher's watch (re-listed) saw them; the fold mark not yet seen
        doc = store.get(keys.partition_changes(seq))
        store.delete(doc.key, doc.version)  # type: ignore[union-attr]
    writer.apply(
        fourth := append_changes(store, writer, {"orders": _elect(writer.topic("orders"), 2, 1)}, "c", 1)  # type: ignore[arg-type]
    )
    watcher.apply(fourth)
    assert watcher.gap
    watcher.load_states(store)
    assert watcher.topic("orders") == writer.topic("orders")


def test_catching_up_misses_no_declaration_written_between_two_reads(store: MetadataStore) -> None:
    """One read of the store's changes per catch-up: a declaration and a record written while a
    catch-up runs are both seen by the next (per-family reads skipped the declaration for good)."""
    _declare(store)

    class Interleaving:
        def __init__(self) -> None:
            self.calls = 0

        def changes_since(self, revision: int, prefix: str = "") -> list[Document]:
            found = store.changes_since(revision, prefix)
            self.calls += 1
            if self.calls == 1:  # right after the first read: another topic, then a record of the first
                _declare(store, "payments", "id-2")
                view = TopicView.load(store)
                view.apply(append_changes(store, view, {"orders": _elect(view.topic("orders"), 0, 1)}, "c", 1))  # type: ignore[arg-type]
            return found

        def __getattr__(self, name: str) -> object:
            return getattr(store, name)

    watched = WatchedTopics(Interleaving())  # type: ignore[arg-type]
    watched.catch_up()
    watched.catch_up()
    assert sorted(watched.view.topics()) == ["orders", "payments"]
    assert watched.view.topics() == TopicView.load(store).topics()


def test_a_malformed_record_still_counts_as_seen(store: MetadataStore) -> None:
    """A writer must append past it, or it would conflict on that number for ever."""
    _declare(store)
    store.compare_and_set(keys.partition_changes(1), {"seq": 1, "topics": "not a list"}, None)
    watched = WatchedTopics(store)
    watched.catch_up()
    assert watched.view.head == 1
    appended = append_changes(
        store,
        watched.view,
        {"orders": _elect(watched.view.topic("orders"), 0, 1)},
        "controller",
        1,  # type: ignore[arg-type]
    )
    assert appended.key == keys.partition_changes(2)


def test_a_record_of_partitions_added_since_the_last_read_waits_for_their_declaration(store: MetadataStore) -> None:
    """Partitions added, a record for one of them, then a config change, between two reads of a long
    running view: the read has the record before the declaration that has that partition."""
    declared = _declare(store)
    view, revision = _watching(store)
    grown = declared.with_partitions([*declared.partitions, PartitionState.initial([1, 2, 0])])
    store.compare_and_set(keys.topic("orders"), grown.to_json(), 1)
    writer = TopicView.load(store)
    writer.apply(append_changes(store, writer, {"orders": _elect(writer.topic("orders"), 3, 2)}, "controller", 1))  # type: ignore[arg-type]
    store.compare_and_set(keys.topic("orders"), dataclasses.replace(grown, config={"retention.ms": "1"}).to_json(), 2)
    assert [d.key for d in store.changes_since(revision[0])] == [keys.partition_changes(1), keys.topic("orders")]
    _catch_up(store, view, revision)
    expected = TopicView.load(store).topic("orders")
    assert expected is not None and expected.partitions[3].leader == 2 and expected.partitions[3].isr == [2]
    assert view.topic("orders") == expected
    assert not view._pending


def test_what_waits_for_a_declaration_is_bounded(store: MetadataStore) -> None:
    """The records of a deleted topic, read again and again (a broker's fresh reads), wait once, and go
    with the records; a folded state read ahead of its declaration (a LIST after a gap) waits for it."""
    _declare(store)
    _declare(store, "gone", "id-gone")
    writer = TopicView.load(store)
    changes = _elect(writer.topic("gone"), 0, 1)  # type: ignore[arg-type]
    writer.apply(append_changes(store, writer, {"gone": changes}, "controller", 1))
    doc = store.get(keys.topic("gone"))
    assert doc is not None
    store.delete(doc.key, doc.version)
    view = TopicView()
    view.apply_all(store.list(keys.TOPICS))
    for _ in range(3):
        view.apply_all(store.list(keys.PARTITION_CHANGES))
    assert view._pending == {"gone": {("id-gone", 1, False): changes}}
    record = store.get(keys.partition_changes(1))
    assert record is not None
    store.delete(record.key, record.version)  # the fold's deletion
    view.apply(store.changes_since(record.revision)[-1])
    assert not view._pending
    # a folded state of a topic whose declaration this view has not read yet stays until it comes,
    # through the deletion of the record it was folded from
    late = _declare(store, "late", "id-late")
    state = TopicStateDocument(
        "late", "id-late", 7, [dataclasses.replace(late.partitions[0], leader=2, partition_epoch=3)] * 3
    )
    view.apply(Document(keys.topic_state("late"), state.to_json(), 1, 100))
    view.apply(Document(keys.partition_changes(7), None, 2, 101))
    view.apply(store.get(keys.topic("late")))  # type: ignore[arg-type]
    assert [p.leader for p in view.topic("late").partitions] == [2, 2, 2]  # type: ignore[union-attr]
    assert not view._pending
