"""Consumer groups through subscribe(): partitions shared out, handed over, and what the
application sees of a rebalance (only inside poll(), as in Kafka), rebalance callbacks included."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from sluice.client import Admin, Consumer, Producer, TopicPartition
from sluice.testing import LocalCluster
from tests.support.waiting import wait_for

HEARTBEAT_MS = 200


def seed(cluster: LocalCluster, topic: str, partitions: int, per_partition: int) -> set[bytes]:
    with Admin(bootstrap_servers=cluster.bootstrap_servers) as admin:
        admin.create_topic(topic, partitions=partitions)
    sent = set()
    with Producer(bootstrap_servers=cluster.bootstrap_servers, linger_ms=1) as producer:
        for p in range(partitions):
            for i in range(per_partition):
                value = b"%d:%d" % (p, i)
                producer.send(topic, value=value, partition=p)
                sent.add(value)
        producer.flush()
    return sent


def member(cluster: LocalCluster, group: str, **kwargs: object) -> Consumer:
    return Consumer(
        bootstrap_servers=cluster.bootstrap_servers,
        group_id=group,
        heartbeat_interval_ms=HEARTBEAT_MS,
        max_poll_records=5,
        **kwargs,  # type: ignore[arg-type]
    )


def test_two_members_share_the_partitions_and_hand_them_over(cluster: LocalCluster, unique_topic: str) -> None:
    sent = seed(cluster, unique_topic, partitions=4, per_partition=50)
    group = f"{unique_topic}-g"
    a = member(cluster, group)
    a.subscribe([unique_topic])
    seen: list[bytes] = []
    wait_for(
        lambda: (seen.extend(r.value for r in a.poll(0.2) if r.value), len(a.assignment()) == 4)[1], what="a owns all"
    )
    a.commit()
    before = a.assignment()

    b = member(cluster, group)
    b.subscribe([unique_topic])
    b.poll(0.1)  # joins; gets nothing while a holds everything
    # The coordinator now wants some of a's partitions for b. What a sees changes only when it polls:
    time.sleep(HEARTBEAT_MS * 5 / 1000)
    assert a.assignment() == before, "the assignment changed between two polls"
    a.commit()  # the positions of what it returned are still its to commit
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (len(a.assignment()) == 4 or not b.assignment()):
        seen += [r.value for r in a.poll(0.1) if r.value]
        seen += [r.value for r in b.poll(0.1) if r.value]
    assert a.assignment() and b.assignment(), "the partitions were not shared out"
    assert a.assignment().isdisjoint(b.assignment())
    assert a.assignment() | b.assignment() == {TopicPartition(unique_topic, p) for p in range(4)}
    a.commit()
    b.commit()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and set(seen) != sent:
        for c in (a, b):
            seen += [r.value for r in c.poll(0.1) if r.value]
        a.commit()
        b.commit()
    a.close()
    b.close()
    assert set(seen) == sent
    # committed offsets hand partitions over where the last owner stopped: only records that were
    # returned but not yet committed when a partition moved may be read twice
    assert len(seen) - len(sent) <= 4 * 5


def test_group_metadata_is_the_one_the_records_were_returned_under(cluster: LocalCluster, unique_topic: str) -> None:
    seed(cluster, unique_topic, partitions=2, per_partition=20)
    group = f"{unique_topic}-g"
    a = member(cluster, group)
    a.subscribe([unique_topic])
    wait_for(lambda: a.poll(0.2) and len(a.assignment()) == 2, what="a owns both partitions")
    metadata = a.group_metadata()
    b = member(cluster, group)
    b.subscribe([unique_topic])
    b.poll(0.1)
    time.sleep(HEARTBEAT_MS * 5 / 1000)  # a's member epoch moves on in the background ...
    assert a.group_metadata() == metadata  # ... but not what a's application sees until it polls
    wait_for(lambda: (a.poll(0.1), b.poll(0.1), len(a.assignment()) == 1)[2], what="a gives one partition up")
    assert a.group_metadata().member_id == metadata.member_id
    assert a.group_metadata().member_epoch > metadata.member_epoch
    a.close()
    b.close()


def test_rebalance_callbacks_from_poll_in_order(cluster: LocalCluster, unique_topic: str) -> None:
    """on_revoke (partitions still assigned, committable) before the new owner's on_assign;
    on_assign with only what was added; close() revokes what is left; nothing between polls."""
    sent = seed(cluster, unique_topic, partitions=4, per_partition=10)
    group = f"{unique_topic}-g"
    events: list[tuple[str, str, list[TopicPartition]]] = []
    seen: list[bytes] = []

    def recorder(name: str, kind: str) -> Callable[[Consumer, list[TopicPartition]], None]:
        def record(consumer: Consumer, partitions: list[TopicPartition]) -> None:
            if kind == "revoke":
                assert set(partitions) <= consumer.assignment()  # not dropped yet
                consumer.commit({tp: consumer.position(tp) for tp in partitions})
            events.append((name, kind, partitions))

        return record

    def join(name: str) -> Consumer:
        c = member(cluster, group)
        c.subscribe(
            [unique_topic],
            on_assign=recorder(name, "assign"),
            on_revoke=recorder(name, "revoke"),
            on_lost=recorder(name, "lost"),
        )
        return c

    def poll(c: Consumer) -> None:
        seen.extend(r.value for r in c.poll(0.1) if r.value)

    all_tps = [TopicPartition(unique_topic, p) for p in range(4)]
    a = join("a")
    wait_for(lambda: (poll(a), len(a.assignment()) == 4)[1], what="a owns all")
    assert events == [("a", "assign", all_tps)]
    b = join("b")
    b.poll(0.1)
    time.sleep(HEARTBEAT_MS * 5 / 1000)
    assert events == [("a", "assign", all_tps)], "a callback ran outside poll()"
    wait_for(lambda: (poll(a), poll(b), len(b.assignment()) == 2)[2], what="b gets two partitions")
    revoked = sorted(set(all_tps) - a.assignment())
    assert events[1:] == [("a", "revoke", revoked), ("b", "assign", revoked)]
    wait_for(lambda: (poll(a), poll(b), set(seen) == sent)[2], what="everything read")
    b.close()
    assert events[-1] == ("b", "revoke", revoked)
    wait_for(lambda: (poll(a), len(a.assignment()) == 4)[1], what="a owns all again")
    assert events[-1] == ("a", "assign", revoked)
    a.close()
    assert events[-1] == ("a", "revoke", all_tps)
    assert not any(kind == "lost" for _, kind, _ in events)
    assert len(seen) == len(sent)  # every hand-over started where on_revoke committed


def test_subscribe_refuses_a_callback_that_is_not_callable(cluster: LocalCluster, unique_topic: str) -> None:
    c = member(cluster, f"{unique_topic}-g")
    try:
        with pytest.raises(TypeError, match="on_revoke must be a callable"):
            c.subscribe([unique_topic], on_revoke="commit")  # type: ignore[arg-type]
        assert c.subscription() == set()
    finally:
        c.close()
