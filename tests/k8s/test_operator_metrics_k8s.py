"""The Kopf operator's metrics on a real API server (issue 14, item 3).

Three broker processes with the Kubernetes MetadataStore and their Pod objects
(tests/k8s/sluice_on_k8s.py), the operator (``sluice operator --metrics-listen``) in a
subprocess, scraped over HTTP: a Topic resource reconciled is counted under kind Topic; a topic
deleted behind the operator's back and recreated by the drift timer is one drift repair (its
creation from the resource was not); the controller's rounds run under the Lease and its
leaders per broker add up to every partition of the cluster.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.client import Admin
from sluice.testing import Scrape, free_port, scrape
from tests.support.k8s_env import KubeCluster

from .crds import install_crds
from .sluice_on_k8s import INTERNAL_PARTITIONS, SluiceOnK8s, wait_for
from .test_operator import V1, condition, topic


@pytest.fixture(scope="module")
def metered(k8s: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SluiceOnK8s, str]]:
    install_crds(k8s)
    namespace = k8s.create_namespace("sluice-metrics")
    cluster = SluiceOnK8s(k8s, namespace, tmp_path_factory.mktemp("sluice-k8s-metrics"))
    url = f"http://127.0.0.1:{free_port('127.0.0.1')}/metrics"
    try:
        k8s.kubectl("apply", "-n", namespace, "-f", str(Path(__file__).parents[2] / "manifests/operator/peering.yaml"))
        cluster.start()
        cluster.start_operator("--metrics-listen", url.removeprefix("http://").removesuffix("/metrics"))
        for kind in ("transaction", "group"):
            cluster.apply(
                {
                    "apiVersion": V1,
                    "kind": "Coordinator",
                    "metadata": {"name": f"{kind}s"},
                    "spec": {"type": kind, "partitions": INTERNAL_PARTITIONS, "replicationFactor": 3},
                }
            )
        yield cluster, url
    finally:
        cluster.close()


def test_the_operator_counts_reconciliations_drift_repairs_and_leaders(metered: tuple[SluiceOnK8s, str]) -> None:
    sluice, url = metered
    sluice.apply(topic("metered", partitions=2, replicationFactor=3))
    wait_for(
        lambda: condition(sluice.get("topics", "metered"), "Ready").get("status") == "True",
        60,
        "Topic metered Ready",
        logs=sluice.logs,
    )

    def counted(m: Scrape) -> bool:
        # the Coordinators' first reconciliation may have been refused while the brokers came up
        # (counted as an error) and succeeds on the retry: wait for both kinds' successes
        return (
            m.total("sluice_operator_reconciliations_total", kind="Topic", result="success") >= 1
            and m.total("sluice_operator_reconciliations_total", kind="Coordinator", result="success") >= 1
        )

    m = wait_for(
        lambda: (lambda s: s if counted(s) else None)(scrape(url)),
        90,
        "Topic and Coordinator reconciliations",
        logs=sluice.logs,
    )
    assert m.total("sluice_operator_reconcile_duration_seconds_count", kind="Topic") >= 1
    assert m.total("sluice_operator_reconciliations_total", kind="Coordinator", result="success") >= 1
    # made because the resource asked for it: a reconciliation, not a drift repair
    assert m.value("sluice_operator_drift_repairs_total", kind="Topic", repair="created") == 0

    # deleted behind the operator's back: the drift timer (every 3 s here) creates it again
    with Admin(sluice.bootstrap_servers) as admin:
        admin.delete_topic("metered")
    wait_for(
        lambda: scrape(url).value("sluice_operator_drift_repairs_total", kind="Topic", repair="created") == 1,
        60,
        "the drift repair counted",
        logs=sluice.logs,
    )
    wait_for(lambda: len(sluice.leaders("metered")) == 2, 30, "topic metered back", logs=sluice.logs)

    # the active controller's view: every partition led, by the three brokers
    def leaders_add_up() -> bool:
        m = scrape(url)
        leaders = {labels["broker"]: v for labels, v in m.series("sluice_operator_leaders") if v}
        return (
            sum(leaders.values()) == 2 + 2 * INTERNAL_PARTITIONS
            and m.value("sluice_operator_offline_partitions") == 0
            and m.value("sluice_operator_brokers", state="live") == 3
            and m.total("sluice_operator_reconciliations_total", kind="Leadership", result="success") > 0
        )

    wait_for(leaders_add_up, 60, "the controller's leaders per broker", logs=sluice.logs)
