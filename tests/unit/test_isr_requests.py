"""Leaders' ISR changes as requests to the controller (Kafka's AlterPartition), over a real SQLite store.

The controller (ControllerLoop, fake health checks and clock) reads ``isr_requests/<broker>``
documents written by brokers' ClusterViews and writes what it accepts into the topic documents,
every leader's changes to a topic in one write; a request names the partition epoch it was decided
from, so once taken (or overtaken) it never applies again, not even when the ISR returns to its base.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from sluice.broker.cluster import ClusterView
from sluice.broker.config import BrokerConfig
from sluice.metadata import documents, keys, open_store
from sluice.metadata.documents import ControllerDocument, IsrRequest, IsrRequestsDocument, TopicDocument
from sluice.metadata.store import MetadataStore
from sluice.operator.controller.decisions import new_topic
from sluice.operator.controller.loop import ControllerLoop
from sluice.operator.liveness.brokers import FailureDetector

from .test_controller_local import Fake, register


class WritesByKey:
    """The store, counting compare-and-sets per key."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self.writes: Counter[str] = Counter()

    def compare_and_set(self, key: str, *args: Any, **kwargs: Any) -> Any:
        self.writes[key] += 1
        return self.store.compare_and_set(key, *args, **kwargs)

    def writes_to(self, key: str) -> int:
        return self.writes[key]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def _setup(tmp_path: Path, partitions: int = 6) -> tuple[WritesByKey, ControllerLoop, Fake, dict[int, ClusterView]]:
    path = str(tmp_path / "metadata.sqlite")
    store = WritesByKey(open_store(path))
    register(store, 0, 1, 2)  # type: ignore[arg-type]
    doc = new_topic("orders", "id-1", partitions, 3, {}, [(0, ""), (1, ""), (2, "")])
    store.compare_and_set(keys.topic("orders"), doc.to_json(), None)
    fake = Fake()
    controller = ControllerLoop(store, FailureDetector(fake.check, timeout_ms=1000, clock=fake.clock))  # type: ignore[arg-type]
    controller.claim()
    controller.run_round()
    views = {}
    for b in (0, 1, 2):
        views[b] = ClusterView(store, BrokerConfig.build(b, "127.0.0.1", 1, str(tmp_path), path, {}))  # type: ignore[arg-type]
        views[b].refresh()
    return store, controller, fake, views


def _topic(store: MetadataStore) -> TopicDocument:
    doc = documents.read(store, keys.topic("orders"), TopicDocument)
    assert doc is not None
    return doc.value


def _shrink(topic: TopicDocument, index: int, without: int) -> IsrRequest:
    """The request the partition's leader makes to take ``without`` out of its ISR."""
    p = topic.partitions[index]
    return IsrRequest(
        "orders",
        topic.topic_id,
        index,
        p.leader_epoch,
        p.partition_epoch,
        list(p.isr),
        [b for b in p.isr if b != without],
    )


def test_the_controller_says_it_takes_requests_and_brokers_see_it(tmp_path: Path) -> None:
    store, _controller, _fake, views = _setup(tmp_path)
    controller_doc = documents.read(store, keys.CONTROLLER, ControllerDocument)
    assert controller_doc is not None and controller_doc.value.isr_requests
    assert all(view.controller_takes_isr_requests for view in views.values())
    # a controller document from before (no field) reads as "leaders write their changes themselves"
    assert not ControllerDocument.from_json({"controller_id": -1, "epoch": 3}).isr_requests


def test_every_leaders_requests_to_a_topic_are_one_controller_write(tmp_path: Path) -> None:
    store, controller, _fake, views = _setup(tmp_path)
    topic = _topic(store)
    by_leader: dict[int, list[IsrRequest]] = {}
    for i, p in enumerate(topic.partitions):
        follower = next(b for b in p.replicas if b != p.leader)
        by_leader.setdefault(p.leader, []).append(_shrink(topic, i, follower))
    assert len(by_leader) == 3  # three leaders, two partitions each
    for leader, requests in by_leader.items():
        views[leader].request_isrs(requests)
    before = store.writes_to(keys.topic("orders"))
    assert controller.run_round() == 1
    assert store.writes_to(keys.topic("orders")) == before + 1  # six changes of three leaders: one write
    after = _topic(store)
    for leader, requests in by_leader.items():
        for r in requests:
            p = after.partitions[r.partition]
            assert (p.leader, p.isr, p.partition_epoch) == (leader, r.isr, r.partition_epoch + 1)
    # decided again (the topic changed) the requests are stale now: no second write
    assert controller.run_round() == 0
    assert store.writes_to(keys.topic("orders")) == before + 1


def test_a_request_never_applies_twice_even_when_the_isr_returns_to_its_base(tmp_path: Path) -> None:
    store, controller, _fake, views = _setup(tmp_path, partitions=1)
    topic = _topic(store)
    p = topic.partitions[0]
    follower = next(b for b in p.replicas if b != p.leader)
    shrink = _shrink(topic, 0, follower)
    views[p.leader].request_isrs([shrink])
    controller.run_round()
    assert _topic(store).partitions[0].isr == shrink.isr
    # the follower catches up and the leader asks for it back, and gets it: the ISR is the first
    # request's base again, while that request still stands in an older revision of the document
    shrunk = _topic(store)
    grow = IsrRequest(
        "orders", topic.topic_id, 0, p.leader_epoch, shrunk.partitions[0].partition_epoch, shrink.isr, shrink.base
    )
    views[p.leader].request_isrs([grow])
    controller.run_round()
    assert set(_topic(store).partitions[0].isr) == set(shrink.base)
    views[p.leader].request_isrs([shrink])  # the old request written again (a lost answer, a retry)
    assert controller.run_round() == 0
    final = _topic(store).partitions[0]
    assert set(final.isr) == set(shrink.base) and final.partition_epoch == shrink.partition_epoch + 2


def test_requests_of_a_non_leader_a_stale_epoch_or_another_topic_id_are_refused(tmp_path: Path) -> None:
    store, controller, _fake, views = _setup(tmp_path, partitions=1)
    topic = _topic(store)
    p = topic.partitions[0]
    follower = next(b for b in p.replicas if b != p.leader)
    good = _shrink(topic, 0, follower)
    not_leader = good  # the same request from a broker that does not lead the partition
    views[follower].request_isrs([not_leader])
    stale_epoch = IsrRequest("orders", topic.topic_id, 0, p.leader_epoch, p.partition_epoch + 1, good.base, good.isr)
    other_id = IsrRequest("orders", "id-of-a-deleted-topic", 0, p.leader_epoch, p.partition_epoch, good.base, good.isr)
    other_leader_epoch = IsrRequest(
        "orders", topic.topic_id, 0, p.leader_epoch + 1, p.partition_epoch, good.base, good.isr
    )
    for request in (stale_epoch, other_id, other_leader_epoch):
        views[p.leader].request_isrs([request])
        assert controller.run_round() == 0, request
        assert _topic(store).partitions[0] == p
        assert _topic(store).partitions[0].partition_epoch == p.partition_epoch


def test_a_request_is_written_only_when_it_asks_something_new(tmp_path: Path) -> None:
    store, _controller, _fake, views = _setup(tmp_path, partitions=1)
    topic = _topic(store)
    p = topic.partitions[0]
    request = _shrink(topic, 0, next(b for b in p.replicas if b != p.leader))
    views[p.leader].request_isrs([request])
    key = keys.isr_requests(p.leader)
    assert store.writes_to(key) == 1
    views[p.leader].request_isrs([request])
    assert store.writes_to(key) == 1
    stored = documents.read(store, key, IsrRequestsDocument)
    assert stored is not None and stored.value.requests == [request] and stored.value.broker_id == p.leader


def test_a_dead_broker_asked_back_into_an_isr_is_fenced_out_again_in_the_same_write(tmp_path: Path) -> None:
    store, controller, fake, views = _setup(tmp_path, partitions=1)
    topic = _topic(store)
    p = topic.partitions[0]
    follower = next(b for b in p.replicas if b != p.leader)
    views[p.leader].request_isrs([_shrink(topic, 0, follower)])
    controller.run_round()
    shrunk = _topic(store).partitions[0]
    # the leader asks for the follower back just as the controller finds it dead
    fake.down.add(follower)
    for _ in range(10):
        fake.now += 0.2
        controller.run_round()
    grow = IsrRequest(
        "orders", topic.topic_id, 0, p.leader_epoch, shrunk.partition_epoch, shrunk.isr, [*shrunk.isr, follower]
    )
    views[p.leader].request_isrs([grow])
    written = store.writes_to(keys.topic("orders"))
    controller.run_round()
    assert follower not in _topic(store).partitions[0].isr
    assert store.writes_to(keys.topic("orders")) == written  # taken and undone in one decision: no write


def test_a_leader_the_controller_holds_dead_cannot_shrink_the_isr_to_itself(tmp_path: Path) -> None:
    store, controller, fake, views = _setup(tmp_path, partitions=1)
    topic = _topic(store)
    p = topic.partitions[0]
    others = [b for b in p.replicas if b != p.leader]
    # the leader is cut off from its followers and from the controller's health checks: it asks for
    # an ISR of itself alone just as the controller declares it dead
    zombie = IsrRequest("orders", topic.topic_id, 0, p.leader_epoch, p.partition_epoch, list(p.isr), [p.leader])
    fake.down.add(p.leader)
    for _ in range(4):  # silent for 0.8 s: not dead yet (the failure timeout is 1 s)
        fake.now += 0.2
        controller.run_round()
    assert _topic(store).partitions[0].leader == p.leader
    views[p.leader].request_isrs([zombie])
    fake.now += 0.4
    controller.run_round()  # the round that finds it dead sees its request too
    after = _topic(store).partitions[0]
    # Taken, the request would leave an ISR of the dead leader alone: no clean election possible.
    assert after.leader in others and set(after.isr) == set(others)
