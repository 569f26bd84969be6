"""Network partitions, not only crashes (issue 13, section 4): iptables cuts between real brokers.

How: every process of the cluster runs under a group id of its own and iptables' ``owner`` match
drops loopback traffic between chosen groups (:mod:`sluice.testing.partitions`; why not network
namespaces: brokers keep listening on 127.0.0.1 as in every other test, clients keep reaching
every broker, and a cut is one rule per direction). Each test checks that its cut took effect
(a connect from the cut group times out, one from the test's own group succeeds, the chain's
counters dropped packets) and removes every rule in a finally block.

- A leader cut off from its followers and from the controller, while clients still reach it,
  acknowledges no acks=all write: a write sent to it during the cut fails, the majority elects
  a new leader and goes on, and after healing the old leader rejoins and the write it was sent
  is nowhere (it truncated it away as a follower).

Every wait is bounded in time; every loop in count.
"""

from __future__ import annotations

import threading
from pathlib import Path

from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import records_pb2 as pb
from sluice.client import Admin, Producer, TopicPartition
from sluice.testing import LocalCluster
from sluice.testing.partitions import NetworkPartitions

from .helpers import OffsetMonitor, read_topic, values, wait_for
from .wire import Wire, batch_of

CONFIG = {
    "min.insync.replicas": "2",
    # the controller (1.5 s) acts before the cut-off leader would shrink its ISR on its own
    "replica.lag.time.max.ms": "10000",
}


def endpoints(cluster: LocalCluster) -> list[tuple[int, int]]:
    return [(b.broker_id, b.port) for b in cluster.brokers]


def test_a_leader_cut_off_from_followers_and_controller_acknowledges_nothing(tmp_path: Path) -> None:
    with NetworkPartitions(tmp_path / "net") as net:
        cluster = LocalCluster(brokers=3, data_dir=tmp_path, config=CONFIG, failure_timeout_ms=1500, python=net.python)
        with cluster:
            admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
            admin.create_topic("island", partitions=1, replication_factor=3)
            producer = Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all", linger_ms=0)
            for i in range(5):
                producer.send("island", value=b"before-%d" % i).result(timeout=30)
            old = cluster.partition_state("island", 0)
            leader = old["leader"]
            follower = next(b for b in range(3) if b != leader)
            monitor = OffsetMonitor(cluster.bootstrap_servers, [TopicPartition("island", 0)], interval=0.2).start()
            ghost: list[bpb.ProducePartitionResponse] = []
            try:
                net.isolate(endpoints(cluster)[leader], endpoints(cluster))
                assert net.rules() == 5  # 2 per follower, 1 for the controller
                # the cut took effect: the leader's group cannot reach a follower, the test still reaches both
                host = cluster.host
                assert not net.connects(net.broker_gid(leader), host, cluster.broker(follower).port)
                assert net.connects(0, host, cluster.broker(leader).port)
                assert net.connects(0, host, cluster.broker(follower).port)
                for b in cluster.brokers:  # each broker really runs in its own group
                    assert b.pid is not None and net.process_gid(b.pid) == net.broker_gid(b.broker_id)
                net.zero_counters()  # from here on, only the cluster's own traffic is counted

                # a client that still reaches the old leader sends it an acks=all write
                wire = Wire(cluster.address(leader))
                sender = threading.Thread(
                    target=lambda: ghost.append(wire.produce("island", 0, batch_of([b"ghost"]), acks=-1)),
                    daemon=True,
                )
                sender.start()
                # the majority side elects a new leader and goes on writing
                wait_for(
                    lambda: cluster.partition_state("island", 0)["leader_epoch"] > old["leader_epoch"],
                    timeout=30,
                    what="a new leader on the majority side",
                )
                new = cluster.partition_state("island", 0)
                assert new["leader"] not in (leader, -1) and leader not in new["isr"]
                for i in range(5):
                    producer.send("island", value=b"during-%d" % i).result(timeout=30)
                sender.join(60)
                assert ghost, "the write to the cut-off leader never returned"
                assert ghost[0].error_code != pb.NONE, "the cut-off leader acknowledged an acks=all write"
                # and once it knows it was deposed, it refuses at once
                late = wire.produce("island", 0, batch_of([b"ghost-late"]), acks=-1)
                assert late.error_code == pb.NOT_LEADER_OR_FOLLOWER, late
                wire.close()
                assert net.dropped_packets() > 0
            finally:
                net.heal()
            wait_for(
                lambda: leader in cluster.partition_state("island", 0)["isr"],
                timeout=60,
                what="the old leader back in the ISR after healing",
            )
            monitor.stop()
            monitor.check()
            producer.send("island", value=b"after").result(timeout=30)
            producer.close()
            got = values(read_topic(cluster.bootstrap_servers, "island"))
            expected = [b"before-%d" % i for i in range(5)] + [b"during-%d" % i for i in range(5)] + [b"after"]
            assert got == expected, got
            print(
                f"\nleader {leader} cut off: its acks=all write answered {pb.ErrorCode.Name(ghost[0].error_code)}, "
                f"then {pb.ErrorCode.Name(late.error_code)}; new leader {new['leader']} at epoch {new['leader_epoch']}"
            )
            admin.close()
