"""Partition reassignment (KIP-455) on real brokers with the local controller.

A partition moves to a new broker set while an acks=all producer runs: nothing acknowledged is
lost or duplicated, leadership moves off a removed leader, and the removed replicas delete their
data (read from their RocksDB as a secondary instance, :mod:`sluice.testing.replicas`). Cancel
puts the partition back. A kill -9 of the leader midway does not stop the move. The throttle
(``leader.replication.throttled.rate``) is measured roughly: with R bytes/s and D bytes to move,
the move cannot be done before (D - R) / R seconds (one second's burst), so it is checked to be
still in progress well inside that bound, and finished within a generous one. Every loop and
wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kopf
import pytest

from sluice import errors
from sluice.client import Admin, Producer, TopicPartition
from sluice.metadata import keys, open_store
from sluice.operator.handlers.rebalance import reconcile_rebalance
from sluice.operator.handlers.runtime import OperatorRuntime
from sluice.operator.settings import OperatorSettings
from sluice.testing import LocalCluster
from sluice.testing.replicas import read_replica_logs
from tests.support.waiting import wait_for

from .helpers import checked, cli, read_topic, values

CONFIG = {"min.insync.replicas": "2", "replica.lag.time.max.ms": "2000"}


def _holds(cluster: LocalCluster, broker: int, topic: str, partition: int = 0) -> bool:
    """Whether ``broker``'s RocksDB still holds a copy of the partition."""
    logs = read_replica_logs(sys.executable, broker, cluster.broker(broker).data_path / "rocksdb")
    return any(log.topic == topic and log.partition == partition for log in logs)


class AckedProducer:
    """An acks=all producer in a thread: what was acknowledged, and what failed (bounded count)."""

    def __init__(self, bootstrap: str, topic: str, value_size: int = 16) -> None:
        self.producer = Producer(bootstrap_servers=bootstrap, acks="all", linger_ms=1)
        self.topic = topic
        self.pad = b"x" * value_size
        self.acked: list[bytes] = []
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        for i in range(200_000):
            if self._stop.is_set():
                break
            value = b"m%d-" % i + self.pad
            try:
                self.producer.send(self.topic, value=value).result(timeout=60)
                self.acked.append(value)
            except errors.SluiceError:
                self.failed += 1

    @contextlib.contextmanager
    def running(self) -> Iterator[AckedProducer]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join(90)
            self.producer.close()

    def wait_more(self, n: int, what: str) -> None:
        start = len(self.acked)
        wait_for(lambda: len(self.acked) >= start + n, timeout=60, what=what)


def _replicas(admin: Admin, topic: str) -> tuple[list[int], int, list[int]]:
    p = admin.describe_topic(topic).partitions[0]
    return list(p.replicas), p.leader, list(p.isr)


def _check_nothing_lost(cluster: LocalCluster, topic: str, acked: list[bytes]) -> None:
    got = values(read_topic(cluster.bootstrap_servers, topic))
    assert len(got) == len(set(got)), "duplicates"
    missing = set(acked) - set(got)
    assert not missing, f"{len(missing)} acknowledged records lost"


def test_move_under_acks_all_moves_the_leader_and_deletes_old_replicas(tmp_path: Path) -> None:
    with checked(LocalCluster(brokers=4, data_dir=tmp_path, config=CONFIG, failure_timeout_ms=1000)) as cluster:
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        admin.create_topic("moving", partitions=1, replication_factor=2)
        before, leader, _ = _replicas(admin, "moving")
        target = [b for b in range(4) if b not in before]
        producer = AckedProducer(cluster.bootstrap_servers, "moving")
        with producer.running():
            producer.wait_more(300, "writes before the move")
            result = admin.alter_partition_reassignments({("moving", 0): target})
            assert result == {TopicPartition("moving", 0): None}
            wait_for(
                lambda: not admin.list_partition_reassignments() and _replicas(admin, "moving")[0] == target,
                timeout=90,
                what=f"the move to {target}",
            )
            producer.wait_more(300, "writes after the move")
        replicas, new_leader, isr = _replicas(admin, "moving")
        assert replicas == target and sorted(isr) == sorted(target)
        assert new_leader in target and leader not in target
        _check_nothing_lost(cluster, "moving", producer.acked)
        for old in before:
            wait_for(lambda old=old: not _holds(cluster, old, "moving"), timeout=30, what=f"broker {old} to delete")
        assert all(_holds(cluster, b, "moving") for b in target)
        admin.close()


def test_bad_input_is_refused_as_kafka_classifies_it(tmp_path: Path) -> None:
    with LocalCluster(brokers=3, data_dir=tmp_path, config=CONFIG, failure_timeout_ms=1000) as cluster:
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        admin.create_topic("fixed", partitions=1, replication_factor=2)
        results = admin.alter_partition_reassignments(
            {
                ("nope", 0): [0, 1],
                ("fixed", 5): [0, 1],
                ("fixed", 0): [0, 7],
            }
        )
        assert isinstance(results[TopicPartition("nope", 0)], errors.UnknownTopicOrPartitionError)
        assert isinstance(results[TopicPartition("fixed", 5)], errors.UnknownTopicOrPartitionError)
        assert isinstance(results[TopicPartition("fixed", 0)], errors.InvalidReplicaAssignmentError)
        for bad in ([], [1, 1]):
            refused = admin.alter_partition_reassignments({("fixed", 0): bad})[TopicPartition("fixed", 0)]
            assert isinstance(refused, errors.InvalidReplicaAssignmentError), (bad, refused)
        cancelled = admin.alter_partition_reassignments({("fixed", 0): None})[TopicPartition("fixed", 0)]
        assert isinstance(cancelled, errors.NoReassignmentInProgressError)
        resized = admin.alter_partition_reassignments({("fixed", 0): [0, 1, 2]}, allow_replication_factor_change=False)
        assert isinstance(resized[TopicPartition("fixed", 0)], errors.InvalidReplicationFactorError)
        assert admin.list_partition_reassignments() == {}
        admin.close()


# 256 KiB/s; about 2 MiB to move: at least (2 MiB - 256 KiB) / 256 KiB = 7 s however the bursts fall
THROTTLE = 256 * 1024
DATA_BYTES = 2 * 1024 * 1024


def _fill(bootstrap: str, topic: str, total: int) -> list[bytes]:
    producer = Producer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    sent = [b"%08d" % i + b"y" * 4088 for i in range(total // 4096)]
    futures = [producer.send(topic, value=v) for v in sent]
    for f in futures:
        f.result(timeout=60)
    producer.close()
    return sent


@pytest.mark.parametrize("side", ["leader", "follower"])
def test_throttle_slows_the_move_and_cancel_reverts(tmp_path: Path, side: str) -> None:
    config = {**CONFIG, f"{side}.replication.throttled.rate": str(THROTTLE)}
    with checked(LocalCluster(brokers=3, data_dir=tmp_path, config=config, failure_timeout_ms=1000)) as cluster:
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        admin.create_topic("slow", partitions=1, replication_factor=2)
        before, _, _ = _replicas(admin, "slow")
        spare = next(b for b in range(3) if b not in before)
        sent = _fill(cluster.bootstrap_servers, "slow", DATA_BYTES)

        # A move of one replica to the spare broker: throttled, so still going at 3 s (bound: 7 s).
        target = [before[0], spare]
        started = time.monotonic()
        assert admin.alter_partition_reassignments({("slow", 0): target}) == {TopicPartition("slow", 0): None}
        time.sleep(3.0)
        ongoing = admin.list_partition_reassignments()
        assert TopicPartition("slow", 0) in ongoing, f"done in {time.monotonic() - started:.1f} s despite the throttle"
        assert ongoing[TopicPartition("slow", 0)].adding_replicas == [spare]
        assert ongoing[TopicPartition("slow", 0)].removing_replicas == [before[1]]

        # Cancel: back to the original replicas in their order; the spare drops its partial copy.
        assert admin.alter_partition_reassignments({("slow", 0): None}) == {TopicPartition("slow", 0): None}
        # (another broker's view may be a watch poll behind the one that answered: a bounded wait)
        wait_for(
            lambda: (lambda r: r[0] == before and sorted(r[2]) == sorted(before))(_replicas(admin, "slow")),
            timeout=10,
            what=f"replicas and ISR back to {before}",
        )
        assert admin.list_partition_reassignments() == {}
        wait_for(lambda: not _holds(cluster, spare, "slow"), timeout=30, what="the spare to delete its copy")

        # The same move to the end: it finishes, not faster than the throttle allows.
        started = time.monotonic()
        admin.alter_partition_reassignments({("slow", 0): target})
        wait_for(lambda: not admin.list_partition_reassignments(), timeout=120, what="the throttled move")
        took = time.monotonic() - started
        assert took >= (DATA_BYTES - THROTTLE) / THROTTLE * 0.8, f"moved {DATA_BYTES} bytes in {took:.1f} s"
        assert _replicas(admin, "slow")[0] == target
        _check_nothing_lost(cluster, "slow", sent)
        admin.close()


def _round(ops: OperatorRuntime, obj: dict[str, Any]) -> dict[str, Any]:
    """One round of the SluiceRebalance handler over ``obj``; its status as the API server would keep it."""
    patch = kopf.Patch()
    reconcile_rebalance(obj, patch, ops)
    status = dict(obj.get("status") or {})
    status.update({k: v for k, v in patch.get("status", {}).items()})
    annotations = (patch.get("metadata") or {}).get("annotations") or {}
    obj["metadata"]["annotations"] = {
        k: v for k, v in {**obj["metadata"].get("annotations", {}), **annotations}.items() if v is not None
    }
    obj["status"] = status
    return status


def _throttle_document(cluster: LocalCluster) -> dict[str, Any] | None:
    doc = cluster.metadata.get(keys.REPLICATION_THROTTLE)
    return None if doc is None else doc.value


def test_a_rebalance_states_real_bytes_and_its_throttle_holds_the_brokers_back_while_it_runs(tmp_path: Path) -> None:
    """No broker has a throttle configured: a SluiceRebalance's spec.throttleBytesPerSecond alone
    slows its move (the brokers read the replication_throttle document), and taking it away lets
    the move finish at once. The proposal's bytes are the sizes the brokers report over gRPC."""
    data = 2 * DATA_BYTES  # at 256 KiB/s: at least 14 s, however the bursts and one fetch of debt fall
    with checked(LocalCluster(brokers=3, data_dir=tmp_path, config=CONFIG, failure_timeout_ms=30_000)) as cluster:
        ops = OperatorRuntime(OperatorSettings(namespace="test", metadata_url=str(cluster.metadata_path)),
                              open_store(str(cluster.metadata_path)))  # fmt: skip
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        admin.create_topic("slow", partitions=1, replication_factor=2)
        before, _, _ = _replicas(admin, "slow")
        spare = next(b for b in range(3) if b not in before)
        sent = _fill(cluster.bootstrap_servers, "slow", data)
        logdirs = admin.describe_log_dirs()
        assert sorted(logdirs) == [0, 1, 2] and logdirs[spare].replica_sizes.get(TopicPartition("slow", 0)) is None
        size = logdirs[before[0]].replica_sizes[TopicPartition("slow", 0)]
        assert data <= size < data * 1.1, size  # the stored batches: the values and a little framing

        obj: dict[str, Any] = {
            "metadata": {"name": "drain", "namespace": "test", "generation": 1},
            "spec": {"mode": "remove-brokers", "brokers": [before[1]], "topics": ["slow"], "autoApprove": True,
                     "throttleBytesPerSecond": THROTTLE},
        }  # fmt: skip
        status = _round(ops, obj)  # proposed, approved (autoApprove) and started in one round
        proposal = status["proposal"]
        assert status["state"] == "Rebalancing", status
        assert proposal["bytesToMove"] == size and proposal["balancedBy"] == "bytes", proposal
        assert proposal["brokersWithoutSizes"] == []
        loads = {b["id"]: b for b in proposal["brokers"]}
        assert (loads[before[1]]["bytesBefore"], loads[before[1]]["bytesAfter"]) == (size, 0)
        assert (loads[spare]["bytesBefore"], loads[spare]["bytesAfter"]) == (0, size)
        assert _throttle_document(cluster) == {"rate": THROTTLE, "resource": "test/drain", "updated_ms": ANY_MS}
        started = time.monotonic()
        time.sleep(4.0)
        assert admin.list_partition_reassignments(), f"done in {time.monotonic() - started:.1f} s despite the throttle"
        assert "throttled to 262144 bytes/s" in next(
            c["message"] for c in _round(ops, obj)["conditions"] if c["type"] == "Rebalancing"
        )

        # The throttle taken off the running rebalance: the brokers go back to their configured
        # rates (none), and the rest, about half the data, moves in far less than the 7 s it needs throttled.
        obj["spec"].pop("throttleBytesPerSecond")
        obj["metadata"]["generation"] = 2
        _round(ops, obj)
        assert _throttle_document(cluster) is None
        released = time.monotonic()
        wait_for(lambda: not admin.list_partition_reassignments(), timeout=60, what="the move, unthrottled")
        assert time.monotonic() - released < 4.0, f"the rest took {time.monotonic() - released:.1f} s"
        wait_for(lambda: _round(ops, obj)["state"] == "Ready", timeout=30, what="the rebalance Ready")
        assert _replicas(admin, "slow")[0] == [before[0], spare]
        _check_nothing_lost(cluster, "slow", sent)

        # A broker that does not answer: its partitions' sizes are unknown, the plan is by counts and
        # says whose sizes are missing; no byte is invented.
        admin.create_topic("one", partitions=3, replication_factor=1)  # a partition on each broker
        wait_for(
            lambda: (
                sum(
                    len([tp for tp in d.replica_sizes if tp.topic == "one"]) for d in admin.describe_log_dirs().values()
                )
                == 3
            ),
            timeout=30,
            what="the brokers to open one's partitions",
        )
        cluster.pause(spare)
        try:
            obj = {
                "metadata": {"name": "off-spare", "namespace": "test", "generation": 1},
                "spec": {"mode": "remove-brokers", "brokers": [spare], "topics": ["one"]},
            }
            status = _round(ops, obj)
        finally:
            cluster.resume(spare)
        proposal = status["proposal"]
        assert status["state"] == "ProposalReady" and proposal["replicasToCopy"] == 1, status
        assert proposal["brokersWithoutSizes"] == [spare] and proposal["balancedBy"] == "replicas"
        assert isinstance(proposal["bytesToMove"], str) and f"broker(s) [{spare}]" in proposal["bytesToMove"]
        loads = {b["id"]: b for b in proposal["brokers"]}
        assert "bytesBefore" not in loads[spare]  # it leads a partition of "one": its size is unknown
        assert all("bytesBefore" in loads[b] for b in before)  # theirs are known (a few bytes: "one" is empty)
        assert _throttle_document(cluster) is None
        ops.close()
        admin.close()


class _AnyMs:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, int) and other > 0


ANY_MS: Any = _AnyMs()


def test_leader_killed_midway_the_move_completes(tmp_path: Path) -> None:
    config = {**CONFIG, "leader.replication.throttled.rate": str(THROTTLE)}
    with checked(LocalCluster(brokers=4, data_dir=tmp_path, config=config, failure_timeout_ms=1000)) as cluster:
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        admin.create_topic("failover", partitions=1, replication_factor=2)
        before, leader, _ = _replicas(admin, "failover")
        target = [b for b in range(4) if b not in before]
        sent = _fill(cluster.bootstrap_servers, "failover", DATA_BYTES // 2)
        producer = AckedProducer(cluster.bootstrap_servers, "failover")
        with producer.running():
            producer.wait_more(100, "writes before the move")
            admin.alter_partition_reassignments({("failover", 0): target})
            time.sleep(1.0)
            assert admin.list_partition_reassignments(), "the move finished before the kill"
            cluster.kill(leader)  # kill -9
            wait_for(
                lambda: _replicas(admin, "failover")[1] not in (leader, -1), timeout=30, what="a leader after the kill"
            )
            wait_for(
                lambda: not admin.list_partition_reassignments(), timeout=120, what="the move after the leader died"
            )
            producer.wait_more(100, "writes after the move")
        replicas, new_leader, _ = _replicas(admin, "failover")
        assert replicas == target and new_leader in target
        _check_nothing_lost(cluster, "failover", sent + producer.acked)
        # The killed broker comes back and deletes its copy: the metadata no longer assigns it.
        cluster.restart(leader)
        survivor = next(b for b in before if b != leader)
        wait_for(lambda: not _holds(cluster, leader, "failover"), timeout=30, what="the restarted broker to delete")
        wait_for(lambda: not _holds(cluster, survivor, "failover"), timeout=30, what="the other old replica to delete")
        admin.close()


def test_cli_generate_reassign_wait_list_and_cancel(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = {**CONFIG, "leader.replication.throttled.rate": str(THROTTLE)}
    with LocalCluster(brokers=3, data_dir=tmp_path / "cluster", config=config, failure_timeout_ms=1000) as cluster:
        boot = ["--bootstrap-server", cluster.bootstrap_servers]
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        admin.create_topic("cli", partitions=2, replication_factor=1, config={"min.insync.replicas": "1"})

        code, out, err = cli(capsys, "partitions", "reassign", *boot, "--generate", "--topics", "cli", "--brokers", "2")
        assert code == 0, err
        current, proposed = (json.loads(chunk) for chunk in _json_documents(out))
        assert [p["replicas"] for p in current["partitions"]] == [[0], [1]]
        assert proposed == {
            "version": 1,
            "partitions": [
                {"topic": "cli", "partition": 0, "replicas": [2]},
                {"topic": "cli", "partition": 1, "replicas": [2]},
            ],
        }
        plan = tmp_path / "plan.json"
        plan.write_text(json.dumps(proposed))
        code, _, err = cli(capsys, "partitions", "reassign", *boot, str(plan), "--wait", "--timeout", "60")
        assert code == 0 and "every reassignment finished (2 partition(s))" in err, err
        assert [p.replicas for p in admin.describe_topic("cli").partitions] == [[2], [2]]

        code, _, err = cli(capsys, "partitions", "cancel", *boot, "cli:0")
        assert code == 1 and "NO_REASSIGNMENT_IN_PROGRESS" in err, err
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps({"version": 1, "partitions": [{"topic": "cli", "partition": 0, "replicas": [2, 2]}]}))
        code, _, err = cli(capsys, "partitions", "reassign", *boot, str(bad))
        assert code == 1 and "INVALID_REPLICA_ASSIGNMENT" in err, err

        # a throttled move in progress: listed, then cancelled
        _fill(cluster.bootstrap_servers, "cli", DATA_BYTES)
        back = tmp_path / "back.json"
        back.write_text(json.dumps({"version": 1, "partitions": [{"topic": "cli", "partition": 0, "replicas": [0]}]}))
        assert cli(capsys, "partitions", "reassign", *boot, str(back))[0] == 0
        code, out, _ = cli(capsys, "partitions", "list-reassignments", *boot, "--json")
        assert code == 0 and json.loads(out) == [
            {"topic": "cli", "partition": 0, "replicas": [0, 2], "adding_replicas": [0], "removing_replicas": [2]}
        ]
        code, _, err = cli(capsys, "partitions", "cancel", *boot, "--reassignment-json-file", str(back))
        assert code == 0 and "cancelled the reassignment of cli-0" in err, err
        assert admin.list_partition_reassignments() == {}
        admin.close()


def _json_documents(text: str) -> list[str]:
    """The JSON documents printed one after the other (each starts at a line that is '{')."""
    chunks: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("{"):
            chunks.append([])
        if chunks:
            chunks[-1].append(line)
    return ["\n".join(c) for c in chunks]


def test_controller_killed_midway_the_next_one_completes(tmp_path: Path) -> None:
    """The state is in the metadata: with the controller down the new replica still catches up and
    joins the ISR (the leader's work), and a new controller completes what it finds."""
    config = {**CONFIG, "leader.replication.throttled.rate": str(THROTTLE)}
    with checked(LocalCluster(brokers=3, data_dir=tmp_path, config=config, failure_timeout_ms=1000)) as cluster:
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        admin.create_topic("ctl", partitions=1, replication_factor=2)
        before, _, _ = _replicas(admin, "ctl")
        spare = next(b for b in range(3) if b not in before)
        sent = _fill(cluster.bootstrap_servers, "ctl", DATA_BYTES // 2)
        target = [spare, before[0]]
        admin.alter_partition_reassignments({("ctl", 0): target})
        cluster.controller.kill()  # kill -9
        try:
            wait_for(lambda: spare in _replicas(admin, "ctl")[2], timeout=60, what="the new replica in the ISR")
            time.sleep(1.0)  # no controller: nothing completes it
            assert TopicPartition("ctl", 0) in admin.list_partition_reassignments()
        finally:
            cluster.controller.start()
        wait_for(lambda: not admin.list_partition_reassignments(), timeout=60, what="the new controller to complete")
        assert _replicas(admin, "ctl")[0] == target
        _check_nothing_lost(cluster, "ctl", sent)
        wait_for(lambda: not _holds(cluster, before[1], "ctl"), timeout=30, what="the removed replica to delete")
        admin.close()


def test_transactions_stay_exactly_once_while_data_and_coordinator_partitions_move(tmp_path: Path) -> None:
    """Committed and aborted transactions run while the data partition and the coordinator's own
    ``__transaction_state`` partition (internal topics move too) move to other brokers: every committed
    record is read once with read_committed, nothing aborted is."""
    with checked(LocalCluster(brokers=4, data_dir=tmp_path, config=CONFIG, failure_timeout_ms=1000)) as cluster:
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        admin.create_topic("txn-moving", partitions=1, replication_factor=2)
        txn_id = "mover"
        state = admin.describe_topic("__transaction_state")
        coordinator_partition = zlib.crc32(txn_id.encode()) % len(state.partitions)
        moves: dict[tuple[str, int], list[int]] = {}
        for topic, index in (("txn-moving", 0), ("__transaction_state", coordinator_partition)):
            current = admin.describe_topic(topic).partitions[index].replicas
            spares = [b for b in range(4) if b not in current]
            # the leader (first replica) and as many others as there are spare brokers change places
            moves[(topic, index)] = (spares + current[len(spares) :])[: len(current)]
        producer = Producer(bootstrap_servers=cluster.bootstrap_servers, transactional_id=txn_id, linger_ms=1)
        producer.init_transactions()
        committed: list[bytes] = []
        aborted: list[bytes] = []
        started = False
        deadline = time.monotonic() + 120
        for t in range(400):
            batch = [b"t%d-%d" % (t, i) for i in range(10)]
            producer.begin_transaction()
            for value in batch:
                producer.send("txn-moving", value=value)
            if t % 3 == 2:
                producer.abort_transaction()
                aborted += batch
            else:
                producer.commit_transaction()
                committed += batch
            if t == 20:
                assert all(r is None for r in admin.alter_partition_reassignments(moves).values())
                started = True
            if started and t > 40 and not admin.list_partition_reassignments():
                break
            assert time.monotonic() < deadline, "the moves did not finish while transactions ran"
        producer.close()
        assert not admin.list_partition_reassignments(), "still moving after 400 transactions"
        for (topic, index), target in moves.items():
            assert admin.describe_topic(topic).partitions[index].replicas == target
        got = values(read_topic(cluster.bootstrap_servers, "txn-moving", "read_committed"))
        assert sorted(got) == sorted(committed), "committed records lost or duplicated"
        assert not set(got) & set(aborted)
        admin.close()


def test_new_replica_killed_midway_catches_up_after_restart(tmp_path: Path) -> None:
    """A replica being added dies (kill -9) with a partial copy: the move waits for it (the
    original replicas keep serving, acks=all included) and completes once it is back and caught up."""
    config = {**CONFIG, "leader.replication.throttled.rate": str(THROTTLE)}
    with checked(LocalCluster(brokers=4, data_dir=tmp_path, config=config, failure_timeout_ms=1000)) as cluster:
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        admin.create_topic("newdies", partitions=1, replication_factor=2)
        before, _, _ = _replicas(admin, "newdies")
        target = [b for b in range(4) if b not in before]
        sent = _fill(cluster.bootstrap_servers, "newdies", DATA_BYTES // 2)
        producer = AckedProducer(cluster.bootstrap_servers, "newdies")
        with producer.running():
            admin.alter_partition_reassignments({("newdies", 0): target})
            time.sleep(1.0)
            cluster.kill(target[0])  # kill -9 of a replica being added
            producer.wait_more(100, "acks=all writes on the original replicas meanwhile")
            assert TopicPartition("newdies", 0) in admin.list_partition_reassignments()
            cluster.restart(target[0])
            wait_for(lambda: not admin.list_partition_reassignments(), timeout=120, what="the move after the restart")
            producer.wait_more(100, "writes after the move")
        replicas, leader, isr = _replicas(admin, "newdies")
        assert replicas == target and leader in target and sorted(isr) == sorted(target)
        _check_nothing_lost(cluster, "newdies", sent + producer.acked)
        for old in before:
            wait_for(lambda old=old: not _holds(cluster, old, "newdies"), timeout=30, what=f"broker {old} to delete")
        admin.close()
