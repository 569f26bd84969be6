"""Every broker's Prometheus endpoint, scraped while a real cluster works and fails (issue 14, "Done when").

Three broker processes (replication factor 3, min.insync.replicas 2), a transactional workload, a
transaction left open, a consumer group that lags behind, then a kill -9 and a restart. Every broker is scraped
through ``LocalCluster.metrics_url(i)``; the values asserted are the ones the cluster's own state
(metadata, ListOffsets, the workload) says they must be. Every wait is bounded.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path

from sluice.client import Admin, Consumer, Producer, TopicPartition
from sluice.testing import LocalCluster, Scrape, free_port, scrape
from tests.support.waiting import wait_for

TXN_PARTITIONS = 3
GROUP_PARTITIONS = 3
CONFIG = {
    "transaction.state.log.num.partitions": TXN_PARTITIONS,
    "offsets.topic.num.partitions": GROUP_PARTITIONS,
    "replica.lag.time.max.ms": 2000,  # the ISR drops a killed broker within seconds
}
PARTITIONS = 3
ALL_PARTITIONS = PARTITIONS + TXN_PARTITIONS + GROUP_PARTITIONS


def scrape_all(cluster: LocalCluster, brokers: list[int]) -> dict[int, Scrape]:
    return {i: scrape(cluster.metrics_url(i)) for i in brokers}


def total(scrapes: dict[int, Scrape], name: str, **labels: str) -> float:
    return sum(s.total(name, **labels) for s in scrapes.values())


def holds(check: Callable[[], bool]) -> Callable[[], bool]:
    """``check`` for wait_for, with a broker not answering its metrics yet counted as "not yet"."""

    def run() -> bool:
        try:
            return check()
        except OSError:
            return False

    return run


def test_metrics_of_a_three_broker_cluster(fresh_cluster: Callable[..., LocalCluster], unique_topic: str) -> None:
    cluster = fresh_cluster(brokers=3, config=CONFIG, failure_timeout_ms=1000)
    everyone = [0, 1, 2]
    topic = unique_topic
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    admin.create_topic(topic, partitions=PARTITIONS, replication_factor=3)

    # -- the replica manager's gauges add up over the cluster --------------------------------------
    def replicas_settled() -> bool:
        m = scrape_all(cluster, everyone)
        return (
            total(m, "kafka_server_replicamanager_partitioncount") == 3 * ALL_PARTITIONS
            and total(m, "kafka_server_replicamanager_leadercount") == ALL_PARTITIONS
            and total(m, "kafka_server_replicamanager_underreplicatedpartitions") == 0
        )

    wait_for(holds(replicas_settled), timeout=30, what="every partition led, with a full ISR")
    m = scrape_all(cluster, everyone)
    assert total(m, "kafka_controller_kafkacontroller_offlinepartitionscount") == 0
    assert total(m, "kafka_server_replicamanager_underminisrpartitioncount") == 0
    assert all("sluice_data_volume_free_bytes" in s.names() for s in m.values())

    # -- a transactional workload: 5 transactions of 20 records, committed --------------------------
    producer = Producer(bootstrap_servers=cluster.bootstrap_servers, transactional_id=f"{topic}-copier", linger_ms=0)
    producer.init_transactions()
    for t in range(5):
        producer.begin_transaction()
        for i in range(20):
            producer.send(topic, value=f"{t}-{i}".encode(), partition=i % PARTITIONS)
        producer.commit_transaction()
    producer.close()
    wait_for(
        holds(lambda: total(scrape_all(cluster, everyone), "sluice_transaction_coordinator_commits_total") == 5),
        timeout=30,
        what="5 commits counted",
    )
    m = scrape_all(cluster, everyone)
    assert total(m, "kafka_server_brokertopicmetrics_messagesin_total", topic=topic) == 100
    assert total(m, "sluice_transaction_coordinator_open_transactions") == 0
    produced = total(m, "kafka_network_requestmetrics_requests_total", request="Produce")
    assert produced >= 5
    assert total(m, "kafka_network_requestmetrics_totaltimems_count", request="Produce") == produced
    assert total(m, "sluice_transaction_coordinator_marker_send_seconds_count") == 5

    # -- a transaction left open: counted once, on its coordinator, and its age grows ---------------
    open_id = f"{topic}-open"
    stuck = Producer(
        bootstrap_servers=cluster.bootstrap_servers,
        transactional_id=open_id,
        linger_ms=0,
        transaction_timeout_ms=300_000,
    )
    stuck.init_transactions()
    stuck.begin_transaction()
    for i in range(3):
        stuck.send(topic, value=f"open-{i}".encode(), partition=0)
    stuck.flush()
    txn_coordinator = cluster.leader("__transaction_state", zlib.crc32(open_id.encode()) % TXN_PARTITIONS)
    leader0 = cluster.leader(topic, 0)

    def open_counted() -> bool:
        m = scrape_all(cluster, everyone)
        return (
            total(m, "sluice_transaction_coordinator_open_transactions") == 1
            and m[txn_coordinator].value("sluice_transaction_coordinator_open_transactions") == 1
            # the 3 open records sit between the LSO and the HW of partition 0, on its leader
            and m[leader0].value("kafka_cluster_partition_laststableoffsetlag", topic=topic, partition="0") == 3
        )

    wait_for(holds(open_counted), timeout=30, what="the open transaction counted on its coordinator")
    age = "sluice_transaction_coordinator_oldest_open_transaction_age_seconds"
    first = scrape(cluster.metrics_url(txn_coordinator)).value(age)
    assert first is not None and first >= 0
    time.sleep(1.5)
    second = scrape(cluster.metrics_url(txn_coordinator)).value(age)
    assert second is not None and second >= first + 1.0, (first, second)

    # -- a lagging group: lag = end offset (HW) - committed, exported by its coordinator only --------
    group = f"{topic}-lagging"
    consumer = Consumer(bootstrap_servers=cluster.bootstrap_servers, group_id=group)
    consumer.subscribe([topic])
    read: list[object] = []
    deadline = time.monotonic() + 30
    while len(read) < 10 and time.monotonic() < deadline:
        read.extend(consumer.poll(timeout=0.5))
    assert len(read) >= 10
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    committed = {tp: 4 for tp in consumer.assignment()}
    assert committed, "the consumer was assigned no partition"
    consumer.commit(committed)
    watcher = Consumer(bootstrap_servers=cluster.bootstrap_servers, isolation_level="read_uncommitted")
    ends = watcher.end_offsets(tps)  # ListOffsets(latest, read_uncommitted): the high watermarks
    watcher.close()
    group_coordinator = cluster.leader("__consumer_offsets", zlib.crc32(group.encode()) % GROUP_PARTITIONS)

    def lag_exported() -> bool:
        m = scrape_all(cluster, everyone)
        exporters = [i for i, s in m.items() if s.series("kafka_consumergroup_current_offset", consumergroup=group)]
        if exporters != [group_coordinator]:
            return False
        s = m[group_coordinator]
        for tp, offset in committed.items():
            labels = {"consumergroup": group, "topic": topic, "partition": str(tp.partition)}
            if s.value("kafka_consumergroup_current_offset", **labels) != offset:
                return False
            if s.value("kafka_consumergroup_lag", **labels) != ends[tp] - offset:
                return False
        return s.value("kafka_consumergroup_members", consumergroup=group) == 1

    wait_for(holds(lag_exported), timeout=30, what="the group's lag exported by its coordinator")
    consumer.close()

    # -- kill -9 of a broker: every partition it held is under-replicated, reported by its leader ---
    victim = 2
    live = [0, 1]
    cluster.kill(victim)

    def under_replicated() -> bool:
        m = scrape_all(cluster, live)
        return (
            total(m, "kafka_server_replicamanager_underreplicatedpartitions") == ALL_PARTITIONS
            and total(m, "kafka_server_replicamanager_leadercount") == ALL_PARTITIONS
            # two in-sync replicas left of three: at min.insync.replicas=2, not under it
            and total(m, "kafka_server_replicamanager_atminisrpartitioncount") == ALL_PARTITIONS
            and total(m, "kafka_server_replicamanager_underminisrpartitioncount") == 0
        )

    wait_for(holds(under_replicated), timeout=60, what="every partition under-replicated after the kill")
    m = scrape_all(cluster, live)
    # The controller took the dead broker out of the ISRs itself; brokers count only their own shrinks.
    assert all("kafka_server_replicamanager_isrshrinks_total" in s.names() for s in m.values())
    assert total(m, "kafka_controller_kafkacontroller_offlinepartitionscount") == 0
    # ... and the operator (the controller process) saw it die, moved its leaderships, none offline
    wait_for(
        holds(lambda: scrape(cluster.controller_metrics_url()).value("sluice_operator_brokers", state="dead") == 1),
        timeout=30,
        what="the operator counting the dead broker",
    )
    operator = scrape(cluster.controller_metrics_url())
    assert operator.value("sluice_operator_offline_partitions") == 0
    assert operator.total("sluice_operator_failovers_total") == operator.total(
        "sluice_operator_failover_duration_seconds_count"
    )
    assert not operator.series("sluice_operator_leaders", broker=str(victim))
    leaders = sum(v for _labels, v in operator.series("sluice_operator_leaders"))
    assert leaders == total(m, "kafka_server_replicamanager_leadercount") == ALL_PARTITIONS

    # -- the broker comes back: the leaders take it into their ISRs again, and count it --------------
    cluster.restart(victim)

    def caught_up() -> bool:
        m = scrape_all(cluster, everyone)
        return (
            total(m, "kafka_server_replicamanager_underreplicatedpartitions") == 0
            and total(m, "kafka_server_replicamanager_isrexpands_total") > 0
        )

    wait_for(holds(caught_up), timeout=60, what="every ISR full again after the restart")
    stuck.close()
    admin.close()


def test_a_metrics_port_in_use_stops_the_broker_with_a_message(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        result = subprocess.run(
            [
                sys.executable, "-m", "sluice.broker", "--id", "0",
                "--listen", f"127.0.0.1:{free_port()}", "--data", str(tmp_path / "data"),
                "--metrics-listen", f"127.0.0.1:{taken}",
            ],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert result.returncode != 0
    assert f"cannot serve metrics on 127.0.0.1:{taken}" in result.stderr
    assert "Traceback" not in result.stderr
