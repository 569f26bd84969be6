"""Sluice as users meet it: `helm install` onto a node that really runs containers.

One release (three brokers, replication factor 3, the operator) on the single-node cluster of
tools/k8s-node, driven from the host through the same client library an application uses. The
tests run in file order and build on each other, as an operator's day would:

1. install: every pod Ready, the default Coordinators get their status (and no finalizer);
2. Topic and TransactionalId resources applied with kubectl are reconciled;
3. a transactional copy (consume-transform-produce, as `sluice demo` does) runs from the host
   while one broker pod is deleted and another broker's process is SIGKILLed: the operator moves
   leadership away, the copy is exactly once, and both brokers come back with their RocksDB
   data from their PersistentVolumes;
4. `helm upgrade` rolls the brokers one at a time, and no acknowledged write is lost;
5. `helm upgrade --set broker.replicas=5` with the automatic rebalance on: the new brokers get
   replicas and data; a remove-brokers SluiceRebalance drains them and says when they may go,
   `helm upgrade --set broker.replicas=3`; an acks=all producer and an exactly-once copy run
   throughout, nothing acknowledged is lost and nothing is copied twice;
6. `helm uninstall` finishes on its own and keeps the volumes.

The measured times (install to Ready, failover of a real pod, scaling) are printed (`pytest -s`) and
recorded in docs/kubernetes.md.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluice import errors
from sluice.client import Admin, Producer
from tests.node.node_cluster import CHART, Node, Release, read_committed, wait_for
from tests.support.k8s_env import ExistingCluster

# The first test also starts the node (a cold image build); `pytest -m node` selects these.
pytestmark = [pytest.mark.node, pytest.mark.timeout(1800)]

# Enough that the copy outlasts both failures on a quiet machine too (~700 records/s there: 6,000
# were copied before the deleted pod was back in every ISR).
RECORDS = 24000
TXN_SIZE = 25
PARTITIONS = 3


def condition(obj: dict[str, Any], kind: str) -> str:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return str(c.get("status"))
    return ""


def ready(obj: dict[str, Any]) -> dict[str, Any] | None:
    return obj if condition(obj, "Ready") == "True" else None


def resource(kind: str, name: str, **spec: object) -> dict[str, Any]:
    return {"apiVersion": "sluice.dev/v1alpha1", "kind": kind, "metadata": {"name": name}, "spec": spec}


@pytest.fixture(scope="module")
def release(node: Node, node_cluster: ExistingCluster) -> Iterator[Release]:
    namespace = node_cluster.create_namespace("sluice-node")
    rel = Release(node_cluster, namespace)
    rel.install()
    print(f"\nnode up in {node.up_seconds:.1f} s; helm install to all pods Ready: {rel.install_seconds:.1f} s")
    yield rel
    rel.k8s.helm("uninstall", rel.name, "--namespace", namespace, check=False, timeout=120)


def test_install_brings_every_pod_ready_and_the_coordinators_get_their_status(release: Release) -> None:
    for broker in range(3):
        pod = release.broker_pod(broker)
        assert pod["spec"]["hostNetwork"] is True and pod["status"]["podIP"] == release.node_ip

    def coordinators_ready() -> list[dict[str, Any]] | None:
        items = release.items("coordinators")
        done = len(items) == 2 and all(condition(c, "Ready") == "True" for c in items)
        return items if done else None

    items = wait_for(coordinators_ready, 120, "both Coordinators Ready")
    for c in items:
        assert len(c["status"]["partitions"]) == c["spec"]["partitions"]
        assert {row["coordinator"] for row in c["status"]["partitions"]} <= {0, 1, 2}
        # Nothing to clean up when a Coordinator goes: no finalizer, so uninstall never waits on one.
        assert not c["metadata"].get("finalizers")
    # The brokers registered the node's address with their own ports.
    with Admin(release.bootstrap()) as admin:
        described = admin.describe_topic("__transaction_state")
        assert described.replication_factor == 3
    # Kopf does not scan namespaces (the chart grants none): no 403 retries in the operator's log.
    log = release.k8s.kubectl("logs", "-n", release.namespace, "deploy/sluice-operator", timeout=30).stdout
    assert "forbidden" not in log.lower(), log[-3000:]


def test_topics_and_transactional_ids_applied_with_kubectl_are_reconciled(release: Release) -> None:
    for name in ("in", "out", "acked"):
        release.apply(resource("Topic", name, partitions=PARTITIONS, replicationFactor=3))
    for p in range(PARTITIONS):
        release.apply(resource("TransactionalId", f"copier-node-{p}", transactionalId=f"copier-node-{p}"))
    for name in ("in", "out", "acked"):
        topic = wait_for(functools.partial(lambda n: ready(release.get("topic", n)), name), 120, f"Topic {name} Ready")
        assert [row["partition"] for row in topic["status"]["partitions"]] == list(range(PARTITIONS))
        assert topic["metadata"]["finalizers"] == ["sluice.dev/finalizer"]  # deleting it deletes the topic
    for p in range(PARTITIONS):
        wait_for(functools.partial(lambda n: ready(release.get("transactionalid", n)), f"copier-node-{p}"),
                 120, "TransactionalIds Ready")  # fmt: skip
    with Admin(release.bootstrap()) as admin:
        for name in ("in", "out"):
            parts = admin.describe_topic(name).partitions
            assert [sorted(p.replicas) for p in parts] == [[0, 1, 2]] * PARTITIONS


class Copiers:
    """The exactly-once copier program (python -m sluice.cli.copier), one per input partition."""

    def __init__(
        self,
        release: Release,
        workdir: Path,
        source: str = "in",
        sink: str = "out",
        group: str = "copiers",
        ids: str = "copier-node",
    ) -> None:
        self.release = release
        self.workdir = workdir
        self.source, self.sink, self.group, self.ids = source, sink, group, ids
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def log(self, p: int) -> Path:
        return self.workdir / f"{self.group}-{p}.log"

    def start(self) -> None:
        for p in range(PARTITIONS):
            with open(self.log(p), "ab") as log:
                self.procs[p] = subprocess.Popen(
                    [
                        sys.executable, "-m", "sluice.cli.copier", "--bootstrap-server", self.release.bootstrap(),
                        "--input", self.source, "--output", self.sink, "--group", self.group, "--partition", str(p),
                        "--transactional-id", f"{self.ids}-{p}", "--transaction-size", str(TXN_SIZE),
                        "--max-seconds", "900",
                    ],
                    stdout=log, stderr=log,
                )  # fmt: skip

    def commits(self) -> int:
        return sum(self.log(p).read_text().count('"committed"') for p in self.procs)

    def running(self) -> bool:
        return any(p.poll() is None for p in self.procs.values())

    def wait(self, timeout: float) -> dict[int, int | None]:
        deadline = time.monotonic() + timeout
        out: dict[int, int | None] = {}
        for i, p in self.procs.items():
            try:
                out[i] = p.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                out[i] = None
        return out

    def log_tail(self) -> str:
        return "\n".join(f"--- {self.group}-{p}\n" + self.log(p).read_text()[-1500:] for p in self.procs)


def led_by(release: Release, broker: int) -> list[str]:
    """Partitions of the copy's topics and of __transaction_state that ``broker`` leads."""
    with Admin(release.bootstrap(), request_timeout_ms=5000) as admin:
        return [
            f"{t.name}-{p.partition}"
            for t in admin.describe_topics(["in", "out", "__transaction_state"])
            for p in t.partitions
            if p.leader == broker
        ]


def epochs_led_by(release: Release, broker: int) -> dict[str, int]:
    """Leader epoch of each partition (of the copy's topics and __transaction_state) ``broker`` leads."""
    with Admin(release.bootstrap(), request_timeout_ms=5000) as admin:
        return {
            f"{t.name}-{p.partition}": p.leader_epoch
            for t in admin.describe_topics(["in", "out", "__transaction_state"])
            for p in t.partitions
            if p.leader == broker
        }


def all_reelected(release: Release, before: dict[str, int]) -> bool:
    """Every partition of ``before`` got a new leader since (a higher epoch), wherever it is now:
    a broker restarted in place may already be its preferred leader again."""
    with Admin(release.bootstrap(), request_timeout_ms=5000) as admin:
        now = {
            f"{t.name}-{p.partition}": p.leader_epoch
            for t in admin.describe_topics(["in", "out", "__transaction_state"])
            for p in t.partitions
        }
    return all(now[tp] > epoch for tp, epoch in before.items())


def fully_replicated(release: Release) -> bool:
    with Admin(release.bootstrap(), request_timeout_ms=5000) as admin:
        return all(
            sorted(p.isr) == [0, 1, 2] for t in admin.describe_topics(["in", "out", "__transaction_state"])
            for p in t.partitions
        )  # fmt: skip


def identity(release: Release, broker: int) -> str:
    """The RocksDB IDENTITY of the broker's volume: the same database when it comes back."""
    found = list(release.volume_dir(broker).rglob("IDENTITY"))
    assert found, f"no RocksDB in broker {broker}'s volume {release.volume_dir(broker)}"
    return found[0].read_text()


def test_exactly_once_copy_while_a_broker_pod_is_deleted_and_another_is_killed(
    release: Release, tmp_path: Path
) -> None:
    producer = Producer(release.bootstrap(), acks="all", linger_ms=5)
    sent = [f"{i % PARTITIONS}:{i}".encode() for i in range(RECORDS)]
    for i, value in enumerate(sent):
        producer.send("in", key=value, value=value, partition=i % PARTITIONS)
    producer.flush()
    producer.close()

    # The victims: the coordinator of copier-node-0's transactional id (so a coordinator moves
    # too) is deleted as a pod; another broker's process is killed with SIGKILL.
    copiers = Copiers(release, tmp_path)
    copiers.start()
    wait_for(lambda: copiers.commits() >= 6, 180, "the copiers' first commits")
    with Admin(release.bootstrap()) as admin:
        deleted = admin.describe_transactions(["copier-node-0"])[0].coordinator_id
    killed = (deleted + 1) % 3
    volumes = {b: identity(release, b) for b in (deleted, killed)}
    old_uid = release.broker_pod(deleted)["metadata"]["uid"]

    t0 = time.monotonic()
    release.k8s.kubectl("delete", "pod", "-n", release.namespace, f"{release.name}-broker-{deleted}", "--wait=false")
    wait_for(lambda: not led_by(release, deleted), 120, f"broker {deleted}'s leaderships moving")
    moved_deleted = time.monotonic() - t0
    wait_for(lambda: (p := release.broker_pod(deleted))["metadata"]["uid"] != old_uid and release.ready(p), 240,
             f"broker {deleted}'s new pod Ready")  # fmt: skip
    back_deleted = time.monotonic() - t0
    wait_for(lambda: fully_replicated(release), 240, f"broker {deleted} back in every ISR")
    assert copiers.running(), "the copy finished before the second failure: raise RECORDS"

    wait_for(lambda: led_by(release, killed), 120, f"broker {killed} leading something again")
    restarts = release.restarts(killed)
    led = epochs_led_by(release, killed)
    t1 = time.monotonic()
    pid = release.sigkill(killed)
    wait_for(lambda: all_reelected(release, led), 120, f"new leaders for broker {killed}'s partitions after SIGKILL")
    moved_killed = time.monotonic() - t1
    wait_for(lambda: release.restarts(killed) > restarts and release.ready(release.broker_pod(killed)), 240,
             f"broker {killed}'s container restarted and Ready")  # fmt: skip
    back_killed = time.monotonic() - t1
    assert release.broker_pid(killed) != pid
    print(
        f"\nfailover on the node: pod of broker {deleted} deleted -> its leaderships moved in {moved_deleted:.1f} s, "
        f"new pod Ready in {back_deleted:.1f} s; broker {killed} SIGKILLed -> leaderships moved in "
        f"{moved_killed:.1f} s, container restarted and Ready in {back_killed:.1f} s"
    )

    codes = copiers.wait(600)
    assert all(c == 0 for c in codes.values()), f"copiers ended with {codes}\n{copiers.log_tail()}"
    copied = Counter(read_committed(release, "out"))
    assert [v for v, n in copied.items() if n > 1] == [], "duplicates in the output"
    assert set(copied) == set(sent), f"lost {len(set(sent) - set(copied))} records"

    # Both brokers came back on their own volumes: the same RocksDB, caught up again.
    for b in (deleted, killed):
        assert identity(release, b) == volumes[b], f"broker {b} came back with another database"
    wait_for(lambda: fully_replicated(release), 240, "every replica back in sync")


def test_helm_upgrade_rolls_brokers_one_at_a_time_without_losing_an_acknowledged_write(release: Release) -> None:
    acked: list[bytes] = []
    failed = 0
    stop = threading.Event()

    def produce() -> None:
        nonlocal failed
        producer = Producer(release.bootstrap(), acks="all", linger_ms=5, request_timeout_ms=20_000)
        i = 0
        try:
            while not stop.is_set():
                batch = [f"a{i + k}".encode() for k in range(20)]
                i += len(batch)
                futures = [(v, producer.send("acked", value=v, partition=j % PARTITIONS)) for j, v in enumerate(batch)]
                for value, future in futures:
                    try:
                        future.result(timeout=60)
                        acked.append(value)
                    except errors.SluiceError:
                        failed += 1  # not acknowledged: the producer said so, nothing is promised
        finally:
            producer.close()

    writer = threading.Thread(target=produce, daemon=True)
    writer.start()
    wait_for(lambda: len(acked) >= 100, 120, "the first acknowledged writes")
    before = {b: release.broker_pod(b)["metadata"]["uid"] for b in range(3)}
    most_down = 0
    done = threading.Event()
    result: list[subprocess.CompletedProcess[str]] = []

    def upgrade() -> None:
        try:
            result.append(release.helm(
                "upgrade", release.name, str(CHART), *release.values_args(),
                "--set-string", "broker.podAnnotations.sluice\\.dev/rollout=2", "--wait", "--timeout", "900s",
                timeout=960,
            ))  # fmt: skip
        finally:
            done.set()

    started = time.monotonic()
    upgrader = threading.Thread(target=upgrade, daemon=True)
    upgrader.start()
    while not done.wait(0.5):
        pods = {p["metadata"]["name"]: p for p in release.brokers()}
        down = 3 - sum(1 for p in pods.values() if release.ready(p))
        most_down = max(most_down, down)
    upgrader.join()
    rolled_s = time.monotonic() - started
    assert result and result[0].returncode == 0
    after = {b: release.broker_pod(b) for b in range(3)}
    assert all(after[b]["metadata"]["uid"] != before[b] for b in range(3)), "not every broker was replaced"
    assert all(after[b]["metadata"]["annotations"].get("sluice.dev/rollout") == "2" for b in range(3))
    assert most_down <= 1, f"{most_down} brokers were down at once"
    wait_for(lambda: len(acked) >= 100 + 50, 120, "writes acknowledged after the upgrade")
    stop.set()
    writer.join(120)
    got = set(read_committed(release, "acked"))
    lost = [v for v in acked if v not in got]
    print(f"\nhelm upgrade rolled 3 brokers in {rolled_s:.1f} s; {len(acked)} writes acknowledged, {failed} "
          f"refused, lost {len(lost)}; at most {most_down} broker down at a time")  # fmt: skip
    assert lost == [], f"{len(lost)} acknowledged writes lost, e.g. {lost[:5]}"


def replicas_by_broker(release: Release) -> Counter[int]:
    """Replicas per broker over every topic (the internal ones too)."""
    with Admin(release.bootstrap(), request_timeout_ms=5000) as admin:
        topics = admin.describe_topics(admin.list_topics(include_internal=True))
    return Counter(b for t in topics for p in t.partitions for b in p.replicas)


def all_in_sync_on(release: Release, brokers: set[int]) -> bool:
    """Every partition of every topic has its replicas on ``brokers`` only, all of them in its ISR."""
    with Admin(release.bootstrap(), request_timeout_ms=5000) as admin:
        topics = admin.describe_topics(admin.list_topics(include_internal=True))
    return all(set(p.replicas) <= brokers and sorted(p.isr) == sorted(p.replicas) for t in topics for p in t.partitions)


def rebalances(release: Release) -> dict[str, dict[str, Any]]:
    return {r["metadata"]["name"]: r for r in release.items("sluicerebalances")}


class Feeder:
    """An acks=all producer appending to ``topic`` (~200 records/s) until stopped; what it was told
    was written, and how many sends failed (not acknowledged: nothing is promised of those)."""

    def __init__(self, release: Release, topic: str) -> None:
        self.release, self.topic = release, topic
        self.acked: list[bytes] = []
        self.failed = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        producer = Producer(self.release.bootstrap(), acks="all", linger_ms=5, request_timeout_ms=20_000)
        i = 0
        try:
            while not self.stop.wait(0.1):
                batch = [(f"g{i + k}".encode(), (i + k) % PARTITIONS) for k in range(20)]
                i += len(batch)
                futures = [(v, producer.send(self.topic, key=v, value=v, partition=p)) for v, p in batch]
                for value, future in futures:
                    try:
                        future.result(timeout=60)
                        self.acked.append(value)
                    except errors.SluiceError:
                        self.failed += 1
        finally:
            producer.close()


def test_scale_to_five_brokers_and_back_to_three_with_an_exactly_once_copy_running(
    release: Release, tmp_path: Path
) -> None:
    """The issue's scale test: helm upgrade to 5 brokers with the automatic rebalance on, data
    moves to the new pods; a remove-brokers rebalance drains them, its ReadyToScaleDown says when,
    helm upgrade back to 3. Throughout, an acks=all producer feeds the input and the transactional
    copiers copy it (run again and again: each run copies what the input holds when it starts)."""
    with Admin(release.bootstrap()) as admin:
        admin.create_topic("grow-in", PARTITIONS, 3)
        admin.create_topic("grow-out", PARTITIONS, 3)
    feeder = Feeder(release, "grow-in")
    feeder.thread.start()
    wait_for(lambda: len(feeder.acked) >= 200, 120, "the feeder's first acknowledged writes")
    stop_copying = threading.Event()
    codes: list[dict[int, int | None]] = []
    copiers = Copiers(release, tmp_path, "grow-in", "grow-out", group="growers", ids="grower-node")

    def copy_rounds() -> None:
        for _ in range(100):  # bounded: a round lasts seconds to minutes
            last = stop_copying.is_set()  # set once the feeder has stopped: this round copies the rest
            copiers.start()
            codes.append(copiers.wait(600))
            if last or any(c != 0 for c in codes[-1].values()):
                return

    copying = threading.Thread(target=copy_rounds, daemon=True)
    copying.start()
    wait_for(lambda: copiers.commits() >= 6, 180, "the copiers' first commits")

    # Scale up: the user's whole step is this helm upgrade (the operator rolls in place first).
    t0 = time.monotonic()
    release.helm(
        "upgrade", release.name, str(CHART), "--reuse-values", "--set", "broker.replicas=5",
        "--set", "rebalance.autoOnScaleUp=true", "--wait", "--timeout", "600s", timeout=660,
    )  # fmt: skip
    wait_for(lambda: len(release.brokers()) == 5 and all(release.ready(p) for p in release.brokers()), 300,
             "5 broker pods Ready")  # fmt: skip
    up_s = time.monotonic() - t0

    def added() -> list[dict[str, Any]] | None:
        auto = [r for n, r in rebalances(release).items() if n.startswith("auto-add-brokers-")]
        done = auto and all((r.get("status") or {}).get("state") == "Ready" for r in auto)
        held = replicas_by_broker(release)
        return auto if done and held[3] > 0 and held[4] > 0 else None

    auto = wait_for(added, 600, "the automatic rebalance(s) of brokers 3 and 4 done", logs=release.logs)
    moved_s = time.monotonic() - t0
    assert sorted(b for r in auto for b in r["spec"]["brokers"]) == [3, 4], [r["spec"] for r in auto]
    held = replicas_by_broker(release)
    # The new brokers hold data, on their own volumes (describe_log_dirs: their replicas' bytes).
    with Admin(release.bootstrap()) as admin:
        dirs = admin.describe_log_dirs()
    for b in (3, 4):
        assert sum(dirs[b].replica_sizes.values()) > 0, f"broker {b} holds no bytes: {dirs[b]}"
        assert list(release.volume_dir(b).rglob("IDENTITY")), f"no RocksDB on broker {b}'s volume"
    assert copiers.running() or feeder.thread.is_alive()

    # Scale down: drain 3 and 4 first; the rebalance's condition says when they may go.
    t1 = time.monotonic()
    release.apply({
        "apiVersion": "sluice.dev/v1alpha1", "kind": "SluiceRebalance", "metadata": {"name": "drain-3-4"},
        "spec": {"mode": "remove-brokers", "brokers": [3, 4], "autoApprove": True},
    })  # fmt: skip

    def drained() -> dict[str, Any] | None:
        obj = release.get("sluicerebalance", "drain-3-4")
        return obj if condition(obj, "ReadyToScaleDown") == "True" else None

    obj = wait_for(drained, 600, "brokers 3 and 4 drained (ReadyToScaleDown)", logs=release.logs)
    drained_s = time.monotonic() - t1
    assert condition(obj, "BrokersHoldReplicas") == "False"
    assert {3, 4}.isdisjoint(replicas_by_broker(release)), replicas_by_broker(release)
    release.helm(
        "upgrade", release.name, str(CHART), "--reuse-values", "--set", "broker.replicas=3", "--wait",
        "--timeout", "300s", timeout=360,
    )  # fmt: skip
    wait_for(lambda: len(release.brokers()) == 3, 180, "brokers 3 and 4 gone")
    down_s = time.monotonic() - t1
    wait_for(lambda: all_in_sync_on(release, {0, 1, 2}), 240, "every partition in sync on brokers 0-2")
    acked_before = len(feeder.acked)
    wait_for(lambda: len(feeder.acked) >= acked_before + 100, 120, "writes acknowledged after the scale-down")

    feeder.stop.set()
    feeder.thread.join(120)
    stop_copying.set()  # the next round to start copies everything that was written
    copying.join(900)
    assert not copying.is_alive(), f"the copy did not finish\n{copiers.log_tail()}"
    assert all(c == 0 for r in codes for c in r.values()), f"copier rounds ended with {codes}\n{copiers.log_tail()}"
    written = read_committed(release, "grow-in")
    copied = Counter(read_committed(release, "grow-out"))
    lost = [v for v in feeder.acked if v not in set(written)]
    assert lost == [], f"{len(lost)} acknowledged writes lost, e.g. {lost[:5]}"
    assert [v for v, n in copied.items() if n > 1] == [], "duplicates in the copy"
    assert set(copied) == set(written), f"the copy lacks {len(set(written) - set(copied))} records"
    release.replicas_peak = 5
    print(
        f"\nscale 3 -> 5: pods Ready {up_s:.1f} s after helm upgrade, {held[3]} + {held[4]} replicas on brokers 3 "
        f"and 4 after {moved_s:.1f} s ({len(auto)} automatic rebalance(s)); drain of 3 and 4 took {drained_s:.1f} s, "
        f"scale 5 -> 3 done {down_s:.1f} s after it started; {len(feeder.acked)} writes acknowledged "
        f"({feeder.failed} refused), {len(copied)} copied exactly once in {len(codes)} copier round(s)"
    )


def test_helm_uninstall_finishes_on_its_own_and_keeps_the_volumes(release: Release) -> None:
    started = time.monotonic()
    release.helm("uninstall", release.name, "--wait", "--timeout", "180s", timeout=200)
    took = time.monotonic() - started
    assert release.items("coordinators") == []
    wait_for(lambda: release.items("pods") == [], 180, "every pod gone")
    claims = sorted(c["metadata"]["name"] for c in release.items("pvc"))
    # A StatefulSet keeps its claims: the drained brokers' too (a scale-up reuses them).
    assert claims == [f"data-{release.name}-broker-{b}" for b in range(release.replicas_peak)]
    print(f"\nhelm uninstall finished in {took:.1f} s; the {len(claims)} PVCs stay")
