"""The controller loop (ControllerLoop) over a real SQLite MetadataStore, with fake health checks and clock;
and the embedded cluster's controller process (sluice.operator.controller.local) around it."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from sluice.metadata import keys, open_store
from sluice.metadata.store import Document, MetadataStore
from sluice.operator.controller.decisions import new_topic
from sluice.operator.controller.local import parse_args
from sluice.operator.controller.loop import (
    DEFAULT_PREFERRED_LEADER_DELAY_MS,
    DEFAULT_PREFERRED_LEADER_HOLD_MS,
    ControllerFenced,
    ControllerLoop,
)
from sluice.operator.liveness.brokers import FailureDetector


class Fake:
    """Health answers and a clock the test controls."""

    def __init__(self) -> None:
        self.now = 0.0
        self.down: set[int] = set()
        self.leaving: set[int] = set()  # answer NOT_SERVING: controlled shutdown

    def clock(self) -> float:
        return self.now

    def check(self, targets: Mapping[int, str]) -> dict[int, str]:
        return {
            b: "UNAVAILABLE" if b in self.down else "NOT_SERVING" if b in self.leaving else "SERVING" for b in targets
        }


def register(store: MetadataStore, *ids: int) -> None:
    for i in ids:
        value = {"broker_id": i, "host": "127.0.0.1", "port": 9000 + i, "rack": "", "started_ms": 0}
        store.compare_and_set(keys.broker(i), value, None)


def setup(tmp_path: Path) -> tuple[MetadataStore, ControllerLoop, Fake]:
    store = open_store(str(tmp_path / "metadata.sqlite"))
    register(store, 0, 1, 2)
    doc = new_topic("orders", "id", 3, 3, {}, [(0, ""), (1, ""), (2, "")])
    store.compare_and_set(keys.topic("orders"), doc.to_json(), None)
    fake = Fake()
    controller = ControllerLoop(store, FailureDetector(fake.check, timeout_ms=1000, clock=fake.clock))
    controller.claim()
    return store, controller, fake


def partitions(store: MetadataStore, name: str = "orders") -> list[dict[str, Any]]:
    doc = store.get(keys.topic(name))
    assert doc is not None and doc.value is not None
    return list(doc.value["partitions"])


def fail_for(controller: ControllerLoop, fake: Fake, seconds: float) -> None:
    for _ in range(int(seconds / 0.2) + 1):
        fake.now += 0.2
        controller.run_round()


def test_all_alive_writes_nothing(tmp_path: Path) -> None:
    store, controller, _ = setup(tmp_path)
    before = store.get(keys.topic("orders"))
    assert controller.run_round() == 0
    assert store.get(keys.topic("orders")) == before
    ctl = store.get(keys.CONTROLLER)
    assert ctl is not None and ctl.value is not None
    assert ctl.value["live_brokers"] == [0, 1, 2] and ctl.value["epoch"] == 1
    assert ctl.value["controller_id"] == -1


def test_dead_broker_loses_leadership_and_isr_membership(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store, controller, fake = setup(tmp_path)
    controller.run_round()
    fake.down = {0}
    with caplog.at_level(logging.INFO, logger="sluice.operator.controller"):
        fail_for(controller, fake, 1.2)
    p0, p1, p2 = partitions(store)
    assert (p0["leader"], p0["leader_epoch"], p0["isr"]) == (1, 1, [1, 2])
    assert (p1["leader"], p1["leader_epoch"], p1["isr"]) == (1, 0, [1, 2])
    assert (p2["leader"], p2["leader_epoch"], p2["isr"]) == (2, 0, [2, 1])
    text = caplog.text
    assert "broker 0 is dead" in text
    assert "elected broker 1 leader of orders-0 at epoch 1 (broker 0 dead)" in text
    ctl = store.get(keys.CONTROLLER)
    assert ctl is not None and ctl.value is not None
    assert ctl.value["live_brokers"] == [1, 2] and ctl.value["dead_brokers"] == [0]
    # back, but not in sync: no leadership; in sync (the leader's write): leadership returns
    fake.down = set()
    controller.run_round()
    assert partitions(store)[0]["leader"] == 1
    doc = store.get(keys.topic("orders"))
    assert doc is not None and doc.value is not None
    value = dict(doc.value)
    value["partitions"][0]["isr"] = [1, 2, 0]
    store.compare_and_set(doc.key, value, doc.version)
    controller.run_round()
    assert partitions(store)[0]["leader"] == 1, "leadership returned before the preferred-leader delay"
    fake.now += DEFAULT_PREFERRED_LEADER_DELAY_MS / 1000
    controller.run_round()
    p0 = partitions(store)[0]
    assert (p0["leader"], p0["leader_epoch"]) == (0, 2)


def test_a_broker_that_flaps_does_not_take_leadership_back(tmp_path: Path) -> None:
    store, controller, fake = setup(tmp_path)
    controller.run_round()
    fake.down = {0}
    fail_for(controller, fake, 1.2)
    fake.down = set()
    doc = store.get(keys.topic("orders"))
    assert doc is not None and doc.value is not None
    value = dict(doc.value)
    value["partitions"][0]["isr"] = [1, 2, 0]
    store.compare_and_set(doc.key, value, doc.version)
    delay_s = DEFAULT_PREFERRED_LEADER_DELAY_MS / 1000
    fail_for(controller, fake, delay_s * 0.6)  # alive for a while ...
    fake.down = {0}
    controller.run_round()  # ... one failed check: not dead yet, but the clock of being up starts again
    fake.down = set()
    fail_for(controller, fake, delay_s * 0.6)
    assert partitions(store)[0]["leader"] == 1
    fail_for(controller, fake, delay_s * 0.5)
    assert partitions(store)[0]["leader"] == 0


def count_decisions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the topics the controller decides from now on (its calls of elect_leaders), in order."""
    from sluice.operator.controller import loop

    decided: list[str] = []
    real = loop.elect_leaders

    def counting(doc: Any, *args: Any, **kwargs: Any) -> Any:
        decided.append(doc.name)
        return real(doc, *args, **kwargs)

    monkeypatch.setattr(loop, "elect_leaders", counting)
    return decided


def test_a_decision_is_made_again_only_when_its_inputs_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Idle rounds skip topics whose document revision and liveness are those of a "no change"
    decision; a new revision or a liveness change is decided again (and acted on)."""

    store, controller, fake = setup(tmp_path)
    controller.run_round()
    decided = count_decisions(monkeypatch)
    for _ in range(5):
        fake.now += 0.1
        assert controller.run_round() == 0
    assert decided == []
    # a leaderless partition written behind the controller's back: a new revision, decided again
    doc = store.get(keys.topic("orders"))
    assert doc is not None and doc.value is not None
    value = dict(doc.value)
    value["partitions"][1] = {**value["partitions"][1], "leader": -1}
    store.compare_and_set(doc.key, value, doc.version)
    assert controller.run_round() == 1
    assert decided == ["orders"] and partitions(store)[1]["leader"] == 1
    # liveness changes: decided again, and the dead broker's leadership moves
    decided.clear()
    fake.down = {2}
    fail_for(controller, fake, 1.2)
    assert decided and partitions(store)[2]["leader"] == 0
    # a deleted topic leaves the controller's view; a malformed one is left alone, not fatal
    doc = store.get(keys.topic("orders"))
    assert doc is not None
    store.delete(doc.key, doc.version)
    store.compare_and_set(keys.topic("broken"), {"name": "broken"}, None)
    controller.run_round()
    assert controller.topic_documents() == []


def test_controlled_shutdown_moves_leadership_without_waiting_for_the_timeout(tmp_path: Path) -> None:
    store, controller, fake = setup(tmp_path)
    controller.run_round()
    fake.leaving = {0}
    controller.run_round()  # no time passes: the NOT_SERVING answer is enough
    p0, p1, _ = partitions(store)
    assert p0["leader"] == 1 and 0 not in p0["isr"] and 0 not in p1["isr"]
    ctl = store.get(keys.CONTROLLER)
    assert ctl is not None and ctl.value is not None and ctl.value["dead_brokers"] == [0]


def test_a_conflicting_isr_write_is_re_read_and_re_decided(tmp_path: Path) -> None:
    store, controller, fake = setup(tmp_path)
    controller.run_round()
    fake.down = {2}

    class Racing:
        """Lets a 'leader' shrink an ISR between the controller's read and its compare-and-set."""

        def __init__(self, inner: MetadataStore) -> None:
            self.inner = inner
            self.raced = False

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def compare_and_set(self, key: str, value: dict[str, Any], expected_version: int | None) -> Document:
            if key.startswith(keys.TOPICS) and not self.raced:
                self.raced = True
                doc = self.inner.get(key)
                assert doc is not None and doc.value is not None
                racing = dict(doc.value)
                racing["partitions"][1]["isr"] = [1, 2]  # leader 1 drops follower 0
                self.inner.compare_and_set(key, racing, doc.version)
            return self.inner.compare_and_set(key, value, expected_version)

    racing = Racing(store)
    controller.store = racing  # type: ignore[assignment]
    fail_for(controller, fake, 1.2)
    assert racing.raced
    p = partitions(store)
    assert p[1]["isr"] == [1], "the controller's decision was made again on the leader's version"
    assert p[2]["leader"] == 0 and p[2]["leader_epoch"] == 1


def controller_document(store: MetadataStore) -> dict[str, Any]:
    ctl = store.get(keys.CONTROLLER)
    assert ctl is not None and ctl.value is not None
    return dict(ctl.value)


def test_a_death_is_published_while_a_long_round_decides_on_its_own_snapshot(tmp_path: Path) -> None:
    store, controller, fake = setup(tmp_path)
    controller.run_round()
    # a round that takes long (at 100,000 partitions one may take seconds): it blocks on its topics
    entered, release = threading.Event(), threading.Event()
    topic_documents = controller.topic_documents

    def slow() -> Any:
        entered.set()
        assert release.wait(10)
        return topic_documents()

    controller.topic_documents = slow  # type: ignore[method-assign]
    stop = threading.Event()
    liveness = threading.Thread(target=controller.watch_liveness, args=(stop, 10), daemon=True)
    liveness.start()
    written: list[int] = []
    round_thread = threading.Thread(target=lambda: written.append(controller.run_round()), daemon=True)
    try:
        round_thread.start()
        assert entered.wait(5)
        fake.down = {0}
        fake.now += 1.2  # past the timeout: the next poll declares broker 0 dead
        deadline = time.monotonic() + 5
        while controller_document(store)["dead_brokers"] != [0] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert controller_document(store)["dead_brokers"] == [0], "the death waited for the round"
        assert round_thread.is_alive() and controller.wake.is_set()
    finally:
        release.set()
        round_thread.join(5)
        stop.set()
        liveness.join(5)
    # the round in progress decided with the liveness it started with: broker 0 still leads orders-0
    assert written == [0] and partitions(store)[0]["leader"] == 0
    controller.topic_documents = topic_documents  # type: ignore[method-assign]
    assert controller.run_round() == 1
    assert partitions(store)[0]["leader"] == 1


def test_the_liveness_thread_polls_only_while_its_controller_is_active(tmp_path: Path) -> None:
    store, controller, fake = setup(tmp_path)
    stop, active = threading.Event(), threading.Event()
    liveness = threading.Thread(target=controller.watch_liveness, args=(stop, 10, active), daemon=True)
    liveness.start()
    try:
        time.sleep(0.1)
        assert controller_document(store)["live_brokers"] == [], "polled before the first round listed the brokers"
        controller.run_round()
        fake.down = {0}
        fake.now += 1.2
        time.sleep(0.1)
        assert controller_document(store)["dead_brokers"] == [], "published while not the active controller"
        active.set()
        deadline = time.monotonic() + 5
        while controller_document(store)["dead_brokers"] != [0] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert controller_document(store)["dead_brokers"] == [0]
    finally:
        stop.set()
        liveness.join(5)


def test_a_newer_controller_fences_the_older_one(tmp_path: Path) -> None:
    store, controller, fake = setup(tmp_path)
    controller.run_round()
    newer = ControllerLoop(store, FailureDetector(fake.check, timeout_ms=1000, clock=fake.clock))
    assert newer.claim() == 2
    with pytest.raises(ControllerFenced):
        controller.run_round()
    stop = threading.Event()
    controller.run(stop, interval_ms=10)  # returns at once instead of looping
    newer.run_round()


def test_unknown_brokers_keep_leadership_until_declared_dead(tmp_path: Path) -> None:
    store, controller, fake = setup(tmp_path)
    fake.down = {0}  # never seen alive by this controller
    controller.run_round()
    assert partitions(store)[0]["leader"] == 0
    fail_for(controller, fake, 1.2)
    assert partitions(store)[0]["leader"] == 1


def test_process_exits_cleanly_on_sigterm(tmp_path: Path) -> None:
    path = tmp_path / "metadata.sqlite"
    store = open_store(str(path))
    register(store, 0)
    log = tmp_path / "controller.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sluice.operator.controller.local", "--metadata", str(path),
             "--failure-timeout-ms", "500", "--interval-ms", "50"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "is dead" not in log.read_text():
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert "broker 0 is dead" in text and "controller stopped" in text
    ctl = store.get(keys.CONTROLLER)
    assert ctl is not None and ctl.value is not None and ctl.value["dead_brokers"] == [0]


def _readmit(store: MetadataStore, broker: int, *indexes: int, name: str = "orders") -> None:
    """A leader's ISR write: ``broker`` back in the ISR of the given partitions."""
    doc = store.get(keys.topic(name))
    assert doc is not None and doc.value is not None
    value = dict(doc.value)
    for i in indexes:
        value["partitions"][i] = {**value["partitions"][i], "isr": [*value["partitions"][i]["isr"], broker]}
    store.compare_and_set(doc.key, value, doc.version)


def _six_partitions(
    tmp_path: Path, hold_ms: int = DEFAULT_PREFERRED_LEADER_HOLD_MS
) -> tuple[MetadataStore, ControllerLoop, Fake, list[int]]:
    """Six partitions over three brokers, broker 0 dead and back: the partitions it prefers."""
    store = open_store(str(tmp_path / "metadata.sqlite"))
    register(store, 0, 1, 2)
    doc = new_topic("orders", "id", 6, 3, {}, [(0, ""), (1, ""), (2, "")])
    store.compare_and_set(keys.topic("orders"), doc.to_json(), None)
    fake = Fake()
    controller = ControllerLoop(
        store, FailureDetector(fake.check, timeout_ms=1000, clock=fake.clock), preferred_leader_hold_ms=hold_ms
    )
    controller.claim()
    controller.clock_ms = lambda: int(fake.now * 1000)
    controller.run_round()
    fake.down = {0}
    fail_for(controller, fake, 1.2)
    fake.down = set()
    prefers_0 = [i for i, p in enumerate(partitions(store)) if p["replicas"][0] == 0]
    assert len(prefers_0) == 2 and all(partitions(store)[i]["leader"] != 0 for i in prefers_0)
    fail_for(controller, fake, DEFAULT_PREFERRED_LEADER_DELAY_MS / 1000)  # broker 0 settled, not yet in any ISR
    return store, controller, fake, prefers_0


def test_preferred_leaders_return_in_one_write_once_the_returning_broker_caught_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leaders re-admit a returning broker one partition at a time; the controller hands its
    preferred leaderships back in one write of the topic when the last one is in sync, not one write
    per round of re-admissions (1,614 controller writes in the simulation's rolling restart). While
    the moves wait, rounds with the same inputs do not decide the topic again."""

    store, controller, fake, (first, second) = _six_partitions(tmp_path)
    _readmit(store, 0, first)
    decided = count_decisions(monkeypatch)
    written = 0
    for _ in range(5):
        fake.now += 0.1
        written += controller.run_round()
    assert written == 0 and partitions(store)[first]["leader"] != 0, "moved before the others caught up"
    assert decided == ["orders"], "a held topic was decided again with the same inputs"
    _readmit(store, 0, second)
    fake.now += 0.1
    assert controller.run_round() == 1
    assert [partitions(store)[i]["leader"] for i in (first, second)] == [0, 0]
    for _ in range(5):
        fake.now += 0.1
        assert controller.run_round() == 0


def test_a_replica_that_never_catches_up_holds_the_others_back_only_for_the_hold(tmp_path: Path) -> None:
    store, controller, fake, (first, second) = _six_partitions(tmp_path)
    _readmit(store, 0, first)
    fail_for(controller, fake, controller.preferred_leader_hold_s * 0.9)
    assert partitions(store)[first]["leader"] != 0
    fail_for(controller, fake, controller.preferred_leader_hold_s * 0.2)
    assert partitions(store)[first]["leader"] == 0 and partitions(store)[second]["leader"] != 0


def test_with_no_hold_each_preferred_leader_returns_as_soon_as_it_is_in_sync(tmp_path: Path) -> None:
    """--preferred-leader-hold-ms 0 (SLUICE_PREFERRED_LEADER_HOLD_S 0 in the operator): Kafka's behaviour,
    one write per re-admission, for a cluster that prefers balance now to fewer metadata writes."""
    args = parse_args(["--metadata", str(tmp_path / "m.sqlite"), "--preferred-leader-hold-ms", "0"])
    store, controller, fake, (first, second) = _six_partitions(tmp_path, hold_ms=args.preferred_leader_hold_ms)
    _readmit(store, 0, first)
    fake.now += 0.1
    assert controller.run_round() == 1
    assert [partitions(store)[i]["leader"] == 0 for i in (first, second)] == [True, False]


def test_a_negative_hold_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--metadata", str(tmp_path / "m.sqlite"), "--preferred-leader-hold-ms", "-1"])


def test_an_idle_round_reads_the_store_only_through_its_changes(tmp_path: Path) -> None:
    """No get or list per round (over Kubernetes each was a quorum read: 20 reads/s at 100 ms rounds);
    the brokers and the controller document come from the store's changes, as topics do."""
    store, controller, fake = setup(tmp_path)
    controller.run_round()  # the brokers' liveness published: that one is a read-modify-write
    calls: list[str] = []

    class Counting:
        def __getattr__(self, name: str) -> Any:
            if name in ("get", "list"):
                calls.append(name)
            return getattr(store, name)

    controller.store = Counting()  # type: ignore[assignment]
    for _ in range(5):
        fake.now += 0.1
        assert controller.run_round() == 0
    assert calls == []
    register(store, 3)  # a new broker is seen, and a newer controller still fences this one
    controller.run_round()
    assert 3 in controller.brokers
    ControllerLoop(store, FailureDetector(fake.check, timeout_ms=1000, clock=fake.clock)).claim()
    with pytest.raises(ControllerFenced):
        controller.run_round()
