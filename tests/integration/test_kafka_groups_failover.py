"""A classic group across a coordinator failover: 3 brokers, RF 3, the coordinator killed with SIGKILL.

The coordinator writes the group (generation, leader, members' metadata and assignments) to the
group's ``__consumer_offsets`` partition before it hands the assignment out, so the broker that
takes the partition over loads the group Stable at the same generation: the kafka-python members
find the new coordinator, keep heartbeating with their generation and committing, and no
committed offset is lost. Every wait is bounded.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.client import Admin, Producer
from sluice.testing import LocalCluster
from tests.support.waiting import wait_for

from .test_kafka_copier import coordinator_of
from .test_kafka_groups import Member, create, kconsumer, split

pytest.importorskip("kafka")

CONFIG = {"group.initial.rebalance.delay.ms": 300, "min.insync.replicas": "2", "replica.lag.time.max.ms": "3000",
          "offsets.topic.replication.factor": 3, "transaction.state.log.replication.factor": 3}  # fmt: skip


def committed(cluster: LocalCluster, group: str) -> dict[int, int]:
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    try:
        return {tp.partition: off for tp, off in admin.list_consumer_group_offsets(group).items()}
    finally:
        admin.close()


def test_members_keep_their_generation_and_offsets_when_the_coordinator_is_killed(tmp_path: Path) -> None:
    with LocalCluster(brokers=3, data_dir=tmp_path / "data", config=CONFIG, kafka_listener=True) as cluster:
        topic, group = "kgroup-failover", "kgroup-failover-group"
        values = create(cluster, topic, partitions=4, records=400, rf=3)
        members = [Member(kconsumer(cluster, group, f"member-{i}"), topic) for i in range(2)]
        before = wait_for(lambda: split(members, 4), timeout=120, what="two members with two partitions each")
        wait_for(lambda: committed(cluster, group) == {p: 100 for p in range(4)}, timeout=120,
                 what="every record read and committed")  # fmt: skip
        victim = coordinator_of(cluster, group)
        cluster.kill(victim)  # SIGKILL: the group's partition moves to another broker
        producer = Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all")
        extra = [f"{topic}-after-{i}".encode() for i in range(200)]
        for i, value in enumerate(extra):
            producer.send(topic, value=value, partition=i % 4)
        producer.flush()
        producer.close()
        # the new coordinator had the commits: none went back, and the new records get committed
        assert all(o >= 100 for o in committed(cluster, group).values())
        wait_for(lambda: committed(cluster, group) == {p: 150 for p in range(4)}, timeout=180,
                 what="the records produced after the failover read and committed")  # fmt: skip
        # the new coordinator loaded the group from its record, and the members kept their partitions
        successor = coordinator_of(cluster, group)
        assert successor != victim
        log = cluster.brokers[successor].log_path.read_text(errors="replace")
        assert f"classic group(s): {group}@" in log
        assert [m.assigned for m in members] == before
        for m in members:
            m.stop()
        read = [v for m in members for _, _, v in m.records]
        assert set(read) == set(values) | set(extra)
        cluster.restart(victim)
