"""TopicView over random histories: every reader ends with the same topics, whenever it read.

A history is a random sequence of what happens to topics in a cluster (created, deleted and
created again under a new id, a config change, partitions added, records from writers that are
current and from one whose view lags, the controller's fold) on the SQLite store. Three observers
catch up at random moments in between, each read a collapsed one (``changes_since``: every
document once, at its last write), as brokers and the controller read. At the end every observer,
one that starts then, and ``TopicView.load`` (for every topic, and for each one alone) must hold
the same topics, epochs included, and nothing may be left waiting for a declaration. This is how
a review found that a view dropped records seen before their topic's declaration, and states of
partitions added after the view last read.

``hidden_states``: the observers' reads leave ``topic_states/`` out, as the Kubernetes store's
watch does, so a fold they did not follow is a gap they fill with a LIST.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import uuid
from pathlib import Path

import pytest

from sluice.metadata import documents, keys
from sluice.metadata.documents import FoldDocument, PartitionState, TopicDocument, TopicStateDocument
from sluice.metadata.factory import open_store
from sluice.metadata.store import MetadataStore, VersionConflict
from sluice.metadata.topic_view import (
    TopicView,
    append_changes,
    changed_partitions,
    delete_topic_state,
    is_topic_key,
    record_seq,
)

HISTORIES = 120  # per mode: about 2 s each
NAMES = ("a", "b")

Snapshot = dict[str, tuple[str, tuple[tuple[int, int, tuple[int, ...], int], ...], tuple[tuple[str, str], ...]]]


def _snapshot(view: TopicView) -> Snapshot:
    return {
        name: (
            t.topic_id,
            tuple((p.leader, p.leader_epoch, tuple(p.isr), p.partition_epoch) for p in t.partitions),
            tuple(sorted(t.config.items())),
        )
        for name, t in view.topics().items()
    }


class _Observer:
    """A reader that catches up with collapsed reads, as ClusterView.refresh and WatchedTopics do."""

    def __init__(self, store: MetadataStore, hidden_states: bool) -> None:
        self.store, self.hidden_states = store, hidden_states
        self.view, self.revision = TopicView(), 0

    def catch_up(self) -> None:
        for doc in self.store.changes_since(self.revision):
            self.revision = max(self.revision, doc.revision)
            if is_topic_key(doc.key) and not (self.hidden_states and doc.key.startswith(keys.TOPIC_STATES)):
                self.view.apply(doc)
        if self.view.gap:
            self.view.load_states(self.store)


def _elect(topic: TopicDocument, index: int, leader: int) -> dict[int, PartitionState]:
    p = topic.partitions[index]
    new = dataclasses.replace(p, leader=leader, leader_epoch=p.leader_epoch + 1, isr=[leader])
    return changed_partitions(topic, topic.with_partition(index, new))


def _fold(store: MetadataStore) -> None:
    """The controller's fold (operator/sluice_operator/controller/loop.py): states, mark, deletions."""
    reader = _Observer(store, hidden_states=False)
    reader.catch_up()
    view = reader.view
    if not view.records:
        return
    last = max(view.records)
    for name in sorted(set().union(*(r.topics for r in view.records.values()))):
        topic = view.topic(name)
        if topic is None:
            continue
        state = TopicStateDocument(name, topic.topic_id, last, list(topic.partitions))

        def newer(current: TopicStateDocument | None, state: TopicStateDocument = state) -> TopicStateDocument | None:
            if current is not None and current.topic_id == state.topic_id and current.seq >= state.seq:
                return None
            return state

        documents.update_document(store, keys.topic_state(name), TopicStateDocument, newer)
    documents.update_document(
        store,
        keys.PARTITION_CHANGES_FOLD,
        FoldDocument,
        lambda current: None if current is not None and current.seq >= last else FoldDocument(last, 1),
    )
    for doc in store.changes_since(0, keys.PARTITION_CHANGES):
        if doc.value is not None and 0 < record_seq(doc.key) <= last:
            with contextlib.suppress(VersionConflict):
                store.delete(doc.key, doc.version)


def _history(store: MetadataStore, seed: int, hidden_states: bool) -> tuple[list[_Observer], list[str]]:
    rnd = random.Random(seed)
    observers = [_Observer(store, hidden_states) for _ in range(3)]
    lagging: _Observer | None = None  # a writer whose view is left behind
    done: list[str] = []
    for step in range(rnd.randint(5, 25)):
        writer = _Observer(store, hidden_states=False)
        writer.catch_up()
        op = rnd.choice(["create", "delete", "config", "add", "record", "record", "record", "fold", "stale"])
        name = rnd.choice(NAMES)
        doc = store.get(keys.topic(name))
        declared = None if doc is None or doc.value is None else TopicDocument.from_json(doc.value)
        if op == "create" and doc is None:
            partitions = [PartitionState.initial([0, 1, 2])] * rnd.randint(1, 3)
            topic = TopicDocument(
                name, uuid.uuid4().hex, replication_factor=3, partitions=partitions, states_in_records=True
            )
            store.compare_and_set(keys.topic(name), topic.to_json(), None)
        elif op == "delete" and doc is not None:
            store.delete(doc.key, doc.version)
            delete_topic_state(store, name)
        elif op == "config" and doc is not None and declared is not None:
            changed = dataclasses.replace(declared, config={"retention.ms": str(step)})
            store.compare_and_set(doc.key, changed.to_json(), doc.version)
        elif op == "add" and doc is not None and declared is not None:
            grown = declared.with_partitions([*declared.partitions, PartitionState.initial([1, 2, 0])])
            store.compare_and_set(doc.key, grown.to_json(), doc.version)
        elif op == "record":
            changes: dict[str, dict[int, PartitionState]] = {}
            for n in rnd.sample(NAMES, rnd.randint(1, 2)):
                held = writer.view.topic(n)
                if held is None:
                    continue
                changes[n] = {}
                for i in rnd.sample(range(len(held.partitions)), rnd.randint(1, len(held.partitions))):
                    changes[n] |= _elect(held, i, rnd.randint(0, 2))
            if not changes:
                continue
            append_changes(store, writer.view, changes, "writer", step)
            lagging = writer
        elif op == "stale" and lagging is not None:
            # the lagging writer appends only if no record came since its read (else it is refused)
            stale = {n: _elect(t, 0, rnd.randint(0, 2)) for n in NAMES if (t := lagging.view.topic(n)) is not None}
            if not stale:
                continue
            with contextlib.suppress(VersionConflict):
                lagging.view.apply(append_changes(store, lagging.view, stale, "lagging", step))
        elif op == "fold":
            _fold(store)
        else:
            continue
        done.append(f"{op}:{name}")
        for observer in observers:
            if rnd.random() < 0.4:
                observer.catch_up()
    for observer in observers:
        observer.catch_up()
    return observers, done


@pytest.mark.parametrize("hidden_states", [False, True], ids=["every-family", "topic-states-unwatched"])
def test_every_reader_ends_with_the_same_topics(tmp_path: Path, hidden_states: bool) -> None:
    diverged = []
    for seed in range(HISTORIES):
        store = open_store(str(tmp_path / f"history-{seed}.sqlite"))
        try:
            observers, done = _history(store, seed, hidden_states)
            late = _Observer(store, hidden_states)
            late.catch_up()
            wanted = _snapshot(TopicView.load(store))
            views = [o.view for o in [*observers, late]]
            wrong: list[int | str] = [i for i, view in enumerate(views) if _snapshot(view) != wanted]
            wrong += [f"load({n})" for n in wanted if _snapshot(TopicView.load(store, n)).get(n) != wanted[n]]
            wrong += [f"{i} left states waiting" for i, view in enumerate(views) if getattr(view, "_pending", None)]
            if wrong:
                diverged.append((seed, wrong, done))
        finally:
            store.close()
    assert not diverged, diverged[:3]
