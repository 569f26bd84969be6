"""The CRDs on a real API server: installed, defaults applied, bad objects refused by the server itself.

Every refusal here comes from kube-apiserver (OpenAPI schema, CEL x-kubernetes-validations,
the ValidatingAdmissionPolicy of manifests/policies/): no operator runs in these tests.
"""

from __future__ import annotations

import json

import pytest

from sluice.testing._net import poll_until
from tests.support.k8s_env import KubeCluster

from .crds import POLICY_DIR, install_crds


@pytest.fixture(scope="module", autouse=True)
def crds(k8s: KubeCluster) -> None:
    install_crds(k8s)


def create(k8s: KubeCluster, ns: str, obj: dict[str, object]) -> tuple[int, str]:
    proc = k8s.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(obj), check=False)
    return proc.returncode, proc.stderr


def topic(name: str, **spec: object) -> dict[str, object]:
    return {"apiVersion": "sluice.dev/v1alpha1", "kind": "Topic", "metadata": {"name": name}, "spec": spec}


def test_a_topic_gets_its_defaults_and_printer_columns(k8s: KubeCluster, k8s_namespace: str) -> None:
    code, err = create(k8s, k8s_namespace, topic("orders", config={"retention.ms": "86400000"}))
    assert code == 0, err
    got = k8s.kubectl_json("get", "topic", "orders", "-n", k8s_namespace)
    assert got["spec"] == {"partitions": 1, "replicationFactor": 3, "config": {"retention.ms": "86400000"}}
    table = k8s.kubectl("get", "topics", "-n", k8s_namespace).stdout.splitlines()
    assert table[0].split() == ["NAME", "PARTITIONS", "REPLICATION", "READY", "AGE"]
    assert table[1].split()[:3] == ["orders", "1", "3"]
    # Upper case and '_' (not allowed in object names) go through spec.topicName.
    code, err = create(k8s, k8s_namespace, topic("orders-v2", topicName="Orders_V2", partitions=6))
    assert code == 0, err


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"topicName": "bad name!"}, "should match '^[a-zA-Z0-9._-]+$'"),
        ({"topicName": "."}, "a topic cannot be named '.' or '..'"),
        ({"topicName": ".."}, "a topic cannot be named '.' or '..'"),
        ({"topicName": "__consumer_offsets"}, "reserved for internal topics"),
        ({"topicName": "x" * 250}, "Too long: may not be more than 249"),
        ({"partitions": 0}, "should be greater than or equal to 1"),
        ({"partitions": 10001}, "should be less than or equal to 10000"),
        ({"replicationFactor": 0}, "should be greater than or equal to 1"),
        ({"config": {"cleanup.policy": "forever"}}, "cleanup.policy is delete, compact or compact,delete"),
        ({"config": {"min.insync.replicas": "zero"}}, "min.insync.replicas is a positive integer"),
        ({"partitions": "three"}, 'spec.partitions: Invalid value: "string"'),
    ],
)
def test_invalid_topics_are_refused_by_the_api_server(
    k8s: KubeCluster, k8s_namespace: str, spec: dict[str, object], expected: str
) -> None:
    code, err = create(k8s, k8s_namespace, topic("bad", **spec))
    assert code != 0
    assert expected in err, err
    assert k8s.kubectl("get", "topic", "bad", "-n", k8s_namespace, check=False).returncode != 0  # nothing stored


def test_missing_spec_and_names_invalid_as_topics(k8s: KubeCluster, k8s_namespace: str) -> None:
    code, err = create(
        k8s, k8s_namespace, {"apiVersion": "sluice.dev/v1alpha1", "kind": "Topic", "metadata": {"name": "x"}}
    )
    assert code != 0 and "spec: Required value" in err, err
    code, err = create(k8s, k8s_namespace, topic("__hidden"))
    assert code != 0  # an object name cannot even start with '_'
    code, err = create(k8s, k8s_namespace, topic("a" * 250))
    assert code != 0 and "at most 249 characters" in err, err


def test_partitions_may_not_decrease_and_the_topic_name_is_immutable(k8s: KubeCluster, k8s_namespace: str) -> None:
    code, err = create(k8s, k8s_namespace, topic("events", topicName="Events", partitions=3))
    assert code == 0, err
    ns = ["-n", k8s_namespace, "--type=merge"]
    shrink = k8s.kubectl("patch", "topic", "events", *ns, "-p", '{"spec":{"partitions":2}}', check=False)
    assert shrink.returncode != 0 and "partitions may not decrease" in shrink.stderr, shrink.stderr
    rename = k8s.kubectl("patch", "topic", "events", *ns, "-p", '{"spec":{"topicName":"Other"}}', check=False)
    assert rename.returncode != 0 and "spec.topicName is immutable" in rename.stderr, rename.stderr
    unset = k8s.kubectl("patch", "topic", "events", *ns, "-p", '{"spec":{"topicName":null}}', check=False)
    assert unset.returncode != 0 and "cannot be added or removed" in unset.stderr, unset.stderr
    grow = k8s.kubectl("patch", "topic", "events", *ns, "-p", '{"spec":{"partitions":5}}')
    assert grow.returncode == 0
    assert k8s.kubectl_json("get", "topic", "events", "-n", k8s_namespace)["spec"]["partitions"] == 5  # type: ignore[index]


def test_coordinators(k8s: KubeCluster, k8s_namespace: str) -> None:
    def coordinator(name: str, **spec: object) -> dict[str, object]:
        return {"apiVersion": "sluice.dev/v1alpha1", "kind": "Coordinator", "metadata": {"name": name}, "spec": spec}

    code, err = create(k8s, k8s_namespace, coordinator("transactions", type="transaction"))
    assert code == 0, err
    got = k8s.kubectl_json("get", "coordinator", "transactions", "-n", k8s_namespace)
    assert got["spec"] == {"type": "transaction", "partitions": 50, "replicationFactor": 3}
    code, err = create(k8s, k8s_namespace, coordinator("bad", type="election"))
    assert code != 0 and 'Unsupported value: "election"' in err, err
    code, err = create(k8s, k8s_namespace, coordinator("bad", partitions=5))
    assert code != 0 and "spec.type: Required value" in err, err
    patch = k8s.kubectl(
        "patch",
        "coordinator",
        "transactions",
        "-n",
        k8s_namespace,
        "--type=merge",
        "-p",
        '{"spec":{"partitions":10}}',
        check=False,
    )
    assert patch.returncode != 0 and "would move every id to another coordinator" in patch.stderr, patch.stderr


def test_transactional_ids(k8s: KubeCluster, k8s_namespace: str) -> None:
    def txn_id(name: str, **spec: object) -> dict[str, object]:
        return {
            "apiVersion": "sluice.dev/v1alpha1",
            "kind": "TransactionalId",
            "metadata": {"name": name},
            "spec": spec,
        }

    code, err = create(
        k8s, k8s_namespace,
        txn_id("copier-0", transactionalId="copier-0", transactionTimeoutMs=60000,
               allowedServiceAccounts=[f"{k8s_namespace}/copier"]),
    )  # fmt: skip
    assert code == 0, err
    table = k8s.kubectl("get", "transactionalids", "-n", k8s_namespace).stdout.splitlines()
    assert table[0].split() == ["NAME", "STATE", "PRODUCERID", "EPOCH", "COORDINATOR", "AGE"]
    code, err = create(k8s, k8s_namespace, txn_id("no-id"))
    assert code != 0 and "spec.transactionalId: Required value" in err, err
    code, err = create(
        k8s, k8s_namespace, txn_id("bad-op", transactionalId="x", operation={"type": "explode", "requestId": "1"})
    )
    assert code != 0 and 'Unsupported value: "explode"' in err, err
    code, err = create(k8s, k8s_namespace, txn_id("no-request", transactionalId="x", operation={"type": "fence"}))
    assert code != 0 and "spec.operation.requestId: Required value" in err, err
    code, err = create(k8s, k8s_namespace, txn_id("bad-sa", transactionalId="x", allowedServiceAccounts=["Not Valid"]))
    assert code != 0 and "allowedServiceAccounts[0]" in err, err
    change = k8s.kubectl(
        "patch", "transactionalid", "copier-0", "-n", k8s_namespace, "--type=merge",
        "-p", '{"spec":{"transactionalId":"other"}}', check=False,
    )  # fmt: skip
    assert change.returncode != 0 and "spec.transactionalId is immutable" in change.stderr


def test_replication_factor_above_the_broker_count_is_refused_by_the_admission_policy(
    k8s: KubeCluster, k8s_namespace: str
) -> None:
    """CEL in a CRD sees one object; the broker count comes from the ConfigMap the operator keeps."""
    k8s.kubectl("apply", "-f", str(POLICY_DIR))
    # No ConfigMap yet: admitted (the operator reports the problem as a condition instead).
    code, err = create(k8s, k8s_namespace, topic("early", replicationFactor=5))
    assert code == 0, err
    k8s.kubectl("create", "configmap", "sluice-cluster", "-n", k8s_namespace, "--from-literal=brokers=2")

    def refused() -> bool:
        code, err = create(k8s, k8s_namespace, topic("too-wide", replicationFactor=3))
        if code == 0:
            k8s.kubectl("delete", "topic", "too-wide", "-n", k8s_namespace)
        return code != 0 and "spec.replicationFactor 3 exceeds the 2 broker(s)" in err

    # The API server compiles a new policy and its binding within moments; bounded wait.
    assert poll_until(refused, timeout=30, interval=0.5), "the admission policy never refused replicationFactor 3"
    code, err = create(k8s, k8s_namespace, topic("fits", replicationFactor=2))
    assert code == 0, err
    code, err = create(
        k8s, k8s_namespace,
        {"apiVersion": "sluice.dev/v1alpha1", "kind": "Coordinator", "metadata": {"name": "groups"},
         "spec": {"type": "group", "replicationFactor": 3}},
    )  # fmt: skip
    assert code != 0 and "exceeds the 2 broker(s)" in err, err


def rebalance(name: str, **spec: object) -> dict[str, object]:
    return {"apiVersion": "sluice.dev/v1alpha1", "kind": "SluiceRebalance", "metadata": {"name": name}, "spec": spec}


def test_a_rebalance_gets_its_defaults_and_printer_columns(k8s: KubeCluster, k8s_namespace: str) -> None:
    code, err = create(k8s, k8s_namespace, rebalance("even"))
    assert code == 0, err
    got = k8s.kubectl_json("get", "sluicerebalance", "even", "-n", k8s_namespace)
    assert got["spec"] == {"mode": "full", "autoApprove": False, "maxPartitionsInFlight": 10}
    code, err = create(k8s, k8s_namespace, rebalance("grow", mode="add-brokers", brokers=[3, 4], topics=["orders"]))
    assert code == 0, err
    table = k8s.kubectl("get", "srb", "-n", k8s_namespace).stdout.splitlines()
    assert table[0].split() == ["NAME", "MODE", "STATE", "MOVED", "TOTAL", "AGE"]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            {"mode": "full", "brokers": [1]},
            "spec.brokers is given with mode add-brokers or remove-brokers, and only then",
        ),
        ({"mode": "remove-brokers"}, "spec.brokers is given with mode add-brokers or remove-brokers, and only then"),
        ({"mode": "add-brokers", "brokers": []}, "and only then"),
        ({"mode": "shuffle"}, 'Unsupported value: "shuffle"'),
        ({"mode": "remove-brokers", "brokers": [-1]}, "should be greater than or equal to 0"),
        ({"mode": "remove-brokers", "brokers": [1, 1]}, "Duplicate value"),
        ({"maxPartitionsInFlight": 0}, "should be greater than or equal to 1"),
        ({"throttleBytesPerSecond": 0}, "spec.throttleBytesPerSecond: Invalid value"),
        ({"throttleBytesPerSecond": "10MB"}, "spec.throttleBytesPerSecond: Invalid value"),
    ],
)
def test_invalid_rebalances_are_refused_by_the_api_server(
    k8s: KubeCluster, k8s_namespace: str, spec: dict[str, object], expected: str
) -> None:
    code, err = create(k8s, k8s_namespace, rebalance("bad", **spec))
    assert code != 0
    assert expected in err, err
