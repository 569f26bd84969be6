"""Replication across three real brokers: acks=all, the ISR, min.insync.replicas (DESIGN 7).

Leader failover itself is in test_failover.py; these tests need no election.
"""

from __future__ import annotations

from pathlib import Path

from sluice.api.v1 import records_pb2 as pb
from sluice.client import Admin, Producer
from sluice.testing import LocalCluster
from tests.support.waiting import wait_for

from .helpers import checked, read_topic, values
from .wire import Wire, batch_of

CONFIG = {"replica.lag.time.max.ms": "1500", "min.insync.replicas": "2"}


def partition_state(admin: Admin, topic: str) -> tuple[int, list[int], int]:
    p = admin.describe_topic(topic).partitions[0]
    return p.leader, sorted(p.isr), p.leader_epoch


def test_acks_all_waits_for_the_isr_and_min_insync_refuses_writes(tmp_path: Path) -> None:
    with checked(LocalCluster(brokers=3, data_dir=tmp_path, config=CONFIG)) as cluster:
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        admin.create_topic("replicated", partitions=1, replication_factor=3)
        producer = Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all", linger_ms=1)
        for f in [producer.send("replicated", value=b"r%d" % i) for i in range(500)]:
            f.result(timeout=30)
        producer.close()
        leader, isr, _epoch = partition_state(admin, "replicated")
        assert isr == [0, 1, 2]
        servers = cluster.bootstrap_servers.split(",")
        followers = [b for b in range(3) if b != leader]

        # Both followers die: the leader drops them from the ISR, and acks=all is refused.
        for b in followers:
            cluster.kill(b)
        wait_for(lambda: partition_state(admin, "replicated")[1] == [leader], timeout=20, what="ISR to shrink")
        wire = Wire(servers[leader])
        refused = wire.produce("replicated", 0, batch_of([b"refused"]), acks=-1)
        assert refused.error_code == pb.NOT_ENOUGH_REPLICAS, refused.error_message
        accepted = wire.produce("replicated", 0, batch_of([b"acks-1"]), acks=1)
        assert accepted.error_code == pb.NONE and accepted.base_offset == 500

        # One follower returns, catches up (the acks=1 record included) and rejoins the ISR.
        cluster.restart(followers[0])
        wait_for(
            lambda: partition_state(admin, "replicated")[1] == sorted([leader, followers[0]]),
            timeout=30,
            what="the returning follower to rejoin the ISR",
        )
        again = wire.produce("replicated", 0, batch_of([b"after"]), acks=-1)
        assert again.error_code == pb.NONE and again.base_offset == 501
        wire.close()
        got = values(read_topic(cluster.bootstrap_servers, "replicated"))
        assert got == [b"r%d" % i for i in range(500)] + [b"acks-1", b"after"]
        admin.close()


def test_internal_topics_are_replicated_on_three_brokers(tmp_path: Path) -> None:
    with checked(LocalCluster(brokers=3, data_dir=tmp_path)) as cluster:
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        for name in ("__transaction_state", "__consumer_offsets"):
            topic = admin.describe_topic(name)
            assert {len(p.replicas) for p in topic.partitions} == {3}
        admin.close()
