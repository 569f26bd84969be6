"""What one broker failure costs the metadata path, on the real API server: a budget that fails when it grows.

A small version of bench/metadata_scale.py (issue 28): the real controller
(:class:`sluice.operator.controller.kubernetes.KubernetesController`) over a counting store
(:class:`bench.metadata_scale.CountingStore`), simulated brokers with Pods and watch streams, two
real ClusterViews; one broker is killed (Pod NotReady, stream cut) and comes back. The test
fails when the writes or the bytes of a failover grow beyond what today's design costs (partition
states as change records), so a change that makes them worse is seen, and a change that makes them
better lowers the bounds.
"""

from __future__ import annotations

from pathlib import Path

from bench.metadata_scale import Settings, Simulation
from tests.support.k8s_env import KubeCluster

BROKERS = 6
TOPICS = 4
PARTITIONS = 30  # RF 3 over 6 brokers: every topic has partitions on every broker

# Today's figures (2026-11-29, this shape: 6 brokers, 4 topics x 30 partitions, RF 3; partition
# states as change records, sluice.metadata.topic_view). The kill: the controller writes one record
# with every topic's elections and ISR fencing, and the controller document twice (the broker
# NotReady: no longer live; then dead after the grace period): 3 writes carrying 6.7 KB. Each
# broker's watch then carries those 3 events: 9.5 KB at most. History: with whole topic documents
# the kill was 6 writes (one per topic) of 9.6 KB, and 12 to 15 KB of watch per broker. Bounds: the
# writes exactly (a second record, say elections and fencing split over two rounds, or a write per
# topic, is the regression this catches); bytes at 2x today's, since JSON varies with epochs.
KILL_MAX_CONTROLLER_WRITES = 1 + 2
KILL_MAX_CONTROLLER_BYTES = 2 * 6_716
KILL_MAX_WATCH_BYTES_PER_BROKER = 2 * 9_494
# The return: every leader asks the controller to add the broker back to the ISRs it leads, all
# leaders at once, each one write of its own isr_requests/<id> document with all its changes
# (ClusterView.request_isrs); the controller writes one record with every leader's changes. History:
# one write per partition by the leaders took 110 replace calls, 49 of them 409s, 211 KB of watch per
# broker; one write per leader and topic document, 6 and 7 409s, 80 KB; requests to the controller
# (2026-11-29): no 409, 46 KB per broker; with records (the same day): no 409, 34 KB at most (the
# returning broker's relist; the others far less), 6 writes by the brokers (5 leaders' request
# documents and the registration). Bounds: a few 409s (a conflict storm fails); watch bytes at 2x
# today's per broker; one request write per leader and pass.
RETURN_MAX_409 = 2
RETURN_MAX_WATCH_BYTES_PER_BROKER = 2 * 34_346
RETURN_MAX_BROKER_WRITES = BROKERS
# The controller's part of the return: one record with the leaders' re-admissions (two if their
# requests straddle two rounds), one with every preferred leadership handed back at once, and the
# controller document (the broker live). Today: 3 (with whole documents it was 9: 4 + 4 + 1). A
# record per topic, per request or per preferred leader fails. A write may meet another writer's (a
# conflict, counted as a write by the counting store, then one more try next round): bounded
# separately.
RETURN_MAX_CONTROLLER_WRITES_LANDED = 2 + 1 + 1
RETURN_MAX_CONTROLLER_CONFLICTS = 2
# The controller's reads (issue 28's fixes, 2026-11-28): its rounds read brokers/ and the controller
# document from the watch cache, not a quorum GET and LIST per 100 ms round (each ~3 s window had 34
# GETs and 32 LISTs; now 2 GETs in the kill, read-modify-writes of the controller document, and 1 in
# the return). Bound: 10 per window, so a quorum read per round (30 or more) fails.
MAX_CONTROLLER_READS = 10
# The status projection and the Events' owner lookup find Topics in an index and GET them by name:
# no LIST of every Topic per change (the kill's window had 5 LISTs: one per Event and the
# projection's); the index is LISTed at start-up, so none in these windows.
MAX_TOPIC_LISTS = 0


def test_a_broker_failure_and_return_stay_within_todays_cost(k8s: KubeCluster, tmp_path: Path) -> None:
    settings = Settings(
        brokers=BROKERS,
        topics=TOPICS,
        partitions=PARTITIONS,
        replication_factor=3,
        churn_rates=[],
        churn_seconds=0,
        observers=2,
        grace_s=1.0,
        preferred_delay_s=1.0,
        scenarios=["kill", "return"],
        budget_s=240,
        session_timeout_s=0.0,  # the Pods' path (NotReady at once), the one these bounds were measured on
    )
    sim = Simulation(settings, tmp_path, plane=k8s)
    try:
        results = sim.run()
    finally:
        sim.close()
    kill, back = results["scenarios"]
    print(kill, back, sep="\n")
    assert kill["completed"] and back["completed"], (kill, back)
    assert kill["watchers_missing_final_state"] == 0 and back["watchers_missing_final_state"] == 0
    assert kill["controller_store"]["writes"] <= KILL_MAX_CONTROLLER_WRITES, kill["controller_store"]
    assert kill["controller_store"]["bytes_written"] <= KILL_MAX_CONTROLLER_BYTES, kill["controller_store"]
    assert kill["watch"]["bytes_per_broker_max"] <= KILL_MAX_WATCH_BYTES_PER_BROKER, kill["watch"]
    assert back["server"]["conflicts_409"] <= RETURN_MAX_409, back["server"]
    assert back["watch"]["bytes_per_broker_max"] <= RETURN_MAX_WATCH_BYTES_PER_BROKER, back["watch"]
    assert back["brokers_store"]["writes"] <= RETURN_MAX_BROKER_WRITES, back["brokers_store"]
    landed = back["controller_store"]["writes"] - back["controller_store"]["conflicts"]
    assert landed <= RETURN_MAX_CONTROLLER_WRITES_LANDED, back["controller_store"]
    assert back["controller_store"]["conflicts"] <= RETURN_MAX_CONTROLLER_CONFLICTS, back["controller_store"]
    for window in (kill, back):
        calls = window["controller_store"]["calls"]
        assert calls.get("get", 0) + calls.get("list", 0) <= MAX_CONTROLLER_READS, window["controller_store"]
        lists = window["server"]["requests_by_verb_resource"].get("LIST topics", 0)
        assert lists <= MAX_TOPIC_LISTS, window["server"]["requests_by_verb_resource"]
