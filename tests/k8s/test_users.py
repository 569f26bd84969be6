"""SluiceUser resources against the real API server, the real operator and a real broker.

The broker serves a token listener with the authorizer on (deny by default); the operator runs as
``sluice operator`` with its own ServiceAccount token (a super user, as the chart makes it) and
creates the Topic through the brokers like any client. A SluiceUser for the ServiceAccount
``app`` is reconciled into ACLs the broker enforces: the app's producer is refused before the
resource exists, allowed once it is Ready, refused again after a spec change drops the ACL and
after the resource is deleted; an ACL created by hand is left alone throughout. The API server
refuses invalid resources by the CRD's schema; what only the operator can judge gets a clear
status condition; a tls user gets its client certificate from the clients CA.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluice import errors, tls
from sluice.client import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    Admin,
    Producer,
    ResourcePatternType,
    ResourceType,
)
from sluice.metadata import acl_store
from tests.k8s.crds import install_crds
from tests.k8s.sluice_on_k8s import SluiceOnK8s, wait_for
from tests.k8s.tokens import request_token, start_token_cluster, write_token
from tests.support.k8s_env import KubeCluster

CLIENTS_CA_SECRET = "sluice-clients-ca"
PEERING = Path(__file__).resolve().parents[2] / "manifests" / "operator" / "peering.yaml"
PREFIXED_STAR = {"type": "topic", "name": "*", "patternType": "prefixed"}


def user(name: str, account: str | None, *acls: dict[str, Any]) -> dict[str, Any]:
    auth: dict[str, Any] = {"type": "tls"}
    if account is not None:
        auth = {"type": "serviceAccount", "serviceAccount": {"name": account}}
    return {
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": "SluiceUser",
        "metadata": {"name": name},
        "spec": {"authentication": auth, "authorization": {"acls": list(acls)}},
    }


def topic_acl(name: str, *ops: str, **extra: Any) -> dict[str, Any]:
    return {"resource": {"type": "topic", "name": name}, "operations": list(ops), **extra}


@pytest.fixture(scope="module")
def secured(
    k8s: KubeCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[SluiceOnK8s, Path, dict[str, Path]]]:
    """One broker (token listener, authorizer on) and the operator, for the module's tests."""
    install_crds(k8s)
    ns = k8s.create_namespace("sluice-users")
    tmp_path = tmp_path_factory.mktemp("sluice-users")
    k8s.kubectl("apply", "-n", ns, "-f", str(PEERING))
    for account in ("sluice-operator", "app"):
        k8s.kubectl("create", "serviceaccount", account, "-n", ns)
    clients_ca = tls.generate_ca("sluice-clients-ca")
    k8s.kubectl(
        "create", "secret", "tls", CLIENTS_CA_SECRET, "-n", ns,
        f"--cert={_write(tmp_path / 'clients-ca.crt', clients_ca.cert_pem)}",
        f"--key={_write(tmp_path / 'clients-ca.key', clients_ca.key_pem)}",
    )  # fmt: skip
    cluster, ca_file = start_token_cluster(k8s, ns, tmp_path, f"ServiceAccount:{ns}:sluice-operator")
    tokens = {a: write_token(tmp_path, a, request_token(k8s, ns, a)) for a in ("sluice-operator", "app")}
    cluster.env = {
        **cluster.env,
        "SLUICE_BROKER_CA_FILE": str(ca_file),
        "SLUICE_BROKER_TOKEN_FILE": str(tokens["sluice-operator"]),
        "SLUICE_CLIENTS_CA_SECRET": CLIENTS_CA_SECRET,
    }
    try:
        cluster.start_operator()
        yield cluster, ca_file, tokens
    finally:
        cluster.close()
        k8s.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def client_kwargs(cluster: SluiceOnK8s, ca_file: Path, token: Path) -> dict[str, Any]:
    return {
        "bootstrap_servers": cluster.bootstrap_servers,
        "security_protocol": "SASL_SSL",
        "ssl_cafile": str(ca_file),
        "sasl_oauthbearer_token_file": str(token),
    }


def can_produce(kwargs: dict[str, Any]) -> bool:
    try:
        with Producer(**kwargs, request_timeout_ms=10_000, max_block_ms=20_000) as producer:
            producer.send("orders", b"record", partition=0).get(timeout=30)
        return True
    except (errors.TopicAuthorizationFailedError, errors.ClusterAuthorizationFailedError):
        return False


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return {}


def owned_acls(cluster: SluiceOnK8s, owner: str) -> list[AclBinding]:
    return [
        AclBinding.from_json(d.value)
        for d in cluster.store.list("acls/")
        if d.value is not None and d.value.get("owner") == owner
    ]


def test_a_sluice_user_is_reconciled_into_acls_the_broker_enforces(
    k8s: KubeCluster, secured: tuple[SluiceOnK8s, Path, dict[str, Path]]
) -> None:
    cluster, ca_file, tokens = secured
    ns = cluster.namespace
    app = client_kwargs(cluster, ca_file, tokens["app"])
    # The operator is a client of the token listener too: it creates the topic as a super user.
    cluster.apply({"apiVersion": "sluice.dev/v1alpha1", "kind": "Topic", "metadata": {"name": "orders"},
                   "spec": {"partitions": 1, "replicationFactor": 1}})  # fmt: skip
    wait_for(
        lambda: condition(cluster.get("topics", "orders"), "Ready").get("status") == "True",
        60,
        "Topic orders Ready",
        logs=cluster.logs,
    )
    assert not can_produce(app)

    # An ACL made by hand for the same principal, which no SluiceUser owns.
    by_hand = AclBinding(ResourceType.TOPIC, "audit", ResourcePatternType.LITERAL, f"ServiceAccount:{ns}:app", "*",
                         AclOperation.READ, AclPermissionType.ALLOW)  # fmt: skip
    acl_store.create_acl(cluster.store, by_hand)

    cluster.apply(user("app", "app", topic_acl("orders", "Write"), topic_acl("audit", "Describe")))

    def app_ready() -> bool:
        return condition(cluster.get("sluiceusers", "app"), "Ready").get("status") == "True"

    wait_for(app_ready, 60, "SluiceUser app Ready", logs=cluster.logs)
    status = cluster.get("sluiceusers", "app")["status"]
    assert status["principal"] == f"ServiceAccount:{ns}:app" and status["acls"] == 2
    assert not cluster.get("sluiceusers", "app")["metadata"].get("finalizers")  # nothing holds its deletion
    wait_for(lambda: can_produce(app), 60, "the app may produce", logs=cluster.logs)

    # A spec change is a diff: Write on orders dropped, the other ACL kept (not rewritten).
    kept = next(d for d in cluster.store.list("acls/") if d.value and d.value.get("name") == "audit"
                and d.value.get("owner") == f"{ns}/app")  # fmt: skip
    cluster.apply(user("app", "app", topic_acl("audit", "Describe")))
    wait_for(lambda: not can_produce(app), 60, "the Write ACL removed", logs=cluster.logs)
    again = cluster.store.get(kept.key)
    assert again is not None and again.version == kept.version
    assert {(b.name, b.operation) for b in owned_acls(cluster, f"{ns}/app")} == {("audit", AclOperation.DESCRIBE)}

    cluster.apply(user("app", "app", topic_acl("orders", "Write")))
    wait_for(lambda: can_produce(app), 60, "the app may produce again", logs=cluster.logs)
    k8s.kubectl("delete", "sluiceuser", "app", "-n", ns, "--timeout=30s")  # returns at once: no finalizer
    wait_for(lambda: not can_produce(app), 60, "the app refused after the SluiceUser is gone", logs=cluster.logs)
    assert owned_acls(cluster, f"{ns}/app") == []
    assert by_hand in acl_store.list_acls(cluster.store)  # made by hand: left alone
    with Admin(**client_kwargs(cluster, ca_file, tokens["sluice-operator"])) as admin:
        assert by_hand in admin.describe_acls(AclBindingFilter(principal=f"ServiceAccount:{ns}:app"))


def test_invalid_users_are_refused_by_the_api_server_or_get_a_clear_condition(
    k8s: KubeCluster, secured: tuple[SluiceOnK8s, Path, dict[str, Path]]
) -> None:
    cluster, _, _ = secured
    ns = cluster.namespace
    refusals = {
        "a group's operations are All, Read, Delete, Describe": user(
            "bad1", "app", {"resource": {"type": "group", "name": "g"}, "operations": ["Write"]}
        ),
        "prefixed": user("bad2", "app", {**topic_acl("*", "Read"), "resource": PREFIXED_STAR}),
        "the cluster resource is the literal kafka-cluster": user(
            "bad3", "app", {"resource": {"type": "cluster", "name": "mine"}, "operations": ["Create"]}
        ),
        "serviceAccount is given with type serviceAccount": {
            **user("bad4", None),
            "spec": {"authentication": {"type": "serviceAccount"}},
        },
        "Unsupported value": user("bad5", "app", topic_acl("t", "Fly")),
    }
    for message, obj in refusals.items():
        result = k8s.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(obj), check=False)
        assert result.returncode != 0, f"{obj['metadata']['name']} was accepted"
        assert message in result.stderr, result.stderr
    # The certificate's CN would be a broker's: only the operator knows that rule.
    cluster.apply(user("sluice-broker-0", None, topic_acl("t", "Read")))
    wait_for(lambda: condition(cluster.get("sluiceusers", "sluice-broker-0"), "Ready").get("reason")
             == "InvalidSpec", 60, "InvalidSpec", logs=cluster.logs)  # fmt: skip
    ready = condition(cluster.get("sluiceusers", "sluice-broker-0"), "Ready")
    assert ready["status"] == "False" and "cluster's own" in ready["message"]
    assert owned_acls(cluster, f"{ns}/sluice-broker-0") == []


def test_a_tls_user_gets_a_client_certificate_from_the_clients_ca(
    secured: tuple[SluiceOnK8s, Path, dict[str, Path]],
) -> None:
    cluster, _, _ = secured
    ns = cluster.namespace
    cluster.apply(user("alice", None, topic_acl("orders", "Read")))
    wait_for(lambda: condition(cluster.get("sluiceusers", "alice"), "CertificateIssued")
             .get("status") == "True", 60, "CertificateIssued", logs=cluster.logs)  # fmt: skip
    status = cluster.get("sluiceusers", "alice")["status"]
    assert status["principal"] == "User:alice" and status["secret"] == "alice"
    secret = cluster.core.read_namespaced_secret("alice", ns)
    assert sorted(secret.data) == ["ca.crt", "user.crt", "user.key"]  # a clients CA of your own works too
    pair = tls.KeyPair(base64.b64decode(secret.data["user.crt"]), base64.b64decode(secret.data["user.key"]))
    assert pair.common_name == "alice"
    ca = cluster.core.read_namespaced_secret(CLIENTS_CA_SECRET, ns)
    pair.certificate.verify_directly_issued_by(tls.KeyPair(base64.b64decode(ca.data["tls.crt"]), b"").certificate)
    assert secret.metadata.owner_references[0].kind == "SluiceUser"
    assert [b.principal for b in owned_acls(cluster, f"{ns}/alice")] == ["User:alice"]
