"""The clients CA on the real API server: the operator's, a tls SluiceUser's Secret, an mtls broker.

The operator (``sluice operator``, a subprocess) owns the certificates as the chart runs it with
``broker.clientAuth.listener=mtls``: the cluster CA and the broker certificates, the clients CA
(``sluice-clients-ca``, its certificate alone in ``sluice-clients-ca-cert``) and its own client
certificate (CN ``sluice-operator``, a super user). One real broker process runs
``--client-listener mtls --clients-ca FILE`` with the authorizer on; the test does what the kubelet
would do with the Secret volumes (tests/k8s/test_certificates.py, ``Kubelet``): the brokers' Secret,
the clients CA certificate, and the operator's own files, which it reads to create the Topic
through the broker. A SluiceUser of type tls gets the Secret named after it (``user.crt``,
``user.key``, ``ca.crt``), and a Producer and a Consumer made from those three files are that user
and nothing more: its ACLs decide, another tls user is refused, a client without a certificate gets
no answer. A renewed certificate works (and the old one until it expires), deleting the user deletes
the Secret, and bad inputs are refused by the API server or with a clear condition.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from sluice import cert_rotation, errors, tls
from sluice.client import Admin, Consumer
from sluice.metadata import documents, keys
from sluice.metadata.documents import BrokerDocument
from tests.k8s.crds import install_crds
from tests.k8s.sluice_on_k8s import SluiceOnK8s, wait_for
from tests.k8s.test_certificates import Kubelet, data_of, secret
from tests.k8s.test_users import can_produce
from tests.k8s.tokens import ONE_BROKER
from tests.support.k8s_env import KubeCluster

PEERING = Path(__file__).resolve().parents[2] / "manifests" / "operator" / "peering.yaml"
SECRETS = {
    "SLUICE_BROKER_CERTS_SECRET": "sluice-broker-certs",
    "SLUICE_CA_SECRET": "sluice-cluster-ca",
    "SLUICE_CA_CERT_SECRET": "sluice-cluster-ca-cert",
    "SLUICE_CLIENTS_CA_SECRET": "sluice-clients-ca",
    "SLUICE_CLIENTS_CA_CERT_SECRET": "sluice-clients-ca-cert",
    "SLUICE_OPERATOR_CLIENT_SECRET": "sluice-operator-client",
}


def user(name: str, *acls: dict[str, Any], kind: str = "tls") -> dict[str, Any]:
    return {
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": "SluiceUser",
        "metadata": {"name": name},
        "spec": {"authentication": {"type": kind}, "authorization": {"acls": list(acls)}},
    }


def acl(kind: str, name: str, *ops: str) -> dict[str, Any]:
    return {"resource": {"type": kind, "name": name}, "operations": list(ops)}


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return {}


def files_of(sok: SluiceOnK8s, name: str, directory: Path) -> dict[str, Any]:
    """The user's Secret as a pod would mount it, and the client settings made from it."""
    directory.mkdir(parents=True, exist_ok=True)
    for key, value in data_of(secret(sok, name)).items():
        (directory / key).write_bytes(value)
    return {
        "bootstrap_servers": sok.bootstrap_servers,
        "security_protocol": "SSL",
        "ssl_cafile": str(directory / "ca.crt"),
        "ssl_certfile": str(directory / "user.crt"),
        "ssl_keyfile": str(directory / "user.key"),
    }


@pytest.fixture(scope="module")
def mtls(k8s: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SluiceOnK8s, Path]]:
    """The operator owning every certificate and one mtls broker with the authorizer on."""
    install_crds(k8s)
    ns = k8s.create_namespace("sluice-clients-ca")
    tmp = tmp_path_factory.mktemp("sluice-clients-ca")
    k8s.kubectl("apply", "-n", ns, "-f", str(PEERING))
    sok = SluiceOnK8s(k8s, ns, tmp, brokers=1)
    mounts = {  # Secret -> the directory a pod would mount it at
        SECRETS["SLUICE_BROKER_CERTS_SECRET"]: tmp / "broker-tls",
        SECRETS["SLUICE_CLIENTS_CA_CERT_SECRET"]: tmp / "clients-ca",
        SECRETS["SLUICE_CA_CERT_SECRET"]: tmp / "operator-ca",
        SECRETS["SLUICE_OPERATOR_CLIENT_SECRET"]: tmp / "operator-client",
    }
    sok.env.update(
        SECRETS,
        SLUICE_CERT_INTERVAL_S="1",
        SLUICE_BROKER_CA_FILE=str(mounts[SECRETS["SLUICE_CA_CERT_SECRET"]] / "ca.crt"),
        SLUICE_BROKER_CERT_FILE=str(mounts[SECRETS["SLUICE_OPERATOR_CLIENT_SECRET"]] / "tls.crt"),
        SLUICE_BROKER_KEY_FILE=str(mounts[SECRETS["SLUICE_OPERATOR_CLIENT_SECRET"]] / "tls.key"),
    )
    kubelets: list[Kubelet] = []
    try:
        sok.start_operator()
        wait_for(lambda: all(secret(sok, name) for name in mounts), 90, "the operator's Secrets", logs=sok.logs)
        for name, directory in mounts.items():
            kubelet = Kubelet(lambda name=name: (s := secret(sok, name)) and data_of(s), {0: directory})
            kubelet.sync()
            kubelet.start()
            kubelets.append(kubelet)
        sok.tls_dirs = {0: mounts[SECRETS["SLUICE_BROKER_CERTS_SECRET"]]}
        clients_ca_file = mounts[SECRETS["SLUICE_CLIENTS_CA_CERT_SECRET"]] / "ca.crt"
        sok.broker_args = ["--client-listener", "mtls", "--clients-ca", str(clients_ca_file)]
        own = mounts[SECRETS["SLUICE_OPERATOR_CLIENT_SECRET"]]
        sok.health_credentials = grpc.ssl_channel_credentials(
            (mounts[SECRETS["SLUICE_CA_CERT_SECRET"]] / "ca.crt").read_bytes(),
            (own / "tls.key").read_bytes(),
            (own / "tls.crt").read_bytes(),
        )
        sok.start({**ONE_BROKER, "authorizer.enabled": "true", "super.users": "User:sluice-operator"})
        yield sok, tmp
    finally:
        for kubelet in kubelets:
            kubelet.stop.set()
        sok.close()
        k8s.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)


def test_the_operator_owns_a_clients_ca_apart_from_the_cluster_ca(mtls: tuple[SluiceOnK8s, Path]) -> None:
    sok, _ = mtls
    ca_secret = secret(sok, SECRETS["SLUICE_CLIENTS_CA_SECRET"])
    data = data_of(ca_secret)
    clients_ca = tls.KeyPair(data["ca.crt"], data["ca.key"])
    assert clients_ca.common_name == "sluice-clients-ca v0"
    assert (ca_secret.metadata.annotations or {})["sluice.dev/ca-phase"] == cert_rotation.READY
    cluster_ca = data_of(secret(sok, SECRETS["SLUICE_CA_SECRET"]))["ca.crt"]
    assert tls.fingerprint(cluster_ca) != tls.fingerprint(clients_ca.cert_pem)
    # the brokers' file: the certificate alone, never the key
    assert data_of(secret(sok, SECRETS["SLUICE_CLIENTS_CA_CERT_SECRET"])) == {"ca.crt": clients_ca.cert_pem}
    own = data_of(secret(sok, SECRETS["SLUICE_OPERATOR_CLIENT_SECRET"]))
    pair = tls.KeyPair(own["tls.crt"], own["tls.key"])
    assert pair.common_name == "sluice-operator" and tls.signed_by(pair.cert_pem, clients_ca.cert_pem)
    # the broker reports the clients CA it loaded (what a clients CA rotation waits for)
    fp = tls.fingerprint(clients_ca.cert_pem)
    wait_for(lambda: [
        d.value.tls_clients_trusted for d in documents.list_documents(sok.store, keys.BROKERS, BrokerDocument)
    ] == [(fp,)], 90, "the broker reporting the clients CA", logs=sok.logs)  # fmt: skip


def test_a_tls_user_connects_with_its_secret_as_itself(k8s: KubeCluster, mtls: tuple[SluiceOnK8s, Path]) -> None:
    sok, tmp = mtls
    # The operator is a client of the mtls listener too, with its own certificate (a super user).
    sok.apply({"apiVersion": "sluice.dev/v1alpha1", "kind": "Topic", "metadata": {"name": "orders"},
               "spec": {"partitions": 1, "replicationFactor": 1}})  # fmt: skip
    wait_for(
        lambda: condition(sok.get("topics", "orders"), "Ready").get("status") == "True",
        90,
        "Topic orders Ready",
        logs=sok.logs,
    )
    readers = {"resource": {"type": "group", "name": "alice-", "patternType": "prefixed"}, "operations": ["Read"]}
    sok.apply(user("alice", acl("topic", "orders", "Read", "Write"), readers))
    sok.apply(user("bob", acl("topic", "audit", "Read")))
    for name in ("alice", "bob"):
        wait_for(lambda name=name: condition(sok.get("sluiceusers", name),
                 "CertificateIssued").get("status") == "True", 90, f"{name}'s certificate", logs=sok.logs)  # fmt: skip
    status = sok.get("sluiceusers", "alice")["status"]
    assert status["principal"] == "User:alice" and status["secret"] == "alice"
    assert "Secret alice (user.crt, user.key, ca.crt)" in condition(sok.get("sluiceusers", "alice"),
                                                                    "CertificateIssued")["message"]  # fmt: skip
    alice_secret = secret(sok, "alice")
    data = data_of(alice_secret)
    assert sorted(data) == ["ca.crt", "user.crt", "user.key"]
    assert data["ca.crt"] == data_of(secret(sok, SECRETS["SLUICE_CA_CERT_SECRET"]))["ca.crt"]  # verifies brokers
    pair = tls.KeyPair(data["user.crt"], data["user.key"])
    clients_ca = data_of(secret(sok, SECRETS["SLUICE_CLIENTS_CA_SECRET"]))["ca.crt"]
    assert pair.common_name == "alice" and tls.signed_by(pair.cert_pem, clients_ca)
    owner = alice_secret.metadata.owner_references[0]
    assert (owner.kind, owner.name, owner.uid) == (
        "SluiceUser",
        "alice",
        sok.get("sluiceusers", "alice")["metadata"]["uid"],
    )

    alice = files_of(sok, "alice", tmp / "alice")
    wait_for(lambda: can_produce(alice), 90, "alice may produce", logs=sok.logs)

    def consume(group: str) -> list[bytes | None]:
        consumer = Consumer(**alice, group_id=group, auto_offset_reset="earliest")
        try:
            consumer.subscribe(["orders"])
            got: list[bytes | None] = []
            for _ in range(60):
                got += [r.value for r in consumer.poll(timeout=0.5)]
                if got:
                    return got
            return got
        finally:
            consumer.close()

    assert set(consume("alice-readers")) == {b"record"}
    with pytest.raises(errors.GroupAuthorizationFailedError):  # her ACLs, nothing more
        consume("someone-else")
    bob = files_of(sok, "bob", tmp / "bob")
    assert not can_produce(bob)  # User:bob: authenticated, not authorized

    # No certificate, or a certificate from another CA with alice's name: no answer at all.
    stranger = tls.issue(tls.generate_ca("sluice-clients-ca v0"), "alice")
    (tmp / "stranger.crt").write_bytes(stranger.cert_pem)
    (tmp / "stranger.key").write_bytes(stranger.key_pem)
    attempts = {
        "no certificate": {k: v for k, v in alice.items() if k not in ("ssl_certfile", "ssl_keyfile")},
        "another CA": {**alice, "ssl_certfile": str(tmp / "stranger.crt"), "ssl_keyfile": str(tmp / "stranger.key")},
    }
    for what, kwargs in attempts.items():
        with Admin(**kwargs, request_timeout_ms=3000) as admin:
            with pytest.raises(errors.SluiceError) as info:
                admin.list_topics(timeout=5)
            assert info.value.retriable, what  # unreachable as far as the client can tell


def test_a_renewed_certificate_keeps_working_and_the_secret_goes_with_the_user(
    k8s: KubeCluster, mtls: tuple[SluiceOnK8s, Path]
) -> None:
    sok, tmp = mtls
    ns = sok.namespace
    sok.apply(user("carol", acl("topic", "orders", "Write")))
    wait_for(lambda: secret(sok, "carol"), 90, "carol's certificate", logs=sok.logs)
    old = files_of(sok, "carol", tmp / "carol-old")
    wait_for(lambda: can_produce(old), 90, "carol may produce", logs=sok.logs)
    before = data_of(secret(sok, "carol"))["user.crt"]

    # Renewal (here asked for by hand; due renewals and a rotated clients CA take the same path).
    k8s.kubectl("annotate", "secret", "carol", "-n", ns, "sluice.dev/force-renew=true")
    renewed = wait_for(lambda: (c := data_of(secret(sok, "carol"))["user.crt"]) != before
                       and c, 90, "the renewed certificate", logs=sok.logs)  # fmt: skip
    assert tls.KeyPair(renewed, b"").common_name == "carol"
    assert "sluice.dev/force-renew" not in (secret(sok, "carol").metadata.annotations or {})
    new = files_of(sok, "carol", tmp / "carol-new")
    assert can_produce(new)
    assert can_produce(old)  # the old certificate is still valid until it expires

    # Deleting the user deletes its Secret (the operator does it; no garbage collector runs here)
    # and its ACLs.
    k8s.kubectl("delete", "sluiceuser", "carol", "-n", ns, "--timeout=30s")
    wait_for(lambda: secret(sok, "carol") is None, 90, "carol's Secret deleted", logs=sok.logs)
    wait_for(lambda: not can_produce(new), 90, "carol refused", logs=sok.logs)


def test_bad_inputs_are_refused_with_a_clear_error_or_condition(
    k8s: KubeCluster, mtls: tuple[SluiceOnK8s, Path]
) -> None:
    sok, _ = mtls
    ns = sok.namespace
    result = k8s.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(user("dave", kind="scram-sha-512")),
                         check=False)  # fmt: skip
    assert result.returncode != 0 and 'Unsupported value: "scram-sha-512"' in result.stderr, result.stderr
    assert "serviceAccount" in result.stderr and "tls" in result.stderr  # the error names the known types

    # The operator's own name would be a super user's certificate.
    sok.apply(user("sluice-operator", acl("topic", "orders", "Read")))
    wait_for(lambda: condition(sok.get("sluiceusers", "sluice-operator"), "Ready").get("reason")
             == "InvalidSpec", 90, "InvalidSpec", logs=sok.logs)  # fmt: skip
    assert "cluster's own" in condition(sok.get("sluiceusers", "sluice-operator"), "Ready")["message"]
    assert secret(sok, "sluice-operator") is None

    # A Secret of that name that is not the user's is never overwritten.
    k8s.kubectl("create", "secret", "generic", "erin", "-n", ns, "--from-literal=password=hunter2")
    sok.apply(user("erin", acl("topic", "orders", "Read")))
    wait_for(lambda: condition(sok.get("sluiceusers", "erin"), "CertificateIssued").get("reason")
             == "SecretConflict", 90, "SecretConflict", logs=sok.logs)  # fmt: skip
    assert data_of(secret(sok, "erin")) == {"password": b"hunter2"}
    # its ACLs are still applied (a certificate made elsewhere may carry the name)
    assert condition(sok.get("sluiceusers", "erin"), "Ready")["status"] == "True"
    k8s.kubectl("delete", "sluiceuser", "erin", "-n", ns, "--timeout=30s")
    time.sleep(2)
    assert data_of(secret(sok, "erin")) == {"password": b"hunter2"}  # not the user's: not deleted with it


def test_a_clients_ca_rotation_reissues_user_certificates_and_keeps_the_old_ones_working(
    k8s: KubeCluster, mtls: tuple[SluiceOnK8s, Path]
) -> None:
    sok, tmp = mtls
    ns = sok.namespace
    ca_name = SECRETS["SLUICE_CLIENTS_CA_SECRET"]
    sok.apply(user("frank", acl("topic", "orders", "Write")))
    wait_for(lambda: secret(sok, "frank"), 90, "frank's certificate", logs=sok.logs)
    old = files_of(sok, "frank", tmp / "frank-old")
    wait_for(lambda: can_produce(old), 90, "frank may produce", logs=sok.logs)
    ca0 = data_of(secret(sok, ca_name))["ca.crt"]

    k8s.kubectl("annotate", "secret", ca_name, "-n", ns, "sluice.dev/force-renew=true")

    def phase() -> tuple[str, str]:
        ann = secret(sok, ca_name).metadata.annotations or {}
        return ann.get("sluice.dev/ca-phase", ""), ann.get("sluice.dev/ca-generation", "")

    # TrustNewCa until the broker reloaded a bundle of both; then users are re-issued by the new CA,
    # and the old CA stays trusted until it expires (clients may not have picked up their new files).
    wait_for(lambda: phase() == (cert_rotation.REISSUE_CERTS, "1"), 90, "phase ReissueCerts", logs=sok.logs)
    ca1 = data_of(secret(sok, ca_name))["ca.crt"]
    assert tls.KeyPair(ca1, b"").common_name == "sluice-clients-ca v1"
    trusted = {tls.fingerprint(ca0), tls.fingerprint(ca1)}
    assert {d.value.broker_id: set(d.value.tls_clients_trusted)
            for d in documents.list_documents(sok.store, keys.BROKERS, BrokerDocument)} == {0: trusted}  # fmt: skip
    reissued = wait_for(
        lambda: tls.signed_by(c := data_of(secret(sok, "frank"))["user.crt"], ca1) and c,
        90,
        "frank's certificate from the new CA",
        logs=sok.logs,
    )
    assert tls.KeyPair(reissued, b"").common_name == "frank"
    new = files_of(sok, "frank", tmp / "frank-new")
    assert can_produce(new)
    assert can_produce(old)
    # The operator's own certificate moved to the new CA too, and it still works the brokers.
    wait_for(
        lambda: tls.signed_by(data_of(secret(sok, SECRETS["SLUICE_OPERATOR_CLIENT_SECRET"]))["tls.crt"], ca1),
        90,
        "the operator's certificate from the new CA",
        logs=sok.logs,
    )
    sok.apply({"apiVersion": "sluice.dev/v1alpha1", "kind": "Topic", "metadata": {"name": "after-rotation"},
               "spec": {"partitions": 1, "replicationFactor": 1}})  # fmt: skip
    wait_for(lambda: condition(sok.get("topics", "after-rotation"), "Ready")
             .get("status") == "True", 90, "Topic after-rotation Ready", logs=sok.logs)  # fmt: skip
    assert phase() == (cert_rotation.REISSUE_CERTS, "1")  # until the old CA expires
