"""The control plane partitioned too (issue 30, item 3): brokers cut from the metadata store.

The local metadata store is a SQLite file, which iptables cannot cut, so a broker is cut from it
by the ``metadata.cut`` test hook (:mod:`sluice.metadata.faults`): while ``metadata-cut`` exists in
its data directory, every store call of that broker fails with ``StoreUnavailable``, the error of
an unreachable Kubernetes API server (``LocalCluster.cut_metadata``; the controller can be cut the
same way). Network cuts between processes are iptables rules by process group
(:class:`~sluice.testing.partitions.NetworkPartitions`, with a group-id base of its own so another
suite's partitions on the same machine never touch these processes).

Each test runs the partition soak's workload (:mod:`tests.integration.partition_soak`: three
impatient transactional workers, a live read_committed reader, the offset monitor) on a fresh
3-broker cluster (RF 3, ``min.insync.replicas`` 2), injects its fault, heals it, waits for every
ISR to be whole again, and then the queue checker (every acknowledged commit readable exactly
once, nothing aborted visible, unknown outcomes all or nothing, order, no offset regress, nothing
read live vanished) and the replica consistency check (same offset and epoch, same batch) must
find nothing:

- ``store_leader``: one broker, the leader of a partition, cut from the store for 10-12 s. It keeps
  leading with the metadata it has (no one else changed anything) and must neither lose nor refuse
  more than retriable errors while cut; it reads the store again when the cut heals.
- ``store_isolated``: a leader cut from the store *and* isolated from its followers and the
  controller: the controller elects a new leader that the old one cannot read about. Clients still
  reach the old leader; it must acknowledge nothing (its ISR cannot shrink: the store refuses the
  change, so its HW cannot pass the followers it no longer hears from), and it learns it was
  deposed when the store is back, truncating as a follower.
- ``store_all``: every broker and the controller cut from the store at once for ~10 s: the cluster
  keeps serving on the metadata it has, and nothing is elected meanwhile.

Every wait is bounded in time; every loop in count.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sluice import errors
from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import records_pb2 as pb
from sluice.testing import LocalCluster
from sluice.testing.partitions import NetworkPartitions
from tests.support.waiting import wait_for

from . import partition_soak, queue_workload
from .wire import Wire

GID_BASE = 52000  # not NetworkPartitions' default 47000: other partition suites may run meanwhile
CONFIG = {**partition_soak.CONFIG, "sluice.test.hooks": "metadata.cut"}
TOPIC = partition_soak.TOPIC
TIMING = partition_soak.Timing(hold=(10.0, 12.0), settle=4.0)
PID_PROBES = 1100  # more than a producer-id block (1000): every broker must claim a new one while cut


class ControlPlaneRun(partition_soak.Run):
    """The soak's run with control-plane faults as its schedule (one fault, named by the mode)."""

    def __init__(self, cluster: LocalCluster, net: NetworkPartitions, rng: random.Random) -> None:
        super().__init__(cluster, net, rng, TIMING)
        self.notes: dict[str, Any] = {}

    def schedule(self, mode: str) -> list[Any]:
        return [getattr(self, mode)]

    def store_leader(self) -> None:
        partition, leader = self.some_leader()
        epoch = self.cluster.partition_state(TOPIC, partition)["leader_epoch"]
        self.cluster.cut_metadata(leader)
        self.event(f"b{leader} (leader of {TOPIC}-{partition}) cut from the metadata store")
        self.hold()
        self.cluster.cut_metadata(leader, cut=False)
        self.event(f"b{leader} reaches the metadata store again")
        self.notes.update(cut=[leader], partition=partition, epoch=epoch)

    def store_isolated(self) -> None:
        partition, leader = self.some_leader()
        epoch = self.cluster.partition_state(TOPIC, partition)["leader_epoch"]
        self.cluster.cut_metadata(leader)
        self.net.isolate(self.endpoint(leader), self.endpoints())
        self.event(f"b{leader} (leader of {TOPIC}-{partition}) cut from the store, its followers and the controller")
        state = self.cluster.wait_for_leader_change(TOPIC, partition, after_epoch=epoch, timeout=30)
        self.event(f"b{state['leader']} elected at epoch {state['leader_epoch']}; b{leader} cannot read it")
        self.notes.update(cut=[leader], partition=partition, epoch=epoch, elected=state)
        self.hold()
        self.heal()
        self.cluster.cut_metadata(leader, cut=False)
        self.event(f"b{leader} reaches the metadata store again")

    def store_all(self) -> None:
        brokers = [b.broker_id for b in self.cluster.brokers]
        revision_before = _store_revision(self.cluster)
        for b in brokers:
            self.cluster.cut_metadata(b)
        self.cluster.cut_metadata(None)
        self.event("every broker and the controller cut from the metadata store")
        started = time.monotonic()
        self.notes["probe"] = _probe_cut_brokers(self.cluster)
        self.event(f"probed while cut: {self.notes['probe']['codes']}")
        time.sleep(max(0.0, 10.0 - (time.monotonic() - started)))
        self.notes["writes_during_cut"] = _store_revision(self.cluster) - revision_before
        for b in brokers:
            self.cluster.cut_metadata(b, cut=False)
        self.cluster.cut_metadata(None, cut=False)
        self.event("the metadata store is reachable again")
        self.notes["cut"] = brokers


def _probe_cut_brokers(cluster: LocalCluster) -> dict[str, Any]:
    """While the brokers are cut from the store: what they answer to requests that need it.

    Each broker is asked for producer ids (idempotent InitProducerId) until its block of 1000 is
    used up and it must claim a new one from the store, and to create a topic. Every answer must be
    a success or a retriable Kafka error; the producer ids handed out must all differ.
    """
    codes: Counter[str] = Counter()
    pids: list[int] = []
    for b in cluster.brokers:
        wire = Wire(b.address)
        try:
            for _ in range(PID_PROBES):
                resp = wire.stub.InitProducerId(
                    bpb.InitProducerIdRequest(transaction_timeout_ms=60000, producer_id=-1, producer_epoch=-1),
                    timeout=10,
                )
                codes[f"InitProducerId {pb.ErrorCode.Name(resp.error_code)}"] += 1
                if resp.error_code != pb.NONE:
                    break
                pids.append(resp.producer_id)
            created = wire.stub.CreateTopics(
                bpb.CreateTopicsRequest(
                    topics=[bpb.CreatableTopic(name=f"made-while-cut-{b.broker_id}", num_partitions=1)]
                ),
                timeout=10,
            )
            codes[f"CreateTopics {pb.ErrorCode.Name(created.topics[0].error_code)}"] += 1
        finally:
            wire.close()
    return {"codes": dict(codes), "pids": pids}


def _store_revision(cluster: LocalCluster) -> int:
    """The store's latest revision, read by the test (never cut)."""
    return max((d.revision for d in cluster.metadata.changes_since(0)), default=0)


def _log_mentions(cluster: LocalCluster, broker: int, text: str) -> bool:
    return text in (cluster.data_dir / f"broker-{broker}.log").read_text(errors="replace")


@pytest.mark.parametrize("mode", ["store_leader", "store_isolated", "store_all"])
def test_control_plane_cut(tmp_path: Path, mode: str) -> None:
    seed = 1
    workers: list[queue_workload.QueueProducer] = []
    with NetworkPartitions(tmp_path / "net", gid_base=GID_BASE) as net:
        cluster = LocalCluster(brokers=3, data_dir=tmp_path, config=CONFIG, failure_timeout_ms=1500, python=net.python)
        with cluster:
            run = ControlPlaneRun(cluster, net, random.Random(f"{mode}-{seed}"))
            try:
                details = partition_soak._workload(run, mode, seed, workers)
            finally:
                net.heal()
                for b in cluster.brokers:
                    cluster.cut_metadata(b.broker_id, cut=False)
                cluster.cut_metadata(None, cut=False)
            verdict = details["verdict"]
            print("\n" + verdict.summary(mode))
            for t, what in run.events:
                print(f"  t+{t:5.1f}s {what}")
            print(f"  producer errors: {details['producer_errors']}, restarts: {details['producer_restarts']}")
            assert verdict.committed > 0
            assert verdict.valid, f"{verdict.summary(mode)}\nevents: {run.events}\nnotes: {run.notes}"
            compared = cluster.check_replica_consistency(timeout=60)
            print(f"  replicas consistent: {compared} stored batches compared")
            # the cut really cut: each cut broker saw the store fail and come back
            for b in run.notes["cut"]:
                assert _log_mentions(cluster, b, "metadata store unreachable"), cluster.log_tail(b)
                assert _log_mentions(cluster, b, "metadata store reachable again"), cluster.log_tail(b)
            if mode == "store_all":
                # nobody could write meanwhile (the test's own reads are not writes)
                assert run.notes["writes_during_cut"] == 0, run.notes
                # requests that need the store got a retriable error, never an internal one
                probe = run.notes["probe"]
                for answer in probe["codes"]:
                    code = answer.split()[1]
                    assert code == "NONE" or errors.error_for(pb.ErrorCode.Value(code), "").retriable, probe["codes"]
                assert any(a.startswith("InitProducerId") and not a.endswith("NONE") for a in probe["codes"])
                assert len(set(probe["pids"])) == len(probe["pids"]), "a producer id was handed out twice"
                # and once the store is back, the same requests succeed (a fresh block, fresh ids)
                wire = Wire(cluster.broker(0).address)
                try:
                    pid, _epoch = wire.init_producer_id()
                    assert pid not in probe["pids"]
                finally:
                    wire.close()
                assert "metadata store unreachable" in (cluster.data_dir / "controller.log").read_text()
            if mode == "store_isolated":
                old = run.notes["cut"][0]
                # the deposed leader follows again: it is back in the ISR of the partition it led
                wait_for(
                    lambda: old in cluster.partition_state(TOPIC, run.notes["partition"])["isr"],
                    timeout=60,
                    what="the deposed leader back in the ISR",
                )
