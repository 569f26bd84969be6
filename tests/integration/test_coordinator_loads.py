"""Coordinator loads never stay stuck (issue 13, section 6), on real broker processes.

A broker that becomes leader of a ``__transaction_state`` or
``__consumer_offsets`` partition replays it before it serves the keys of that
partition. While it does, requests get COORDINATOR_LOAD_IN_PROGRESS
(retriable: the client retries by itself); a load that fails is retried with
a back-off for as long as the broker leads the partition; and each load is
measured (``sluice_coordinator_partition_load_seconds``, by partition) with
the partitions counted by load status (``sluice_coordinator_partitions``).

A real broker's load is made to fail or be slow by the runtime's test-only
hooks (``sluice.test.hooks``, inert unless named; see
``sluice.broker.coordination.runtime``): a restart makes the broker load
every partition again, under the hook.
"""

from __future__ import annotations

import time
from pathlib import Path

import grpc

from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.coordination.runtime import HOOK_LOAD_FAIL, HOOK_LOAD_SLOW, HOOK_LOAD_WINDOW_S
from sluice.client import Producer
from sluice.testing import LocalCluster
from sluice.testing.metrics import scrape

from .wire import Wire

PARTITIONS = 2  # internal-topic partitions: each is loaded (and hooked) on its own


def _config(hook: str) -> dict[str, str]:
    return {
        "sluice.test.hooks": hook,
        "transaction.state.log.num.partitions": str(PARTITIONS),
        "offsets.topic.num.partitions": str(PARTITIONS),
    }


def _answers(wire: Wire) -> tuple[tuple[int, str], tuple[int, str]] | None:
    """(InitProducerId's, OffsetFetch's) error code and message; None while the broker is unreachable."""
    try:
        init = wire.stub.InitProducerId(
            bpb.InitProducerIdRequest(transactional_id="load-tx", transaction_timeout_ms=60_000), timeout=2
        )
        fetch = wire.stub.OffsetFetch(bpb.OffsetFetchRequest(group_id="load-group"), timeout=2)
    except grpc.RpcError:
        return None
    return (init.error_code, init.error_message), (fetch.error_code, fetch.error_message)


def _watch_the_load(cluster: LocalCluster, seconds: float) -> list[tuple[tuple[int, str], tuple[int, str]]]:
    """Restart broker 0 (it loads every partition again) and record what it answers meanwhile."""
    cluster.restart(0, wait=False)
    wire = Wire(cluster.address(0))
    seen: list[tuple[tuple[int, str], tuple[int, str]]] = []
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:  # bounded in time; ~20 polls a second at most
            got = _answers(wire)
            if got is not None:
                seen.append(got)
                if got[0][0] == pb.NONE and got[1][0] == pb.NONE:
                    break
            time.sleep(0.05)
    finally:
        wire.close()
    return seen


def _loaded_everything(cluster: LocalCluster) -> dict[str, list[float]]:
    """Load seconds by coordinator, once the broker's metrics show every partition active."""
    url = cluster.metrics_url(0)
    deadline = time.monotonic() + 30
    while True:
        s = scrape(url)
        coordinators = ("transaction", "group")
        active = {c: s.value("sluice_coordinator_partitions", coordinator=c, status="active") for c in coordinators}
        if all(v == PARTITIONS for v in active.values()):
            return {
                c: [v for _labels, v in s.series("sluice_coordinator_partition_load_seconds", coordinator=c)]
                for c in ("transaction", "group")
            }
        assert time.monotonic() < deadline, f"partitions never all active: {active}"
        time.sleep(0.2)


def test_a_failed_load_is_retried_and_answered_load_in_progress_meanwhile(tmp_path: Path) -> None:
    with LocalCluster(brokers=1, data_dir=tmp_path, config=_config(HOOK_LOAD_FAIL)) as cluster:
        seen = _watch_the_load(cluster, seconds=30 + HOOK_LOAD_WINDOW_S)
        assert seen, "the restarted broker never answered"
        # While the load failed, both coordinators said "loading, retrying", never an error of their own ...
        loading = [s for s in seen if s[0][0] == pb.COORDINATOR_LOAD_IN_PROGRESS]
        assert loading, f"no COORDINATOR_LOAD_IN_PROGRESS while the load failed: {seen[:3]}"
        assert any("failed" in s[0][1] and "retrying" in s[0][1] for s in loading), loading[-1]
        assert any(s[1][0] == pb.COORDINATOR_LOAD_IN_PROGRESS and "failed" in s[1][1] for s in seen), seen[-1]
        allowed = {pb.NONE, pb.COORDINATOR_LOAD_IN_PROGRESS, pb.NOT_COORDINATOR, pb.COORDINATOR_NOT_AVAILABLE}
        assert {code for s in seen for code, _m in s} <= allowed, seen
        # ... and the retry loaded it: the broker answers, and a client that met the error got through.
        assert seen[-1][0][0] == pb.NONE and seen[-1][1][0] == pb.NONE, seen[-1]
        loads = _loaded_everything(cluster)
        assert len(loads["transaction"]) == len(loads["group"]) == PARTITIONS
        assert "attempt 2" in cluster.log_tail(0, lines=400) or "attempt 3" in cluster.log_tail(0, lines=400)

        p = Producer(bootstrap_servers=cluster.bootstrap_servers, transactional_id="after-load", linger_ms=0)
        p.init_transactions()
        p.close()


def test_a_slow_load_answers_load_in_progress_and_its_time_is_reported(tmp_path: Path) -> None:
    with LocalCluster(brokers=1, data_dir=tmp_path, config=_config(HOOK_LOAD_SLOW)) as cluster:
        restarted = time.monotonic()
        seen = _watch_the_load(cluster, seconds=30 + HOOK_LOAD_WINDOW_S)
        loading = [s for s in seen if s[0][0] == pb.COORDINATOR_LOAD_IN_PROGRESS]
        assert loading and any(s[1][0] == pb.COORDINATOR_LOAD_IN_PROGRESS for s in seen), seen[:3]
        assert all("failed" not in s[0][1] for s in loading)  # slow, not failing
        assert seen[-1][0][0] == pb.NONE and seen[-1][1][0] == pb.NONE, seen[-1]
        loads = _loaded_everything(cluster)
        # Every partition's load took the hook's wait at least, and the gauge says so.
        for coordinator in ("transaction", "group"):
            assert len(loads[coordinator]) == PARTITIONS
            assert all(HOOK_LOAD_WINDOW_S <= v < time.monotonic() - restarted for v in loads[coordinator]), loads
        p = Producer(bootstrap_servers=cluster.bootstrap_servers, transactional_id="after-slow-load", linger_ms=0)
        p.init_transactions()
        p.close()


def test_a_broker_elected_after_it_started_stays_ready_while_it_loads(tmp_path: Path) -> None:
    """Readiness never waits for an election (on Kubernetes only Ready pods get elected).

    The broker stops; the controller sees it gone and leaves its partitions leaderless (it was
    their last in-sync replica). Restarted while the controller is stopped (so the order is sure),
    it turns ready leading nothing; the controller starts again and elects it, and it
    loads the coordinator partitions (slowly, under the hook) while it stays SERVING; their keys
    answer COORDINATOR_LOAD_IN_PROGRESS meanwhile.
    """
    from sluice.testing import check_health

    with LocalCluster(brokers=1, data_dir=tmp_path, config=_config(HOOK_LOAD_SLOW)) as cluster:
        assert cluster.stop(0) == 0
        deadline = time.monotonic() + 60
        while True:  # the controller noticed: every internal partition waits for a leader
            doc = cluster.topic_document("__transaction_state")
            if doc is not None and all(p["leader"] == -1 for p in doc["partitions"]):
                break
            assert time.monotonic() < deadline, f"the partitions kept their leader: {doc}"
            time.sleep(0.2)
        # No controller (stopped, not paused: a paused one may hold the metadata file's lock) until
        # the broker is ready, so it is ready before it is elected
        assert cluster.controller.stop() == 0
        try:
            cluster.restart(0, wait=False)
            deadline = time.monotonic() + 60
            while check_health(cluster.address(0)) != "SERVING":
                assert time.monotonic() < deadline, "the restarted broker never turned ready"
                time.sleep(0.1)
        finally:
            cluster.controller.start()
        wire = Wire(cluster.address(0))
        statuses, answers = [], []
        until = time.monotonic() + HOOK_LOAD_WINDOW_S + 2
        while time.monotonic() < until:  # the election, then the slow loads
            statuses.append(check_health(cluster.address(0)))
            answers.append(_answers(wire))
            time.sleep(0.1)
        assert set(statuses) == {"SERVING"}, statuses
        assert any(a is not None and a[0][0] == pb.COORDINATOR_LOAD_IN_PROGRESS for a in answers), answers[:3]
        loads = _loaded_everything(cluster)
        assert all(v >= HOOK_LOAD_WINDOW_S for c in ("transaction", "group") for v in loads[c]), loads
