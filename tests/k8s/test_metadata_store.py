"""The MetadataStore contract (tests/metadata_contract.py) on the Kubernetes backend, real API server."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from sluice.metadata import MetadataStore, open_store
from sluice.metadata.kubernetes import KubernetesMetadataStore, KubernetesStoreError, object_name
from tests.metadata_contract import CHECKS
from tests.support.k8s_env import KubeCluster

from .crds import install_crds


@pytest.fixture(scope="module", autouse=True)
def crds(k8s: KubeCluster) -> None:
    install_crds(k8s)


def url(k8s: KubeCluster, namespace: str) -> str:
    return f"kubernetes://{namespace}?kubeconfig={k8s.kubeconfig}"


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_kubernetes_store_contract(
    check: Callable[[Callable[[], MetadataStore]], None], k8s: KubeCluster, k8s_namespace: str
) -> None:
    check(lambda: open_store(url(k8s, k8s_namespace)))


def test_documents_are_readable_objects(k8s: KubeCluster, k8s_namespace: str) -> None:
    store = open_store(url(k8s, k8s_namespace))
    doc = store.compare_and_set("topics/__transaction_state", {"name": "__transaction_state"}, None)
    obj = k8s.kubectl_json("get", "metadatadocument", object_name("topics/__transaction_state"), "-n", k8s_namespace)
    assert obj["spec"] == {"key": "topics/__transaction_state", "value": '{"name": "__transaction_state"}'}
    assert obj["metadata"]["labels"] == {"sluice.dev/prefix": "topics"}  # type: ignore[index]
    assert obj["metadata"]["resourceVersion"] == str(doc.version)  # type: ignore[index]
    # Namespaces are separate clusters.
    other = k8s.create_namespace()
    assert open_store(url(k8s, other)).list("") == []
    store.close()


def test_bad_urls_and_missing_crds_are_clear_errors(k8s: KubeCluster) -> None:
    with pytest.raises(KubernetesStoreError, match="invalid namespace"):
        open_store(f"kubernetes://Not_A_Namespace?kubeconfig={k8s.kubeconfig}")
    with pytest.raises(KubernetesStoreError, match="unknown option"):
        open_store(f"kubernetes://ns?kubeconfig={k8s.kubeconfig}&colour=blue")
    with pytest.raises(KubernetesStoreError, match="cannot load the kubeconfig"):
        open_store("kubernetes://ns?kubeconfig=/nonexistent/kubeconfig")
    assert isinstance(open_store(url(k8s, "default")), KubernetesMetadataStore)


def test_folded_topic_states_are_listed_but_never_watched(k8s: KubeCluster, k8s_namespace: str) -> None:
    """A fold rewrites every ``topic_states/`` document and changes no state: the watch (and so every
    broker's ``changes_since``) leaves them out, LIST still has them, and writing one does not make the
    writer's next ``changes_since`` wait for an event that never comes (read-your-writes)."""
    store = open_store(url(k8s, k8s_namespace))
    assert store.changes_since(0) == []  # the watch is running
    state = store.compare_and_set("topic_states/orders", {"name": "orders", "seq": 3}, None)
    record = store.compare_and_set("partition_changes/000000000004", {"seq": 4}, None)
    started = time.monotonic()
    seen = [d.key for d in store.changes_since(0)]
    assert time.monotonic() - started < 2.0  # waited for the record only (the limit is 5 s)
    assert seen == ["partition_changes/000000000004"]
    assert [d.key for d in store.list("topic_states/")] == ["topic_states/orders"]
    store.delete("topic_states/orders", state.version)
    store.delete(record.key, record.version)
    assert [d.key for d in store.changes_since(record.revision)] == ["partition_changes/000000000004"]  # a tombstone
    # a second store (another broker) starting now: its first LIST leaves them out too
    store.compare_and_set("topic_states/payments", {"name": "payments", "seq": 5}, None)
    other = open_store(url(k8s, k8s_namespace))
    assert all(not d.key.startswith("topic_states/") for d in other.changes_since(0))
    assert [d.key for d in other.list("topic_states/")] == ["topic_states/payments"]
    other.close()
    store.close()
