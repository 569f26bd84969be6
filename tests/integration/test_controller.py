"""The local controller against real brokers: failover of a killed or paused leader, and what a
returning broker may and may not do.

Assertions are about cluster metadata (the topic documents, the truth about leadership); the
data path across a failover (no acknowledged record lost, writes refused below
min.insync.replicas) is tested with the broker's replication.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from sluice.client import Admin
from sluice.testing import ClusterError, LocalCluster

Factory = Callable[..., LocalCluster]
TIMEOUT_MS = 1000


def _leader_and_state(cluster: LocalCluster, topic: str, partition: int) -> tuple[int, dict[str, Any]]:
    state = cluster.partition_state(topic, partition)
    assert state["leader"] >= 0, state
    return int(state["leader"]), state


def _assert_fenced_everywhere(cluster: LocalCluster, dead: int, timeout: float = 5.0) -> None:
    """The dead broker leads nothing and is in no ISR, internal topics included (bounded wait).

    A wait, not a snapshot: a leader re-admits a follower that fetched within its recency
    window (2 s), which can outlast a 1 s failure timeout; the controller then fences the dead
    broker out again in its next round.
    """
    problems: list[str] = []

    def fenced() -> bool:
        problems.clear()
        for name in ("__transaction_state", "__consumer_offsets"):
            doc = cluster.topic_document(name)
            assert doc is not None
            for i, p in enumerate(doc["partitions"]):
                if p["leader"] == dead or dead in p["isr"]:
                    problems.append(f"{name}-{i}: {p}")
        return not problems

    deadline = time.monotonic() + timeout
    while not fenced() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not problems, f"dead broker {dead} still leads or is in sync: {problems[:5]}"


def _watch_returning_broker(
    cluster: LocalCluster,
    topic: str,
    broker: int,
    seconds: float,
    until: Callable[[list[dict[str, Any]]], bool] | None = None,
) -> list[dict[str, Any]]:
    """Sample ``topic``'s partitions for ``seconds`` (or until ``until`` holds for a sample).

    Every sample is checked: a returning broker may only lead from inside the ISR. Returns
    the last sample.
    """
    deadline = time.monotonic() + seconds
    while True:
        doc = cluster.topic_document(topic)
        assert doc is not None
        parts = [dict(p) for p in doc["partitions"]]
        for i, p in enumerate(parts):
            if p["leader"] == broker:
                assert broker in p["isr"], f"{topic}-{i}: broker {broker} leads without being in sync: {p}"
        if (until is not None and until(parts)) or time.monotonic() >= deadline:
            return parts
        time.sleep(0.02)


def test_replication_defaults_follow_the_broker_count() -> None:
    c3 = LocalCluster(brokers=3, config={"offsets.topic.replication.factor": 2})
    c1 = LocalCluster(brokers=1)
    try:
        cfg = c3.broker(0).config
        assert cfg["default.replication.factor"] == "3"
        assert cfg["transaction.state.log.replication.factor"] == "3"
        assert cfg["offsets.topic.replication.factor"] == "2"  # the user's config wins
        assert cfg["min.insync.replicas"] == "2"
        assert "min.insync.replicas" not in c1.broker(0).config
        assert c3.controller.argv[-2:] == ["--failure-timeout-ms", "5000"]
    finally:
        c3.close()
        c1.close()


def test_killed_leader_is_replaced_from_the_isr_and_returns_only_in_sync(fresh_cluster: Factory) -> None:
    cluster = fresh_cluster(brokers=3, failure_timeout_ms=TIMEOUT_MS)
    topic = "orders"
    with Admin(bootstrap_servers=cluster.bootstrap_servers) as admin:
        admin.create_topic(topic, partitions=3, replication_factor=3)
        described = admin.describe_topic(topic)
    assert [len(p.replicas) for p in described.partitions] == [3, 3, 3]
    assert sorted(p.leader for p in described.partitions) == [0, 1, 2]  # leadership spread evenly
    for name in ("__transaction_state", "__consumer_offsets"):
        doc = cluster.topic_document(name)
        assert doc is not None and doc["replication_factor"] == 3

    victim, before = _leader_and_state(cluster, topic, 0)
    killed_at = time.monotonic()
    cluster.kill(victim)
    after = cluster.wait_for_leader_change(topic, 0, after_epoch=before["leader_epoch"], timeout=15)
    failover_s = time.monotonic() - killed_at
    print(f"metadata failover after kill -9: {failover_s:.2f} s with a {TIMEOUT_MS} ms failure timeout")

    assert after["leader"] != victim
    assert after["leader"] in before["isr"], "elected from outside the ISR"
    assert after["leader"] == next(b for b in before["replicas"] if b != victim)  # first live ISR replica
    assert after["leader_epoch"] == before["leader_epoch"] + 1
    assert victim not in after["isr"] and after["isr"]
    assert TIMEOUT_MS / 1000 * 0.8 <= failover_s < 3.0 + 2.0  # the detector waits its timeout, then acts
    # every other partition of every topic, internal ones included, drops the dead broker too
    doc = cluster.topic_document(topic)
    assert doc is not None
    for p in doc["partitions"]:
        assert p["leader"] != victim and victim not in p["isr"]
    _assert_fenced_everywhere(cluster, victim)
    ctl = cluster.controller_state()
    assert ctl is not None and ctl["dead_brokers"] == [victim]
    assert f"elected broker {after['leader']} leader of {topic}-0 at epoch {after['leader_epoch']}" in (
        cluster.controller.log_path.read_text()
    )
    # clients learn it too
    with Admin(bootstrap_servers=cluster.bootstrap_servers) as admin:
        seen = admin.describe_topic(topic).partitions[0]
    assert (seen.leader, seen.leader_epoch) == (after["leader"], after["leader_epoch"])

    # It comes back: the controller sees it alive, but it leads nothing before it is in sync.
    cluster.restart(victim)
    ctl = cluster.controller_state()
    assert ctl is not None and victim in ctl["live_brokers"]
    # The leader re-admits it to the ISR once it has caught up (the broker's part); then, being the
    # preferred replica, it gets its leadership back (the controller's part), at the next epoch.
    assert before["replicas"][0] == victim
    parts = _watch_returning_broker(cluster, topic, victim, seconds=30, until=lambda ps: ps[0]["leader"] == victim)
    back = parts[0]
    assert back["leader"] == victim, f"the preferred replica did not get its leadership back: {back}"
    assert victim in back["isr"] and back["leader_epoch"] == after["leader_epoch"] + 1
    assert "preferred replica back in sync" in cluster.controller.log_path.read_text()


def test_paused_leader_is_declared_dead_and_replaced(fresh_cluster: Factory) -> None:
    cluster = fresh_cluster(brokers=3, failure_timeout_ms=TIMEOUT_MS)
    topic = "paused"
    with Admin(bootstrap_servers=cluster.bootstrap_servers) as admin:
        admin.create_topic(topic, partitions=3, replication_factor=3)
    victim, before = _leader_and_state(cluster, topic, 1)
    cluster.pause(victim)  # alive, holding its state and port, answering nothing
    try:
        after = cluster.wait_for_leader_change(topic, 1, after_epoch=before["leader_epoch"], timeout=15)
        assert after["leader"] != victim and after["leader"] in before["isr"]
        assert after["leader_epoch"] > before["leader_epoch"]
        assert victim not in after["isr"]
        _assert_fenced_everywhere(cluster, victim)
    finally:
        cluster.resume(victim)
    # alive again after one successful check; still not a leader of anything it is not in sync for
    cluster.wait_until_healthy(timeout=30)
    ctl = cluster.controller_state()
    assert ctl is not None and victim in ctl["live_brokers"] and ctl["dead_brokers"] == []
    _watch_returning_broker(cluster, topic, victim, seconds=2.0)
    assert "is alive again" in cluster.controller.log_path.read_text()
    if before["replicas"][0] == victim:  # its preferred partition comes back to it once it is in sync
        parts = _watch_returning_broker(cluster, topic, victim, seconds=30, until=lambda ps: ps[1]["leader"] == victim)
        assert parts[1]["leader"] == victim and parts[1]["leader_epoch"] > after["leader_epoch"]


def test_single_broker_is_re_elected_after_a_long_outage(fresh_cluster: Factory) -> None:
    cluster = fresh_cluster(brokers=1, failure_timeout_ms=TIMEOUT_MS)
    with Admin(bootstrap_servers=cluster.bootstrap_servers) as admin:
        admin.create_topic("solo", partitions=2)
    before = cluster.partition_state("solo", 0)
    assert before["leader"] == 0
    cluster.kill(0)
    down = cluster.wait_for_partition(
        "solo", 0, lambda p: p["leader"] == -1, timeout=15, what="no leader after the only broker died"
    )
    assert down["leader_epoch"] == before["leader_epoch"] + 1
    assert down["isr"] == [0], "the last in-sync replica stays in the ISR so it can be elected again"
    cluster.restart(0)  # waits until the controller has re-elected it
    back = cluster.partition_state("solo", 0)
    assert (back["leader"], back["leader_epoch"], back["isr"]) == (0, before["leader_epoch"] + 2, [0])
    for name in ("__transaction_state", "__consumer_offsets"):
        doc = cluster.topic_document(name)
        assert doc is not None and all(p["leader"] == 0 for p in doc["partitions"])


def test_a_dead_controller_fails_the_health_wait(fresh_cluster: Factory) -> None:
    cluster = fresh_cluster(brokers=1, failure_timeout_ms=TIMEOUT_MS)
    pid = cluster.controller.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # a crash, not LocalCluster's own kill()
    assert cluster.controller.proc is not None
    cluster.controller.proc.wait(timeout=10)
    assert cluster.controller.state == "exited"
    with pytest.raises(ClusterError, match="the controller exited"):
        cluster.wait_until_healthy(timeout=5)
