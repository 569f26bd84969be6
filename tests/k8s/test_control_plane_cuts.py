"""The control plane partitioned on Kubernetes (issue 30, item 3): cuts from the API server.

One Sluice cluster on the test control plane for the module (tests/k8s/sluice_on_k8s.py: three
broker processes on 127.0.0.10-12 with the Kubernetes MetadataStore, their Pods, two operator
replicas). Every process runs under a group id of its own through the
:class:`~sluice.testing.partitions.NetworkPartitions` wrapper (brokers ``GID_BASE + id``, the
operators ``GID_BASE + 998`` and ``+ 997``; a base of its own, not the default one another suite
may use meanwhile), so iptables cuts one process from the API server's port and nothing else:

- ``test_a_leader_cut_from_the_api_server``: the leader of a partition cannot reach the API
  server for ~12 s while the impatient transactional workload runs; it keeps serving on the
  metadata it has and catches up when the cut heals.
- ``test_every_broker_cut_from_the_api_server``: the same for all three brokers at once.
- ``test_the_operator_cut_and_its_lease_lost_mid_failover``: a broker dies (killed, its Pod
  NotReady) and, during the Pod grace period (the failover under way, nothing elected yet), the
  active operator is cut from the API server: it can neither renew the ``sluice-controller``
  Lease nor write. The other replica takes the Lease when it expires, claims the next controller
  epoch and finishes the failover; when the cut heals the old one finds the Lease gone and stands
  down, electing nothing.

Each test ends with the queue checker (every acknowledged commit readable exactly once, nothing
aborted visible, unknown outcomes all or nothing, order, offsets never back, nothing read live
vanished) and the replica consistency check over the brokers' stored logs. Every wait is bounded.
"""

from __future__ import annotations

import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluice import errors
from sluice.client import Admin, TopicPartition
from sluice.metadata import keys
from sluice.testing import replicas as replica_check
from sluice.testing.partitions import NetworkPartitions
from tests.integration import partition_soak, queue_workload
from tests.integration.helpers import OffsetMonitor, read_topic
from tests.support.k8s_env import KubeCluster

from .crds import install_crds
from .sluice_on_k8s import SluiceOnK8s, wait_for

GID_BASE = 52000
OPERATOR_A_GID = GID_BASE + 998
OPERATOR_B_GID = GID_BASE + 997
HOLD_S = 12.0


@pytest.fixture(scope="module")
def cut(k8s: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SluiceOnK8s, NetworkPartitions]]:
    install_crds(k8s)
    workdir = tmp_path_factory.mktemp("sluice-k8s-cuts")
    namespace = k8s.create_namespace("sluice-cuts")
    with NetworkPartitions(workdir / "net", gid_base=GID_BASE) as net:
        cluster = SluiceOnK8s(k8s, namespace, workdir)
        cluster.python = net.python
        try:
            peering = Path(__file__).parents[2] / "manifests/operator/peering.yaml"
            k8s.kubectl("apply", "-n", namespace, "-f", str(peering))
            cluster.start({"replica.lag.time.max.ms": "10000"})
            cluster.start_operator(identity="operator-a", gid=OPERATOR_A_GID)
            wait_for(
                lambda: cluster.lease_holder() == "operator-a", 60, "operator-a holding the lease", logs=cluster.logs
            )
            cluster.start_second_operator("operator-b", gid=OPERATOR_B_GID)
            yield cluster, net
        finally:
            net.heal()
            cluster.close()


def api_port(k8s: KubeCluster) -> int:
    port = urllib.parse.urlsplit(str(k8s.server)).port
    assert port is not None, k8s.server
    return port


class Workload:
    """The partition soak's impatient workload (three transactional workers, a live reader, the offset
    monitor) on a topic of its own, and its checks."""

    def __init__(self, sluice: SluiceOnK8s, topic: str, seed: int) -> None:
        self.sluice = sluice
        self.topic = topic
        with Admin(sluice.bootstrap_servers) as admin:
            admin.create_topic(topic, partitions=queue_workload.PARTITIONS, replication_factor=3)
        wait_for(
            lambda: all(leader >= 0 for leader in sluice.leaders(topic)), 60, f"leaders of {topic}", logs=sluice.logs
        )
        self.tps = [TopicPartition(topic, p) for p in range(queue_workload.PARTITIONS)]
        self.workers = queue_workload.workers(sluice.bootstrap_servers, topic, 3, seed=seed, max_seconds=300)
        self.reader = queue_workload.LiveReader(sluice.bootstrap_servers, topic)
        self.monitor = OffsetMonitor(sluice.bootstrap_servers, self.tps, interval=0.25, max_seconds=400)

    def committed(self) -> int:
        return sum(len(w.committed) for w in self.workers)

    def start(self) -> None:
        self.monitor.start()
        for w in self.workers:
            w.start()
        self.reader.start()
        wait_for(lambda: self.committed() >= 3, 90, "commits before the fault", logs=self.sluice.logs)
        time.sleep(3.0)

    def whole(self) -> None:
        """Every partition of the topic led, with its whole ISR (bounded), and commits going on."""

        def isr_whole() -> bool:
            doc = self.sluice.topic_doc(self.topic) or {}
            return all(p["leader"] >= 0 and len(p["isr"]) == 3 for p in doc.get("partitions", []))

        wait_for(isr_whole, 120, f"every ISR of {self.topic} whole", logs=self.sluice.logs)
        before = self.committed()
        wait_for(lambda: self.committed() > before + 3, 90, "commits after the fault", logs=self.sluice.logs)

    def finish(self, what: str) -> queue_workload.Verdict:
        for w in self.workers:
            w.stop_event.set()
        for w in self.workers:
            w.stop(timeout=120)
        partition_soak._wait_stable(self.sluice.bootstrap_servers, self.tps)
        final = read_topic(self.sluice.bootstrap_servers, self.topic, limit_s=120)
        self.reader.stop()
        self.monitor.stop()
        verdict = queue_workload.check(self.workers, final, self.reader, self.monitor.regressions())
        print("\n" + verdict.summary(what))
        print(f"  producer errors: { {f'w{w.worker}': dict(w.errors) for w in self.workers} }")
        return verdict


def check_replicas(sluice: SluiceOnK8s, topic: str, timeout: float = 60.0) -> int:
    """The replica consistency check over ``topic`` on every broker (sluice.testing.replicas); the batch count."""
    deadline = time.monotonic() + timeout
    while True:
        doc = sluice.topic_doc(topic)
        assert doc is not None
        isr = {(topic, p): list(s["isr"]) for p, s in enumerate(doc["partitions"])}
        leaders = {(topic, p): int(s["leader"]) for p, s in enumerate(doc["partitions"])}
        with Admin(sluice.bootstrap_servers) as admin:
            ends = admin.list_offsets({TopicPartition(topic, p): Admin.LATEST for p in range(len(isr))}, timeout=10)
        hws = {(tp.topic, tp.partition): info.offset for tp, info in ends.items()}
        logs = [
            log
            for i in range(sluice.count)
            for log in replica_check.read_replica_logs(sys.executable, i, sluice.workdir / f"broker-{i}" / "rocksdb")
            if log.topic == topic
        ]
        behind = replica_check.lagging(logs, isr, hws)
        if not behind or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    differences = replica_check.compare(logs, isr, hws, leaders)
    assert not differences and not behind, f"replicas differ: {differences[:5]}; behind: {behind[:5]}"
    return sum(len(log.batches) for log in logs)


def leader_of(sluice: SluiceOnK8s, topic: str, partition: int) -> int:
    return sluice.leaders(topic)[partition]


def broker_log(sluice: SluiceOnK8s, i: int) -> str:
    return (sluice.workdir / f"broker-{i}.log").read_text(errors="replace")


def _cut_brokers(sluice: SluiceOnK8s, net: NetworkPartitions, brokers: list[int], tag: str) -> dict[str, Any]:
    port = api_port(sluice.k8s)
    work = Workload(sluice, f"queue-{tag}", seed=len(brokers))
    work.start()
    epochs_before = [p["leader_epoch"] for p in (sluice.topic_doc(work.topic) or {})["partitions"]]
    for b in brokers:
        net.cut_port(net.broker_gid(b), port)
    assert not net.connects(net.broker_gid(brokers[0]), "127.0.0.1", port)
    net.zero_counters()
    print(f"\nbrokers {brokers} cut from the API server (port {port})")
    started = time.monotonic()
    # Metadata changes while cut: a topic created through whichever broker the client picks. A cut
    # broker must answer a retriable error (its store write cannot reach the API server), one that is
    # not cut creates it, and the cut brokers' watches cannot deliver it until the cut heals.
    made = f"made-during-cut-{tag}"
    with Admin(sluice.bootstrap_servers, request_timeout_ms=15_000) as admin:
        try:
            admin.create_topic(made, partitions=1, replication_factor=3, timeout=20)
            outcome = "created"
        except errors.SluiceError as exc:
            assert exc.retriable, f"creating a topic while cut: {exc!r}"
            outcome = f"{type(exc).__name__} (retriable)"
    print(f"  CreateTopics while cut: {outcome}")
    time.sleep(max(0.0, HOLD_S - (time.monotonic() - started)))
    dropped = net.dropped_packets([net.broker_gid(b) for b in brokers])
    net.heal()
    print(f"healed: {dropped} packets dropped")
    assert dropped > 0
    work.whole()
    verdict = work.finish(tag)
    assert verdict.committed > 0
    assert verdict.valid, verdict.summary(tag)
    print(f"  replicas consistent: {check_replicas(sluice, work.topic)} batches compared")
    return {"epochs_before": epochs_before, "topic": work.topic}


def test_a_leader_cut_from_the_api_server(cut: tuple[SluiceOnK8s, NetworkPartitions]) -> None:
    sluice, net = cut
    wait_for(
        lambda: all(leader >= 0 for leader in sluice.leaders("__transaction_state")),
        60,
        "coordinators",
        logs=sluice.logs,
    )
    victim = 0
    _cut_brokers(sluice, net, [victim], "one")
    assert sluice.brokers[victim].is_alive()  # it was never restarted for it


def test_every_broker_cut_from_the_api_server(cut: tuple[SluiceOnK8s, NetworkPartitions]) -> None:
    sluice, net = cut
    _cut_brokers(sluice, net, list(range(sluice.count)), "all")
    assert all(p.is_alive() for p in sluice.brokers.values())


def test_the_operator_cut_and_its_lease_lost_mid_failover(cut: tuple[SluiceOnK8s, NetworkPartitions]) -> None:
    sluice, net = cut
    assert sluice.operator is not None
    operator_a_log = sluice.workdir / "operator.log"
    wait_for(lambda: sluice.lease_holder() == "operator-a", 30, "operator-a holding the lease", logs=sluice.logs)
    work = Workload(sluice, "queue-lease", seed=7)
    work.start()
    controller_epoch = int((sluice.store.get(keys.CONTROLLER).value or {}).get("epoch", 0))  # type: ignore[union-attr]
    victim = leader_of(sluice, work.topic, 0)
    a_log_before = operator_a_log.read_text(errors="replace")
    # the failover starts: the broker dies and its Pod turns NotReady (grace period 2 s) ...
    sluice.kill(victim)
    sluice.set_ready(victim, False)
    # ... and before it can end, the active operator loses the API server, so its Lease too
    net.cut_port(OPERATOR_A_GID, api_port(sluice.k8s))
    cut_at = time.monotonic()
    print(f"\nbroker {victim} killed and NotReady; operator-a cut from the API server")
    wait_for(lambda: sluice.lease_holder() == "operator-b", 60, "operator-b taking the lease", logs=sluice.logs)
    took_s = time.monotonic() - cut_at
    wait_for(
        lambda: leader_of(sluice, work.topic, 0) not in (-1, victim), 60, "the failover by operator-b", logs=sluice.logs
    )
    print(f"operator-b took the lease {took_s:.1f} s after the cut and finished the failover")
    epoch_b = int((sluice.store.get(keys.CONTROLLER).value or {}).get("epoch", 0))  # type: ignore[union-attr]
    assert epoch_b > controller_epoch
    time.sleep(max(0.0, HOLD_S - (time.monotonic() - cut_at)))
    dropped = net.dropped_packets([OPERATOR_A_GID])
    net.heal()
    print(f"operator-a healed ({dropped} packets dropped)")
    assert dropped > 0
    # operator-a comes back without the lease and stands down; operator-b stays the controller
    wait_for(
        lambda: (
            "lost the controller lease" in operator_a_log.read_text(errors="replace")[len(a_log_before) :]
            or "standing down" in operator_a_log.read_text(errors="replace")[len(a_log_before) :]
        ),
        60,
        "operator-a standing down",
        logs=sluice.logs,
    )
    time.sleep(3.0)
    assert sluice.lease_holder() == "operator-b"
    epoch_now = int((sluice.store.get(keys.CONTROLLER).value or {}).get("epoch", 0))  # type: ignore[union-attr]
    assert epoch_now == epoch_b, "a controller claimed an epoch after operator-b: operator-a acted again"
    sluice.restart(victim)
    sluice.set_ready(victim, True)
    work.whole()
    verdict = work.finish("lease")
    assert verdict.committed > 0
    assert verdict.valid, verdict.summary("lease")
    print(f"  replicas consistent: {check_replicas(sluice, work.topic)} batches compared")
