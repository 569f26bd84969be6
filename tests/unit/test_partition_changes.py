"""Partition states as change records: the gate, the controller's one record per decision, the fold,
and every other writer (a leader's fallback ISR write, reassignments) over a real SQLite store.

Brokers are ClusterViews that register as the broker does (so they list ``partition_changes`` in
their ``metadata_features``); the controller is the ControllerLoop with fake health checks.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sluice.broker.cluster import ClusterView
from sluice.metadata import documents, keys, open_store
from sluice.metadata.documents import BrokerDocument, ControllerDocument, TopicDocument, TopicStateDocument
from sluice.metadata.isr import IsrChange, IsrOutcome, apply_isr_changes
from sluice.metadata.store import MetadataStore
from sluice.metadata.topic_view import TopicView, record_seq, update_partitions
from sluice.operator.controller import loop
from sluice.operator.controller.decisions import new_topic
from sluice.operator.controller.loop import ControllerLoop
from sluice.operator.liveness.brokers import FailureDetector
from tests.support.views import registered_view

from .test_controller_local import Fake, fail_for, setup

TOPICS = ("orders", "payments", "audit")
FOLD_RECORDS = 16
RECORDS = {"metadata.partition.changes.enable": "true"}  # brokers register as reading records


class CountingStore:
    """The store, counting writes (compare-and-sets and deletes) by key family."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self.writes: Counter[str] = Counter()

    def compare_and_set(self, key: str, *args: Any, **kwargs: Any) -> Any:
        self.writes[key.split("/", 1)[0]] += 1
        return self.store.compare_and_set(key, *args, **kwargs)

    def delete(self, key: str, *args: Any, **kwargs: Any) -> Any:
        self.writes["delete " + key.split("/", 1)[0]] += 1
        return self.store.delete(key, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def _cluster(tmp_path: Path) -> tuple[CountingStore, ControllerLoop, Fake, dict[int, ClusterView]]:
    store = CountingStore(open_store(str(tmp_path / "metadata.sqlite")))
    views = {b: registered_view(store, tmp_path, b, RECORDS) for b in (0, 1, 2)}  # type: ignore[arg-type]
    for i, name in enumerate(TOPICS):
        doc = new_topic(name, f"id-{i}", 6, 3, {}, [(0, ""), (1, ""), (2, "")])
        store.compare_and_set(keys.topic(name), doc.to_json(), None)
    fake = Fake()
    controller = ControllerLoop(store, FailureDetector(fake.check, timeout_ms=1000, clock=fake.clock))  # type: ignore[arg-type]
    controller.claim()
    controller.run_round()
    for view in views.values():
        view.refresh()
    return store, controller, fake, views


def _readmit(views: dict[int, ClusterView], broker: int, topics: tuple[str, ...] = TOPICS) -> None:
    """Each leader takes ``broker`` back into the ISRs it left (a leader's own write: one record per topic)."""
    for view in views.values():
        view.refresh()
    for name in topics:
        by_leader: dict[int, list[IsrChange]] = {}
        for i, p in enumerate(views[broker].topics[name].partitions):
            if broker in p.replicas and broker not in p.isr and p.leader >= 0:
                grown = (*p.isr, broker)
                by_leader.setdefault(p.leader, []).append(
                    IsrChange(i, p.leader_epoch, tuple(p.isr), grown, p.partition_epoch)
                )
        for leader, changes in by_leader.items():
            written = views[leader].write_isrs(name, leader, changes)
            assert set(written.outcomes.values()) == {IsrOutcome.WRITTEN}
            views[leader].isr_written(written.document)


def _declaration_versions(store: MetadataStore) -> dict[str, int]:
    return {d.key: d.version for d in store.list(keys.TOPICS)}


def test_the_gate_opens_once_every_registered_broker_reads_records_and_never_closes(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "metadata.sqlite"))
    registered_view(store, tmp_path, 0, RECORDS)
    old = BrokerDocument(1, "127.0.0.1", 9001)  # a broker of code from before: no metadata_features
    store.compare_and_set(keys.broker(1), old.to_json(), None)
    fake = Fake()
    controller = ControllerLoop(store, FailureDetector(fake.check, timeout_ms=1000, clock=fake.clock))
    controller.claim()
    controller.run_round()
    assert not controller.partition_changes
    registered_view(store, tmp_path, 1, RECORDS)  # broker 1 restarted with this code
    controller.run_round()
    assert controller.partition_changes
    published = documents.read(store, keys.CONTROLLER, ControllerDocument)
    assert published is not None and published.value.partition_changes
    # a newer controller keeps it open, even with a broker of older code registered again
    store.compare_and_set(keys.broker(1), old.to_json(), store.get(keys.broker(1)).version)  # type: ignore[union-attr]
    successor = ControllerLoop(store, FailureDetector(fake.check, timeout_ms=1000, clock=fake.clock))
    successor.claim()
    successor.run_round()
    assert successor.partition_changes


def test_a_failover_over_many_topics_is_one_record_and_no_topic_document_is_rewritten(tmp_path: Path) -> None:
    store, controller, fake, views = _cluster(tmp_path)
    assert controller.partition_changes and all(v.partition_changes for v in views.values())
    declared = _declaration_versions(store)
    store.writes.clear()
    fake.down.add(0)
    fail_for(controller, fake, 2.0)
    assert store.writes["partition_changes"] == 1  # every topic's elections and fencing: one record
    assert store.writes["topics"] == 0 and _declaration_versions(store) == declared
    views[1].refresh()
    for name in TOPICS:
        topic = views[1].topics[name]
        assert all(p.leader != 0 and 0 not in p.isr for p in topic.partitions), topic
    assert views[1].topics == TopicView.load(store).topics()


def test_a_leaders_fallback_isr_write_is_a_record_and_a_stale_one_is_refused(tmp_path: Path) -> None:
    store, _controller, _fake, views = _cluster(tmp_path)
    declared = _declaration_versions(store)
    p = views[0].topics["orders"].partitions[0]
    leader = views[p.leader]
    follower = next(b for b in p.replicas if b != p.leader)
    shrink = IsrChange(0, p.leader_epoch, tuple(p.isr), tuple(b for b in p.isr if b != follower), p.partition_epoch)
    written = leader.write_isrs("orders", p.leader, [shrink])
    assert written.outcomes == {0: IsrOutcome.WRITTEN}
    assert written.document is not None and written.document.key == keys.partition_changes(1)
    assert written.document.value is not None and written.document.value["writer"] == f"broker-{p.leader}"
    leader.isr_written(written.document)
    assert leader.topics["orders"].partitions[0].isr == list(shrink.isr)
    # the same change decided again from the old state: the partition moved on, nothing is written
    again = views[follower].write_isrs("orders", p.leader, [shrink])
    assert again.outcomes[0] is not IsrOutcome.WRITTEN and again.document is None
    assert _declaration_versions(store) == declared  # the declarations, never rewritten


def test_reassignments_start_as_records_and_are_listed_from_them(tmp_path: Path) -> None:
    store, _controller, _fake, views = _cluster(tmp_path)
    registered_view(store, tmp_path, 3, RECORDS)  # type: ignore[arg-type]
    view = views[0]
    view.refresh()
    declared = _declaration_versions(store)
    current = view.topics["payments"].partitions[2].replicas
    target = [3, *current[1:]]
    assert view.alter_partition_reassignments([("payments", 2, target)]) == [None]
    assert _declaration_versions(store) == declared
    listed = view.list_partition_reassignments()
    assert [(t, i) for t, i, _ in listed] == [("payments", 2)]
    assert listed[0][2].adding_replicas == [3]
    assert view.alter_partition_reassignments([("payments", 2, None)]) == [None]  # cancelled
    assert view.list_partition_reassignments() == []


def test_the_fold_moves_records_into_unwatched_states_and_changes_no_view(tmp_path: Path) -> None:
    store, controller, fake, views = _cluster(tmp_path)
    controller.fold_records = FOLD_RECORDS  # (1,000 by default)
    for _ in range(FOLD_RECORDS // 4 + 1):  # each death (a record) and return (a record per topic)
        fake.down.add(0)
        fail_for(controller, fake, 2.0)
        fake.down.discard(0)
        fail_for(controller, fake, 2.0)
        _readmit(views, 0)
    assert store.writes["partition_changes_fold"] >= 1
    assert store.writes["topic_states"] >= 1
    assert store.writes["delete partition_changes"] >= FOLD_RECORDS
    remaining = store.list(keys.PARTITION_CHANGES)
    assert len(remaining) < FOLD_RECORDS
    states = documents.list_documents(store, keys.TOPIC_STATES, TopicStateDocument)
    assert {s.value.name for s in states} == set(TOPICS)
    views[2].refresh()  # a view that watched all along
    fresh = TopicView.load(store).topics()  # one that starts now: states, then the records left
    assert views[2].topics == fresh
    controller.topics.catch_up()
    assert fresh == controller.topics.view.topics()


def test_a_fold_is_spread_over_rounds_and_records_written_meanwhile_stay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One topic's state a round (FOLD_TOPICS_PER_ROUND); the mark only once all are written, and a
    failover decided between two of those rounds is neither lost nor folded under the old mark."""
    monkeypatch.setattr(loop, "FOLD_TOPICS_PER_ROUND", 1)
    monkeypatch.setattr(loop, "FOLD_DELETES_PER_ROUND", 2)
    store, controller, fake, views = _cluster(tmp_path)
    fake.down.add(0)
    fail_for(controller, fake, 2.0)  # a record naming every topic
    fake.down.discard(0)
    fail_for(controller, fake, 2.0)
    _readmit(views, 0)  # a record per topic, by the leaders
    controller.fold_records = 2
    controller.topics.catch_up()
    waiting = sorted(controller.topics.view.records)
    controller.run_round()  # the fold starts: one topic's state
    assert store.writes["topic_states"] == 1 and store.get(keys.PARTITION_CHANGES_FOLD) is None
    controller.fold_records = 10**6  # due or not, the fold under way goes on
    fake.down.add(1)
    fake.now += 1.2
    controller.run_round()  # broker 1 dead: a record after the fold's last; the second topic's state
    assert store.writes["topic_states"] == 2 and store.get(keys.PARTITION_CHANGES_FOLD) is None
    controller.run_round()  # the third, and the mark
    mark = store.get(keys.PARTITION_CHANGES_FOLD)
    assert mark is not None and mark.value is not None and mark.value["seq"] == waiting[-1]
    assert store.writes["topic_states"] == len(TOPICS)
    waiting_deletion = [s for s in (record_seq(d.key) for d in store.list(keys.PARTITION_CHANGES)) if s <= waiting[-1]]
    assert len(waiting_deletion) == max(0, len(waiting) - loop.FOLD_DELETES_PER_ROUND)
    for _ in range(len(waiting)):  # deleted a few a round (FOLD_DELETES_PER_ROUND)
        controller.run_round()
    left = sorted(record_seq(d.key) for d in store.list(keys.PARTITION_CHANGES))
    assert left and min(left) > waiting[-1], "a record after the fold was deleted, or one before it kept"
    fresh = TopicView.load(store).topics()
    assert all(1 not in p.isr for t in fresh.values() for p in t.partitions), "broker 1's fencing was lost"
    views[2].refresh()
    controller.topics.catch_up()
    assert views[2].topics == fresh == controller.topics.view.topics()


def test_existing_topic_documents_are_where_the_records_start_from(tmp_path: Path) -> None:
    """An upgrade: topics written by older code (whole documents), then every broker reads records."""
    path = str(tmp_path / "metadata.sqlite")
    store = open_store(path)
    old = {"broker_id": 0, "host": "127.0.0.1", "port": 9000, "rack": "", "started_ms": 0}
    for b in (0, 1, 2):
        store.compare_and_set(keys.broker(b), {**old, "broker_id": b, "port": 9000 + b}, None)
    doc = new_topic("orders", "id-0", 3, 3, {}, [(0, ""), (1, ""), (2, "")])
    store.compare_and_set(keys.topic("orders"), doc.to_json(), None)
    fake = Fake()
    controller = ControllerLoop(store, FailureDetector(fake.check, timeout_ms=1000, clock=fake.clock))
    controller.claim()
    fake.down.add(0)
    fail_for(controller, fake, 2.0)
    assert not controller.partition_changes
    before = store.get(keys.topic("orders"))
    assert before is not None and before.version > 1  # elected the old way: the document rewritten
    # the brokers restart with this code, one by one; the gate opens with the last
    views = {b: registered_view(store, tmp_path, b, RECORDS, refresh=True) for b in (0, 1, 2)}
    fake.down.discard(0)
    fail_for(controller, fake, 1.0)
    assert controller.partition_changes
    _readmit(views, 0, ("orders",))  # caught up: its leaders take it back, as records
    fail_for(controller, fake, 12.0)  # settled: its leaderships return, as a record
    switched = store.get(keys.topic("orders"))
    assert switched is not None and switched.value is not None and switched.value["states_in_records"]
    assert switched.version == before.version + 1  # the switch itself; every change after it a record
    assert len(store.list(keys.PARTITION_CHANGES)) >= 2
    views[1].refresh()
    leaders = [p.leader for p in views[1].topics["orders"].partitions]
    assert leaders == [p.replicas[0] for p in doc.partitions]
    assert views[1].topics == TopicView.load(store).topics()


def test_a_writer_that_read_the_declaration_before_the_switch_appends_a_record(tmp_path: Path) -> None:
    """The switch to records is a compare-and-set of the declaration: a writer that read it before
    (its ISR change decided, its write not yet made) fails, reads the switch, and appends a record,
    so no state is ever written into a declaration once records may exist for its topic."""
    store = CountingStore(open_store(str(tmp_path / "metadata.sqlite")))
    views = {b: registered_view(store, tmp_path, b, RECORDS) for b in (0, 1, 2)}  # type: ignore[arg-type]
    doc = new_topic("orders", "id-0", 3, 3, {}, [(0, ""), (1, ""), (2, "")])
    store.compare_and_set(keys.topic("orders"), doc.to_json(), None)
    fake = Fake()
    controller = ControllerLoop(store, FailureDetector(fake.check, timeout_ms=1000, clock=fake.clock))  # type: ignore[arg-type]
    controller.claim()
    p = doc.partitions[0]
    follower = next(b for b in p.replicas if b != p.leader)
    shrink = IsrChange(0, p.leader_epoch, tuple(p.isr), tuple(b for b in p.isr if b != follower), p.partition_epoch)
    switched_meanwhile = []

    def change(topic: TopicDocument) -> TopicDocument:
        if not switched_meanwhile:  # between this writer's read and its write, the controller switches
            switched_meanwhile.append(controller.run_round())
        new, _outcomes = apply_isr_changes(topic, p.leader, [shrink])
        return new

    updated = update_partitions(store, "orders", change, writer="broker-0")  # type: ignore[arg-type]
    assert switched_meanwhile and controller.partition_changes
    assert updated is not None and updated.document is not None
    assert updated.document.key == keys.partition_changes(1)  # the second attempt: a record
    declared = store.get(keys.topic("orders"))
    assert declared is not None and declared.value is not None
    assert declared.value["states_in_records"] and declared.value["partitions"][0]["isr"] == list(p.isr)
    views[1].refresh()
    assert views[1].topics["orders"].partitions[0].isr == list(shrink.isr)
    assert TopicView.load(store).topic("orders") == views[1].topics["orders"]


def test_a_late_fold_never_writes_a_state_over_one_folded_further(tmp_path: Path) -> None:
    store, controller, _fake, _views = _cluster(tmp_path)
    topic = controller.topics.view.topic("orders")
    assert topic is not None
    newer = TopicStateDocument("orders", topic.topic_id, 9, list(topic.partitions))
    controller._write_state(newer)
    controller._write_state(dataclasses.replace(newer, seq=4, partitions=[]))  # a deposed controller's fold
    kept = documents.read(store, keys.topic_state("orders"), TopicStateDocument)
    assert kept is not None and kept.value.seq == 9 and kept.value.partitions == topic.partitions


def test_a_write_between_the_controllers_catch_up_and_its_record_is_seen_next_round(tmp_path: Path) -> None:
    """The controller's own record does not move the revision its view is current to: partitions added
    while it was deciding are still delivered, and their dead replica fenced (review finding)."""
    store, controller, fake, views = _cluster(tmp_path)
    real = store.compare_and_set
    added: list[str] = []

    def racing(key: str, value: Any, expected: int | None) -> Any:
        if key.startswith(keys.PARTITION_CHANGES) and not added:  # just before the controller's record
            added.append(views[1].create_partitions("orders", 8))
        return real(key, value, expected)

    store.compare_and_set = racing  # type: ignore[method-assign]
    fake.down.add(2)
    fail_for(controller, fake, 2.0)
    assert added
    fail_for(controller, fake, 1.0)
    topic = controller.topics.view.topic("orders")
    assert topic is not None and len(topic.partitions) == 8
    assert all(p.leader != 2 and 2 not in p.isr for p in topic.partitions), topic.partitions
    assert TopicView.load(store).topic("orders") == topic


def test_the_controller_never_writes_a_state_into_a_declaration_switched_under_it(tmp_path: Path) -> None:
    store, controller, fake = setup(tmp_path)  # brokers of older code: the gate stays closed
    stale = documents.read(store, keys.topic("orders"), TopicDocument)
    assert stale is not None
    switched = dataclasses.replace(stale.value, states_in_records=True)  # another controller's switch
    version = documents.replace(store, keys.topic("orders"), switched, stale.version)
    fake.down.add(2)
    for _ in range(10):  # broker 2 dead: a decision to write
        fake.now += 0.2
        controller.detector.poll(controller.registered_brokers())
    assert controller.reconcile_topic(stale, switch=True) == 0
    after = store.get(keys.topic("orders"))
    assert after is not None and after.version == version  # left to the records path


def test_a_brokers_own_record_ahead_of_its_watch_is_no_gap(tmp_path: Path) -> None:
    """A leader's record is numbered from fresh reads, so it may be ahead of the broker's watch: taking
    it at once must not make the broker LIST every folded state (review finding)."""
    store, _controller, _fake, views = _cluster(tmp_path)
    lists: Counter[str] = Counter()
    real = store.list

    def counting(prefix: str) -> Any:
        lists[prefix] += 1
        return real(prefix)

    store.list = counting  # type: ignore[method-assign]
    p = views[1].topics["audit"].partitions[0]  # record 1, by that partition's leader
    follower = next(x for x in p.replicas if x != p.leader)
    first = views[p.leader].write_isrs(
        "audit", p.leader, [IsrChange(0, p.leader_epoch, tuple(p.isr), tuple(x for x in p.isr if x != follower), 0)]
    )
    assert first.document is not None
    behind = next(v for b, v in views.items() if b != p.leader)
    q = behind.topics["orders"].partitions[1]
    mine = behind.config.broker_id
    if q.leader != mine:  # make this broker the writer of the second record: as the leader it is
        q = next(x for x in behind.topics["orders"].partitions if x.leader == mine)
    index = behind.topics["orders"].partitions.index(q)
    grown = next(x for x in q.replicas if x != q.leader)
    shrunk = IsrChange(index, q.leader_epoch, tuple(q.isr), tuple(x for x in q.isr if x != grown), q.partition_epoch)
    second = behind.write_isrs("orders", mine, [shrunk])
    assert second.document is not None and second.document.key == keys.partition_changes(2)
    behind.isr_written(second.document)  # record 2 taken before the watch brought record 1
    assert lists[keys.TOPIC_STATES] == 0
    assert behind.topics == TopicView.load(store).topics()
