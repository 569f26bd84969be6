"""Consumer groups through subscribe(): partitions shared out, handed over, and what the
application sees of a rebalance (only inside poll(), as in Kafka)."""

from __future__ import annotations

import time

from sluice.client import Admin, Consumer, Producer, TopicPartition
from sluice.testing import LocalCluster

from .helpers import wait_for

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
