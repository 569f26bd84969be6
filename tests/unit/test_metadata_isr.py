"""A leader's ISR changes to one topic go in one write, and a change decided from an ISR the store no
longer has is refused (issue 28: the conflict storm of a broker's return; a stale ISR written back).
Real SQLite store, its compare-and-sets counted."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from sluice.broker.cluster import ClusterView
from sluice.broker.config import BrokerConfig
from sluice.metadata import documents, keys, open_store
from sluice.metadata.documents import TopicDocument
from sluice.metadata.isr import IsrChange, IsrOutcome, apply_isr_changes
from sluice.metadata.store import MetadataStore
from sluice.operator.controller.decisions import new_topic

from .test_metadata_noop_writes import CountingWrites

BROKERS = [(0, ""), (1, ""), (2, "")]


def _setup(tmp_path: Path, partitions: int = 6) -> tuple[CountingWrites, ClusterView, TopicDocument]:
    path = str(tmp_path / "metadata.sqlite")
    store = CountingWrites(open_store(path))
    doc = new_topic("orders", "id", partitions, 3, {}, BROKERS)
    store.compare_and_set(keys.topic("orders"), doc.to_json(), None)
    view = ClusterView(store, BrokerConfig.build(0, "127.0.0.1", 1, str(tmp_path), path, {}))  # type: ignore[arg-type]
    store.writes = 0
    return store, view, doc


def _stored(store: MetadataStore) -> TopicDocument:
    got = documents.read(store, keys.topic("orders"), TopicDocument)
    assert got is not None
    return got.value


def test_all_of_a_leaders_changes_to_a_topic_are_one_write(tmp_path: Path) -> None:
    store, view, doc = _setup(tmp_path)
    led = [i for i, p in enumerate(doc.partitions) if p.leader == 0]
    assert len(led) >= 2
    changes = []
    for i in led:
        p = doc.partitions[i]
        changes.append(IsrChange(i, p.leader_epoch, tuple(p.isr), tuple(r for r in p.isr if r != 2)))
    written = view.write_isrs("orders", 0, changes)
    assert store.writes == 1
    assert all(written.outcomes[i] is IsrOutcome.WRITTEN for i in led)
    after = _stored(store)
    assert written.document is not None and written.document.value == after.to_json()
    for i, p in enumerate(after.partitions):
        assert sorted(p.isr) == ([0, 1] if i in led else [0, 1, 2])  # only the leader's partitions changed


def test_a_change_decided_from_an_isr_the_store_no_longer_has_is_refused(tmp_path: Path) -> None:
    """The controller took broker 2 out of the ISR; a leader whose view still had it shrinks by 1 and
    must not write 2 back: refused, and it is given the document that refused it."""
    store, view, doc = _setup(tmp_path)
    i = next(i for i, p in enumerate(doc.partitions) if p.leader == 0)
    p = doc.partitions[i]
    fenced = doc.with_partition(i, dataclasses.replace(p, isr=[r for r in p.isr if r != 2]))
    current = documents.read(store, keys.topic("orders"), TopicDocument)
    assert current is not None
    documents.replace(store, keys.topic("orders"), fenced, current.version)  # the controller's write
    store.writes = 0
    stale = IsrChange(i, p.leader_epoch, tuple(p.isr), tuple(r for r in p.isr if r != 1))  # still has 2
    written = view.write_isrs("orders", 0, [stale])
    assert written.outcomes == {i: IsrOutcome.STALE}
    assert store.writes == 0
    assert 2 not in _stored(store).partitions[i].isr
    assert written.document is not None
    assert TopicDocument.from_json(written.document.value or {}).partitions[i].isr == fenced.partitions[i].isr


def test_refused_changes_do_not_hold_back_the_others_in_the_same_write(tmp_path: Path) -> None:
    store, view, doc = _setup(tmp_path)
    led = [i for i, p in enumerate(doc.partitions) if p.leader == 0]
    other = next(i for i, p in enumerate(doc.partitions) if p.leader != 0)
    a, b = led[0], led[1]
    pa, pb = doc.partitions[a], doc.partitions[b]
    changes = [
        IsrChange(a, pa.leader_epoch, tuple(pa.isr), (0, 1)),  # applies
        IsrChange(b, pb.leader_epoch + 1, tuple(pb.isr), (0, 1)),  # an epoch this leader does not hold
        IsrChange(other, doc.partitions[other].leader_epoch, tuple(doc.partitions[other].isr), (0, 1)),  # not led
        IsrChange(99, 0, (0,), (0,)),  # no such partition
    ]
    written = view.write_isrs("orders", 0, changes)
    assert written.outcomes == {
        a: IsrOutcome.WRITTEN,
        b: IsrOutcome.NOT_LEADER,
        other: IsrOutcome.NOT_LEADER,
        99: IsrOutcome.NO_PARTITION,
    }
    assert store.writes == 1
    after = _stored(store)
    assert sorted(after.partitions[a].isr) == [0, 1]
    assert sorted(after.partitions[b].isr) == sorted(pb.isr)


def test_changes_already_in_the_store_write_nothing(tmp_path: Path) -> None:
    store, view, doc = _setup(tmp_path)
    i = next(i for i, p in enumerate(doc.partitions) if p.leader == 0)
    p = doc.partitions[i]
    # an earlier attempt landed (its answer was lost): the same set, in another order
    written = view.write_isrs("orders", 0, [IsrChange(i, p.leader_epoch, (0, 1), tuple(reversed(p.isr)))])
    assert written.outcomes == {i: IsrOutcome.ALREADY} and store.writes == 0
    assert IsrOutcome.applied(written.outcomes[i])
    value, outcomes = apply_isr_changes(doc, 0, [IsrChange(i, p.leader_epoch, tuple(p.isr), tuple(p.isr))])
    assert value is doc and outcomes == {i: IsrOutcome.ALREADY}


def test_an_unknown_topic_refuses_every_change(tmp_path: Path) -> None:
    store, view, _doc = _setup(tmp_path)
    written = view.write_isrs("gone", 0, [IsrChange(0, 1, (0, 1), (0,))])
    assert written.document is None and written.outcomes == {0: IsrOutcome.NO_PARTITION}
    assert store.writes == 0
