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
- The queue workload (:mod:`tests.integration.queue_workload`) under kill -9, SIGSTOP and
  partition of a partition's leader, three rounds each: the checker's verdict (every committed
  value read exactly once and in order per partition, nothing aborted visible, unknown outcomes
  all or nothing, no offset regress) is printed in the test output (``pytest -s``) and must be
  VALID. ``SLUICE_QUEUE_FAULT_ROUNDS`` sets the rounds.

Every test on a cluster ends with the replica consistency check (``helpers.checked``: the
replicas' stored logs compared batch by batch, issue 30).

Every wait is bounded in time; every loop in count.
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest

from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import records_pb2 as pb
from sluice.client import Admin, Producer, TopicPartition
from sluice.testing import LocalCluster
from sluice.testing.partitions import NetworkPartitions
from tests.support.waiting import wait_for

from . import queue_workload
from .helpers import OffsetMonitor, checked, read_topic, values
from .wire import Wire, batch_of

CONFIG = {
    "min.insync.replicas": "2",
    # the controller (1.5 s) acts before the cut-off leader would shrink its ISR on its own
    "replica.lag.time.max.ms": "10000",
}


def endpoints(cluster: LocalCluster) -> list[tuple[int, ...]]:
    """(id, client port, inter-broker port) of every broker: a cut drops both ports."""
    return [(b.broker_id, b.port, *([b.inter_broker_port] if b.inter_broker_port else [])) for b in cluster.brokers]


def test_a_leader_cut_off_from_followers_and_controller_acknowledges_nothing(tmp_path: Path) -> None:
    with NetworkPartitions(tmp_path / "net") as net:
        cluster = LocalCluster(brokers=3, data_dir=tmp_path, config=CONFIG, failure_timeout_ms=1500, python=net.python)
        with checked(cluster):
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
                net.zero_counters()  # counted from the cut on
                # per follower: its client and inter-broker ports, both ways (4); the controller: 2
                assert net.rules() == 10
                # the cut took effect: the leader's group cannot reach a follower, the test still reaches both
                host = cluster.host
                assert not net.connects(net.broker_gid(leader), host, cluster.broker(follower).port)
                inter_broker_port = cluster.broker(follower).inter_broker_port
                assert inter_broker_port is not None
                assert not net.connects(net.broker_gid(leader), host, inter_broker_port)
                assert net.connects(0, host, cluster.broker(leader).port)
                assert net.connects(0, host, cluster.broker(follower).port)
                for b in cluster.brokers:  # each broker really runs in its own group
                    assert b.pid is not None and net.process_gid(b.pid) == net.broker_gid(b.broker_id)

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
                # the cluster's own traffic was dropped: the followers' fetches from the leader, the
                # controller's health checks (the probes above, as the leader's group, are not counted)
                cluster_gids = [net.broker_gid(b) for b in range(3) if b != leader] + [net.controller_gid]
                assert net.dropped_packets(cluster_gids) > 0, "the cut dropped none of the cluster's own traffic"
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


# -- the queue workload under kill, pause and partition ----------------------------------------------

QUEUE_ROUNDS = int(os.environ.get("SLUICE_QUEUE_FAULT_ROUNDS", "3"))


def inject(cluster: LocalCluster, net: NetworkPartitions, fault: str, victim: int, hold_s: float) -> None:
    """One fault on broker ``victim`` for ``hold_s`` seconds, then recovery (bounded)."""
    if fault == "kill":
        cluster.kill(victim)
        time.sleep(hold_s)
        cluster.restart(victim, timeout=90)
    elif fault == "pause":
        cluster.pause(victim)
        try:
            time.sleep(hold_s)
        finally:
            cluster.resume(victim)
    else:
        net.isolate(endpoints(cluster)[victim], endpoints(cluster))
        try:
            time.sleep(hold_s)
            assert net.dropped_packets() > 0, "the partition dropped nothing"
        finally:
            net.heal()


@pytest.mark.parametrize("fault", ["kill", "pause", "partition"])
def test_the_queue_workload_under_faults(tmp_path: Path, fault: str) -> None:
    rng = random.Random(f"queue-{fault}")
    with NetworkPartitions(tmp_path / "net") as net:
        cluster = LocalCluster(
            brokers=3,
            data_dir=tmp_path,
            config={"min.insync.replicas": "2", "replica.lag.time.max.ms": "3000"},
            failure_timeout_ms=1500,
            python=net.python,
        )
        with checked(cluster):
            admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
            admin.create_topic("queue", partitions=queue_workload.PARTITIONS, replication_factor=3)
            admin.close()
            tps = [TopicPartition("queue", p) for p in range(queue_workload.PARTITIONS)]
            producer = queue_workload.QueueProducer(cluster.bootstrap_servers, "queue", max_seconds=240)
            reader = queue_workload.LiveReader(cluster.bootstrap_servers, "queue")
            monitor = OffsetMonitor(cluster.bootstrap_servers, tps, interval=0.25).start()
            producer.start()
            reader.start()
            try:
                wait_for(lambda: len(producer.committed) >= 5, timeout=60, what="transactions before the faults")
                for _ in range(QUEUE_ROUNDS):
                    # the leader of a partition: the broker whose loss matters most
                    victim = cluster.leader("queue", rng.randrange(queue_workload.PARTITIONS))
                    if victim < 0:
                        victim = rng.randrange(3)
                    before = len(producer.committed)
                    inject(cluster, net, fault, victim, hold_s=rng.uniform(2.5, 4.0))
                    cluster.wait_until_healthy(timeout=90)
                    wait_for(
                        lambda before=before: len(producer.committed) > before,  # type: ignore[misc]
                        timeout=90,
                        what=f"commits after the {fault}",
                    )
                settled = len(producer.committed)
                wait_for(
                    lambda: len(producer.committed) >= settled + 5, timeout=90, what="commits after the last fault"
                )
            finally:
                net.heal()
                producer.stop()
            final = read_topic(cluster.bootstrap_servers, "queue", limit_s=120)
            reader.stop()
            monitor.stop()
            verdict = queue_workload.check(producer, final, reader, monitor.regressions())
            print(
                f"\n{verdict.summary(fault)}\n  producer restarts {producer.restarts}, errors {dict(producer.errors)}"
            )
    assert verdict.committed >= 5 + QUEUE_ROUNDS + 5, verdict.summary(fault)  # it ran through every fault
    assert verdict.valid, verdict.summary(fault)


def test_the_queue_checker_finds_each_kind_of_anomaly() -> None:
    """The checker itself: a verdict that can only say VALID would prove nothing."""
    producer = queue_workload.QueueProducer("unused:1", "queue")
    ok, gone, twice, ghost = b"p0:000000:t0", b"p1:000000:t0", b"p2:000000:t0", b"p0:000001:t1"
    half_a, half_b = b"p1:000001:t2", b"p2:000001:t2"
    producer.committed = [[ok, gone, twice]]
    producer.aborted = [[ghost]]
    producer.unknown = [[half_a, half_b]]
    final = [(0, 0, None, ok), (2, 0, None, twice), (2, 1, None, twice), (0, 1, None, ghost), (1, 2, None, half_a)]
    live = queue_workload.LiveReader("unused:1", "queue")
    live.records = [(0, 5, ok), (0, 4, ghost)]  # offsets going back, and an aborted value seen live
    verdict = queue_workload.check(producer, final, live, ["HW of queue-0 went back 5 -> 4"])
    assert not verdict.valid
    assert verdict.lost == [gone.decode()]
    assert any("p2:000000:t0 x2" in d for d in verdict.duplicated)
    assert verdict.aborted_visible == [ghost.decode()]
    assert verdict.partial and verdict.unknown_visible == 1
    assert verdict.out_of_order and verdict.offset_regressions
    assert "INVALID" in verdict.summary("self-test")


def test_the_queue_checker_with_several_workers() -> None:
    """Several workers: order is per worker and partition; an anomaly of one worker is still found."""
    w0 = queue_workload.QueueProducer("unused:1", "queue", worker=0)
    w1 = queue_workload.QueueProducer("unused:1", "queue", worker=1)
    a0, a1, b0, b1 = b"w0:p0:000000:t0", b"w0:p0:000001:t1", b"w1:p0:000000:t0", b"w1:p0:000001:t1"
    w0.committed, w1.committed = [[a0], [a1]], [[b0], [b1]]
    live = queue_workload.LiveReader("unused:1", "queue")
    live.records = [(0, 0, b0), (0, 1, a0)]
    interleaved = [(0, 0, None, b0), (0, 1, None, a0), (0, 2, None, a1), (0, 3, None, b1)]
    assert queue_workload.check([w0, w1], interleaved, live, []).valid
    swapped = [(0, 0, None, b1), (0, 1, None, a0), (0, 2, None, a1), (0, 3, None, b0)]
    assert queue_workload.check([w0, w1], swapped, live, []).out_of_order
    lost = [(0, 1, None, a0), (0, 2, None, a1), (0, 3, None, b1)]  # b0: committed, read live, gone
    verdict = queue_workload.check([w0, w1], lost, live, [])
    assert verdict.lost == [b0.decode()] and verdict.vanished and verdict.committed == 4
