"""The operator's metrics, scraped from a live controller process around a kill -9 (issue 14, item 3).

The embedded cluster's controller runs the same controller loop as the Kubernetes operator, with
the same metrics (sluice.operator.metrics); LocalCluster serves them at
``cluster.controller_metrics_url()``. Three brokers, a topic with replication factor 3: the
leaders per broker the controller exports must equal the leaders the metadata names; after a
kill -9 every partition the dead broker led is one failover, timed from its last healthy answer;
when it returns and takes its preferred leaderships back, that is not a failover. Bounded waits.
"""

from __future__ import annotations

from collections.abc import Callable

from sluice.client import Admin
from sluice.testing import LocalCluster, Scrape, scrape
from tests.support.waiting import wait_for

FAILURE_TIMEOUT_MS = 1000


def leaders_by_metadata(admin: Admin) -> dict[int, int]:
    """Partitions each broker leads, every topic (internal ones too), as Metadata says."""
    counts: dict[int, int] = {}
    for desc in admin.describe_topics(admin.list_topics(include_internal=True)):
        for p in desc.partitions:
            counts[p.leader] = counts.get(p.leader, 0) + 1
    return counts


def leaders_by_operator(m: Scrape) -> dict[int, int]:
    return {int(labels["broker"]): int(v) for labels, v in m.series("sluice_operator_leaders") if v}


def test_operator_metrics_count_a_failover(fresh_cluster: Callable[..., LocalCluster], unique_topic: str) -> None:
    cluster = fresh_cluster(
        brokers=3,
        config={"transaction.state.log.num.partitions": 2, "offsets.topic.num.partitions": 2},
        failure_timeout_ms=FAILURE_TIMEOUT_MS,
    )
    url = cluster.controller_metrics_url()
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    admin.create_topic(unique_topic, partitions=6, replication_factor=3)
    wait_for(
        lambda: leaders_by_operator(scrape(url)) == leaders_by_metadata(admin) and -1 not in leaders_by_metadata(admin),
        timeout=30,
        what="the operator's leaders per broker equal to the metadata's",
    )
    m = scrape(url)
    assert m.value("sluice_operator_offline_partitions") == 0
    assert m.value("sluice_operator_brokers", state="live") == 3
    assert m.value("sluice_operator_brokers", state="dead") == 0
    assert m.total("sluice_operator_reconciliations_total", kind="Leadership", result="success") > 0
    assert m.total("sluice_operator_reconcile_duration_seconds_count", kind="Leadership") > 0
    assert m.total("sluice_operator_failovers_total") == 0
    assert "process_cpu_seconds_total" in m.names()

    # -- kill -9 of the broker that leads partition 0: each partition it led fails over once -------
    victim = cluster.leader(unique_topic, 0)
    led = leaders_by_metadata(admin)[victim]
    cluster.kill(victim)

    def failed_over() -> bool:
        m = scrape(url)
        return (
            m.total("sluice_operator_failovers_total") == led
            and victim not in leaders_by_operator(m)
            and m.value("sluice_operator_brokers", state="dead") == 1
        )

    wait_for(failed_over, timeout=60, what=f"{led} failovers away from broker {victim}")
    m = scrape(url)
    assert m.total("sluice_operator_failover_duration_seconds_count") == led
    # timed from the last healthy answer: at least the failure timeout, at most a minute each
    assert m.total("sluice_operator_failover_duration_seconds_sum") >= led * FAILURE_TIMEOUT_MS / 1000 * 0.9
    assert m.value("sluice_operator_failover_duration_seconds_bucket", le="60.0") == led
    assert m.value("sluice_operator_offline_partitions") == 0
    assert leaders_by_operator(m) == leaders_by_metadata(admin)

    # -- it returns and takes its preferred leaderships back: moves, not failovers -------------------
    cluster.restart(victim)
    wait_for(
        lambda: leaders_by_operator(scrape(url)).get(victim, 0) > 0,
        timeout=90,
        what=f"broker {victim} leading again",
    )
    m = scrape(url)
    assert m.total("sluice_operator_failovers_total") == led
    assert m.value("sluice_operator_brokers", state="dead") == 0
    admin.close()
