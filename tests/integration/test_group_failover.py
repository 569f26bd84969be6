"""Consumer-group membership across a coordinator failover, on real broker processes.

The group coordinator persists membership in ``__consumer_offsets`` (KIP-848's records), so
when its broker is killed with SIGKILL the broker that becomes leader of the group's
partition loads the group as it was: members keep their ids, epochs and partitions, no
partition is revoked or assigned (the rebalance callbacks, which a real rebalance does call,
are not called), and consumption goes on from the committed offsets without duplicates.
A member whose coordinator was away for longer than its session does lose its partitions,
and is told through ``on_lost``. Every wait is bounded.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import records_pb2 as pb
from sluice.client import Admin, Consumer, Producer, TopicPartition
from sluice.testing import LocalCluster
from tests.support.waiting import wait_for

from .wire import Wire

HEARTBEAT_MS = 200
CONFIG = {"min.insync.replicas": "2", "replica.lag.time.max.ms": "2000"}

Event = tuple[str, str, tuple[TopicPartition, ...]]  # (member name, callback, partitions)

# A group member in a process of its own, so that it can die with SIGKILL (no leave).
MEMBER_SCRIPT = """
import sys
from sluice.client import Consumer
bootstrap, group, topic, session_ms = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
c = Consumer(bootstrap_servers=bootstrap, group_id=group, heartbeat_interval_ms=200, session_timeout_ms=session_ms)
c.subscribe([topic])
for _ in range(100_000):
    if c.poll(0.2):
        c.commit()
    print("assigned", sorted(tp.partition for tp in c.assignment()), flush=True)
"""


def coordinator_of(cluster: LocalCluster, group: str) -> int:
    """The broker that coordinates ``group``, asked of the first broker that answers."""
    for b in cluster.brokers:
        if b.state != "running":
            continue
        wire = Wire(b.address)
        try:
            found = wire.stub.FindCoordinator(bpb.FindCoordinatorRequest(key=group, key_type=bpb.GROUP), timeout=5)
        except Exception:
            continue
        finally:
            wire.close()
        if found.error_code == pb.NONE:
            return int(found.node_id)
    raise AssertionError(f"no broker could name the coordinator of {group!r}")


class Member:
    """A consumer of the group with callbacks that record what they were told, in order."""

    def __init__(self, cluster: LocalCluster, group: str, name: str, events: list[Event], **kwargs: object) -> None:
        self.name = name
        self.events = events
        self.consumer = Consumer(
            bootstrap_servers=cluster.bootstrap_servers,
            group_id=group,
            heartbeat_interval_ms=HEARTBEAT_MS,
            max_poll_records=50,
            **kwargs,  # type: ignore[arg-type]
        )
        self.seen: list[tuple[int, int]] = []  # (partition, offset) of every record returned

    def callback(self, kind: str) -> Callable[[Consumer, list[TopicPartition]], None]:
        def record(consumer: Consumer, partitions: list[TopicPartition]) -> None:
            assert consumer is self.consumer
            assert threading.current_thread() is threading.main_thread()  # from inside poll()
            if kind == "revoke":
                # still assigned while on_revoke runs: an exactly-once app commits them here
                assert set(partitions) <= consumer.assignment()
                consumer.commit()
            if kind == "lost":
                assert consumer.assignment() == set(partitions)
            self.events.append((self.name, kind, tuple(partitions)))

        return record

    def subscribe(self, topic: str) -> None:
        self.consumer.subscribe(
            [topic], on_assign=self.callback("assign"), on_revoke=self.callback("revoke"), on_lost=self.callback("lost")
        )

    def poll_and_commit(self, timeout: float = 0.1) -> None:
        records = self.consumer.poll(timeout)
        self.seen.extend((r.partition, r.offset) for r in records)
        if records:
            self.consumer.commit()  # what was returned is processed: the next owner starts after it


def produce(cluster: LocalCluster, topic: str, partitions: int, per_partition: int, tag: str) -> int:
    with Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all", linger_ms=1) as producer:
        for p in range(partitions):
            for i in range(per_partition):
                producer.send(topic, value=f"{tag}:{p}:{i}".encode(), partition=p)
        producer.flush()
    return partitions * per_partition


@pytest.mark.parametrize("fault", ["kill", "pause"])
def test_members_keep_ids_epochs_and_partitions_when_the_coordinator_fails(tmp_path: Path, fault: str) -> None:
    """kill: SIGKILL. pause: SIGSTOP until another broker took the group over, then SIGCONT, so
    the old coordinator comes back with a stale copy of the group (its answers wait for a high
    watermark its followers no longer move, so none reaches a member)."""
    partitions = 6
    with LocalCluster(brokers=3, data_dir=tmp_path, config=CONFIG, failure_timeout_ms=1000) as cluster:
        topic, group = "failover-in", "failover-g"
        with Admin(bootstrap_servers=cluster.bootstrap_servers) as admin:
            admin.create_topic(topic, partitions=partitions, replication_factor=3)
        sent = produce(cluster, topic, partitions, 20, "before")
        events: list[Event] = []
        members = [Member(cluster, group, name, events, session_timeout_ms=30_000) for name in ("a", "b", "c")]
        for m in members:
            m.subscribe(topic)

        def balanced() -> bool:
            for m in members:
                m.poll_and_commit()
            owned = [m.consumer.assignment() for m in members]
            return all(len(o) == 2 for o in owned) and len(set().union(*owned)) == partitions

        wait_for(balanced, timeout=60, interval=0.0, what="three members with two partitions each")
        wait_for(
            lambda: (balanced(), sum(len(m.seen) for m in members) >= sent)[1],
            timeout=60,
            interval=0.0,
            what="everything produced before the kill consumed",
        )
        for m in members:
            m.consumer.commit()
        before = {m.name: (m.consumer.group_metadata(), m.consumer.assignment()) for m in members}
        assert len({md.member_id for md, _ in before.values()}) == 3
        events.clear()

        coordinator = coordinator_of(cluster, group)
        killed_at = time.monotonic()
        if fault == "kill":
            cluster.kill(coordinator)
        else:
            cluster.pause(coordinator)
        try:
            wait_for(
                lambda: coordinator_of(cluster, group) != coordinator, timeout=60, what="a new coordinator of the group"
            )
        finally:
            if fault == "pause":
                cluster.resume(coordinator)
        new_coordinator = coordinator_of(cluster, group)
        sent += produce(cluster, topic, partitions, 20, "after")

        def caught_up() -> bool:
            for m in members:
                m.poll_and_commit()
            return sum(len(m.seen) for m in members) >= sent

        wait_for(caught_up, timeout=90, interval=0.0, what="consumption to go on after the failover")
        # every member commits through the new coordinator, as the member it was: it knows them
        for m in members:
            m.consumer.commit()
        # let a few heartbeats reach the new coordinator, then look again
        settle_until = time.monotonic() + 10 * HEARTBEAT_MS / 1000
        while time.monotonic() < settle_until:
            for m in members:
                m.poll_and_commit()
        failover_s = time.monotonic() - killed_at
        after = {m.name: (m.consumer.group_metadata(), m.consumer.assignment()) for m in members}
        print(f"{fault}: coordinator {coordinator} -> {new_coordinator}; failover and catch-up in {failover_s:.1f} s")
        assert events == [], f"rebalance callbacks were called across the failover: {events}"
        assert after == before, "a member's id, epoch or partitions changed across the failover"
        seen = [x for m in members for x in m.seen]
        assert len(seen) == sent, f"{len(seen) - sent} records read twice (or {sent - len(seen)} missing)"
        assert len(set(seen)) == sent
        for m in members:
            m.consumer.close()


def test_a_real_rebalance_calls_revoke_before_assign_across_a_failover(tmp_path: Path) -> None:
    """After a failover the group still rebalances for real: a joining member gets partitions
    only after the owner's on_revoke (which commits), and a leaving one hands them back."""
    with LocalCluster(brokers=3, data_dir=tmp_path, config=CONFIG, failure_timeout_ms=1000) as cluster:
        topic, group = "rebalance-in", "rebalance-g"
        with Admin(bootstrap_servers=cluster.bootstrap_servers) as admin:
            admin.create_topic(topic, partitions=4, replication_factor=3)
        sent = produce(cluster, topic, 4, 25, "x")
        events: list[Event] = []
        a = Member(cluster, group, "a", events, session_timeout_ms=30_000)
        a.subscribe(topic)
        wait_for(lambda: (a.poll_and_commit(), len(a.consumer.assignment()) == 4)[1], timeout=60, what="a owns all")
        coordinator = coordinator_of(cluster, group)
        cluster.kill(coordinator)
        wait_for(lambda: coordinator_of(cluster, group) != coordinator, timeout=60, what="a new coordinator")
        b = Member(cluster, group, "b", events, session_timeout_ms=30_000)
        b.subscribe(topic)

        def shared() -> bool:
            a.poll_and_commit()
            b.poll_and_commit()
            return len(a.consumer.assignment()) == 2 and len(b.consumer.assignment()) == 2

        wait_for(shared, timeout=90, interval=0.0, what="a and b share the partitions")
        all_tps = tuple(TopicPartition(topic, p) for p in range(4))
        a_events = [e for e in events if e[0] == "a"]
        b_events = [e for e in events if e[0] == "b"]
        assert a_events[0] == ("a", "assign", all_tps)  # before the kill; nothing at the failover
        assert [kind for _, kind, _ in a_events] == ["assign", "revoke"]
        revoked = set(a_events[1][2])
        assert b_events == [("b", "assign", tuple(sorted(revoked)))]
        # b's on_assign came after a's on_revoke: the hand-over waits for the release
        assert events.index(a_events[1]) < events.index(b_events[0])
        wait_for(
            lambda: (a.poll_and_commit(), b.poll_and_commit(), len(set(a.seen) | set(b.seen)) >= sent)[2],
            timeout=60,
            interval=0.0,
            what="everything consumed",
        )
        b.consumer.close()  # on_revoke with b's partitions, then the leave hands them to a
        assert events[-1] == ("b", "revoke", tuple(sorted(revoked)))
        wait_for(
            lambda: (a.poll_and_commit(), len(a.consumer.assignment()) == 4)[1], timeout=60, what="a owns all again"
        )
        assert events[-1] == ("a", "assign", tuple(sorted(revoked)))
        # commits in on_revoke hand partitions over exactly where the last owner stopped
        seen = a.seen + b.seen
        assert len(seen) == len(set(seen)) == sent
        a.consumer.close()


def test_a_member_expired_while_its_coordinator_was_away_gets_on_lost(tmp_path: Path) -> None:
    """One broker, paused (SIGSTOP) for longer than the member's session: the member is expired
    (its own session timer, and the coordinator's once it runs again), its partitions are lost,
    not revoked, and it rejoins as a new member."""
    session_ms = 3000
    with LocalCluster(brokers=1, data_dir=tmp_path, failure_timeout_ms=1000) as cluster:
        topic, group = "lost-in", "lost-g"
        with Admin(bootstrap_servers=cluster.bootstrap_servers) as admin:
            admin.create_topic(topic, partitions=2)
        produce(cluster, topic, 2, 5, "x")
        events: list[Event] = []
        a = Member(cluster, group, "a", events, session_timeout_ms=session_ms, request_timeout_ms=2000)
        a.subscribe(topic)
        wait_for(lambda: (a.poll_and_commit(), len(a.consumer.assignment()) == 2)[1], timeout=60, what="a owns all")
        first = a.consumer.group_metadata()
        all_tps = tuple(TopicPartition(topic, p) for p in range(2))
        assert events == [("a", "assign", all_tps)]
        cluster.pause(0)
        try:
            time.sleep(session_ms / 1000 * 2)
        finally:
            cluster.resume(0)
        wait_for(lambda: (a.consumer.poll(0.2), ("a", "lost", all_tps) in events)[1], timeout=60, what="on_lost")
        wait_for(lambda: (a.poll_and_commit(), len(a.consumer.assignment()) == 2)[1], timeout=60, what="a rejoined")
        assert [kind for _, kind, _ in events] == ["assign", "lost", "assign"]
        assert events[-1] == ("a", "assign", all_tps)
        assert a.consumer.group_metadata().member_id != first.member_id  # a new member
        a.consumer.close()


def test_a_member_that_died_with_the_coordinator_is_removed_a_full_session_after_the_load(tmp_path: Path) -> None:
    """The coordinator's broker and one member (its own process) are killed together: the new
    coordinator restores both members, gives the dead one a full session timeout from the load,
    then removes it; the survivor keeps its id and epoch until then and gets the dead member's
    partitions through on_assign only (no revoke, no loss)."""
    session_ms = 6000
    with LocalCluster(brokers=3, data_dir=tmp_path, config=CONFIG, failure_timeout_ms=1000) as cluster:
        topic, group = "dies-in", "dies-g"
        with Admin(bootstrap_servers=cluster.bootstrap_servers) as admin:
            admin.create_topic(topic, partitions=4, replication_factor=3)
        produce(cluster, topic, 4, 5, "x")
        events: list[Event] = []
        a = Member(cluster, group, "a", events, session_timeout_ms=session_ms)
        a.subscribe(topic)
        wait_for(lambda: (a.poll_and_commit(), len(a.consumer.assignment()) == 4)[1], timeout=60, what="a owns all")
        proc = subprocess.Popen(
            [sys.executable, "-c", MEMBER_SCRIPT, cluster.bootstrap_servers, group, topic, str(session_ms)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        lines: list[str] = []
        out = proc.stdout
        assert out is not None
        reader = threading.Thread(target=lambda: lines.extend(iter(out.readline, "")), daemon=True)
        reader.start()
        try:

            def other_has_half() -> bool:
                a.poll_and_commit()
                return bool(lines) and len(ast.literal_eval(lines[-1].removeprefix("assigned "))) == 2

            wait_for(other_has_half, timeout=90, interval=0.0, what="the second member takes half")
            wait_for(lambda: (a.poll_and_commit(), len(a.consumer.assignment()) == 2)[1], timeout=30, what="a has 2")
            kept = a.consumer.assignment()
            metadata = a.consumer.group_metadata()
            events.clear()
            coordinator = coordinator_of(cluster, group)
            killed_at = time.monotonic()
            proc.kill()
            cluster.kill(coordinator)
        finally:
            proc.kill()
            proc.wait(30)
        wait_for(lambda: coordinator_of(cluster, group) != coordinator, timeout=60, what="a new coordinator")
        wait_for(
            lambda: (a.poll_and_commit(), len(a.consumer.assignment()) == 4)[1],
            timeout=90,
            interval=0.0,
            what="a gets the dead member's partitions",
        )
        took = time.monotonic() - killed_at
        print(f"the dead member's partitions moved {took:.1f} s after the kill (session {session_ms} ms)")
        assert took >= session_ms / 1000 - 0.5, "the new coordinator expired a member before a full session passed"
        gained = tuple(sorted(set(TopicPartition(topic, p) for p in range(4)) - kept))
        assert events == [("a", "assign", gained)]
        assert a.consumer.group_metadata().member_id == metadata.member_id
        a.consumer.close()
