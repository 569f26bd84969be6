"""The operator owns the cluster CA and the broker certificates, on the real API server.

The operator (``sluice operator``, a subprocess, certificate management on) creates the CA,
broker and CA-certificate Secrets, renews a broker certificate that is about to expire, and
carries a CA rotation through its phases (trust old + new, re-issue, drop the old) across a
restart of its own process. Three real brokers (tests/k8s/sluice_on_k8s.py) read the broker
Secret as a pod would: the test does what the kubelet does with a Secret volume (files in a
new directory, swapped in atomically through the ``..data`` symlink, mode 0400), and can hold
those updates back, as a slow kubelet would. The brokers reload the files and report what they
loaded; nothing is restarted.
"""

from __future__ import annotations

import base64
import datetime
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sluice import cert_rotation, tls
from sluice.client import Admin, Consumer, Producer, TopicPartition
from sluice.metadata import documents, keys
from sluice.metadata.documents import BrokerDocument
from tests.support.k8s_env import KubeCluster

from .crds import install_crds
from .sluice_on_k8s import SluiceOnK8s, wait_for

CA_SECRET = "sluice-cluster-ca"
BROKER_SECRET = "sluice-broker-certs"
CA_CERT_SECRET = "sluice-cluster-ca-cert"


def project(data: dict[str, bytes], target: Path) -> bool:
    """What the kubelet does with a Secret volume; True when the files changed.

    The keys' files are written into a new hidden directory, ``..data`` is swapped to it with one
    rename (so a reader sees the old set or the new set, never a mix), and each key is a symlink
    through ``..data``.
    """
    target.mkdir(mode=0o700, parents=True, exist_ok=True)
    current = target / "..data"
    if current.exists() and {p.name: p.read_bytes() for p in current.iterdir()} == data:
        return False
    old = os.readlink(current) if current.is_symlink() else None
    fresh = target / f"..{time.time_ns()}"
    fresh.mkdir(mode=0o700)
    for key, value in data.items():
        fd = os.open(fresh / key, os.O_WRONLY | os.O_CREAT, 0o400)
        os.write(fd, value)
        os.close(fd)
    link = target / "..data_tmp"
    os.symlink(fresh.name, link)
    os.replace(link, current)
    for key in data:
        if not (target / key).is_symlink():
            os.symlink(f"..data/{key}", target / key)
    for p in target.iterdir():
        if p.is_symlink() and not p.name.startswith("..") and p.name not in data:
            p.unlink()
    if old is not None:
        for p in (target / old).iterdir():
            p.unlink()
        (target / old).rmdir()
    return True


class Kubelet(threading.Thread):
    """Keeps each broker's directory equal to the Secret, every 0.3 s, unless held back."""

    def __init__(self, read: Callable[[], dict[str, bytes] | None], dirs: dict[int, Path]) -> None:
        super().__init__(daemon=True, name="kubelet")
        self.read = read
        self.dirs = dirs
        self.hold = threading.Event()
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def sync(self) -> None:
        data = self.read()
        if data is not None:
            for d in self.dirs.values():
                project(data, d)

    def run(self) -> None:
        while not self.stop.wait(0.3):
            if self.hold.is_set():
                continue
            try:
                self.sync()
            except BaseException as exc:  # reported by the test
                self.error = exc
                return


def secret(sok: SluiceOnK8s, name: str) -> Any:
    from kubernetes.client.exceptions import ApiException

    try:
        return sok.core.read_namespaced_secret(name, sok.namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def data_of(obj: Any) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in (obj.data or {}).items()}


def reports(sok: SluiceOnK8s) -> dict[int, tuple[frozenset[str], str]]:
    docs = documents.list_documents(sok.store, keys.BROKERS, BrokerDocument)
    return {d.value.broker_id: (frozenset(d.value.tls_trusted), d.value.tls_certificate) for d in docs}


def phase_of(sok: SluiceOnK8s) -> tuple[str, int]:
    ann = secret(sok, CA_SECRET).metadata.annotations or {}
    return ann.get("sluice.dev/ca-phase", ""), int(ann.get("sluice.dev/ca-generation", "-1"))


@pytest.fixture
def sok(k8s: KubeCluster, k8s_namespace: str, tmp_path: Path) -> Iterator[SluiceOnK8s]:
    install_crds(k8s)
    cluster = SluiceOnK8s(k8s, k8s_namespace, tmp_path)
    cluster.env.update(
        SLUICE_BROKER_CERTS_SECRET=BROKER_SECRET,
        SLUICE_CA_SECRET=CA_SECRET,
        SLUICE_CA_CERT_SECRET=CA_CERT_SECRET,
        SLUICE_CERT_INTERVAL_S="1",
    )
    try:
        yield cluster
    finally:
        cluster.close()


def test_operator_creates_renews_and_rotates_certificates(sok: SluiceOnK8s, tmp_path: Path) -> None:
    sok.start_operator()

    # 1. The Secrets, before any broker exists (the operator knows to expect three).
    created = wait_for(
        lambda: secret(sok, BROKER_SECRET) and secret(sok, CA_CERT_SECRET), 90, "the certificate Secrets", logs=sok.logs
    )
    ca_data = data_of(secret(sok, CA_SECRET))
    ca0 = tls.KeyPair(ca_data["ca.crt"], ca_data["ca.key"])
    assert phase_of(sok) == (cert_rotation.READY, 0)
    broker_data = data_of(secret(sok, BROKER_SECRET))
    assert sorted(broker_data) == ["broker-0.crt", "broker-0.key", "broker-1.crt", "broker-1.key", "broker-2.crt",
                                   "broker-2.key", "ca.crt"]  # fmt: skip
    assert broker_data["ca.crt"] == ca0.cert_pem
    for i in range(3):
        pair = tls.KeyPair(broker_data[f"broker-{i}.crt"], broker_data[f"broker-{i}.key"])
        assert pair.common_name == f"sluice-broker-{i}" and tls.signed_by(pair.cert_pem, ca0.cert_pem)
        assert tls.key_matches(pair.cert_pem, pair.key_pem)
    assert data_of(created) == {"ca.crt": ca0.cert_pem}  # the clients' bundle: no key in it
    assert "ca.key" not in broker_data

    # 2. The brokers run on the Secret, mounted (projected) read-only.
    dirs = {i: tmp_path / f"broker-{i}-tls" for i in range(3)}
    kubelet = Kubelet(lambda: (s := secret(sok, BROKER_SECRET)) and data_of(s), dirs)
    kubelet.sync()
    kubelet.start()
    sok.tls_dirs = dirs
    try:
        sok.start()
        pids = {i: p.pid for i, p in sok.brokers.items()}
        fp0 = tls.fingerprint(ca0.cert_pem)
        wait_for(
            lambda: len(reports(sok)) == 3 and all(r[0] == {fp0} for r in reports(sok).values()),
            90,
            "every broker to report its certificate",
            logs=sok.logs,
        )
        admin = Admin(bootstrap_servers=sok.bootstrap_servers)
        admin.create_topic("orders", partitions=1, replication_factor=3)

        # 3. A certificate about to expire is renewed (and broker 1 loads it without a restart).
        short = tls.issue_broker(ca0, 1, validity_days=2)
        sok.core.patch_namespaced_secret(BROKER_SECRET, sok.namespace, {"data": {
            "broker-1.crt": base64.b64encode(short.cert_pem).decode(),
            "broker-1.key": base64.b64encode(short.key_pem).decode(),
        }})  # fmt: skip
        renewed = wait_for(
            lambda: (c := data_of(secret(sok, BROKER_SECRET))["broker-1.crt"]) != short.cert_pem and c,
            90,
            "the expiring certificate renewed",
            logs=sok.logs,
        )
        assert tls.not_after(renewed) > datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=300)
        assert tls.signed_by(renewed, ca0.cert_pem)
        wait_for(
            lambda: reports(sok)[1][1] == tls.fingerprint(renewed),
            90,
            "broker 1 presenting the renewed certificate",
            logs=sok.logs,
        )

        # 4. A CA rotation, the kubelet slow to deliver: the operator waits in TrustNewCa.
        kubelet.hold.set()
        time.sleep(1.0)  # a sync under way when it was set is over
        sok.core.patch_namespaced_secret(
            CA_SECRET, sok.namespace, {"metadata": {"annotations": {"sluice.dev/force-renew": "true"}}}
        )
        wait_for(lambda: phase_of(sok) == (cert_rotation.TRUST_NEW_CA, 1), 90, "the rotation started", logs=sok.logs)
        ca1_cert = data_of(secret(sok, CA_SECRET))["ca.crt"]
        fp1 = tls.fingerprint(ca1_cert)
        wait_for(
            lambda: tls.bundle_fingerprints(data_of(secret(sok, BROKER_SECRET))["ca.crt"]) == [fp0, fp1],
            90,
            "old + new CA in the brokers' Secret",
            logs=sok.logs,
        )
        assert "sluice.dev/force-renew" not in (secret(sok, CA_SECRET).metadata.annotations or {})
        time.sleep(3.0)
        assert phase_of(sok) == (cert_rotation.TRUST_NEW_CA, 1), "moved on before the brokers trusted the new CA"

        # ... and is restarted meanwhile: the new process continues the same rotation.
        sok.stop_operator()
        kubelet.hold.clear()
        wait_for(
            lambda: all(r[0] == {fp0, fp1} for r in reports(sok).values()),
            90,
            "the brokers trusting old + new",
            logs=sok.logs,
        )
        assert phase_of(sok) == (cert_rotation.TRUST_NEW_CA, 1)
        sok.start_operator()
        seen: list[str] = []

        def finished() -> bool:
            phase = phase_of(sok)
            if not seen or seen[-1] != phase[0]:
                seen.append(phase[0])
            return phase == (cert_rotation.READY, 1)

        wait_for(finished, 120, "the rotation to finish", logs=sok.logs)
        order = [
            cert_rotation.TRUST_NEW_CA,
            cert_rotation.REISSUE_CERTS,
            cert_rotation.DROP_OLD_CA,
            cert_rotation.READY,
        ]
        assert [p for p in order if p in seen] == seen, seen  # in order, none repeated, no second rotation

        final = data_of(secret(sok, BROKER_SECRET))
        assert final["ca.crt"] == ca1_cert
        assert data_of(secret(sok, CA_CERT_SECRET)) == {"ca.crt": ca1_cert}
        assert "ca-previous.crt" not in data_of(secret(sok, CA_SECRET))
        for i in range(3):
            assert tls.signed_by(final[f"broker-{i}.crt"], ca1_cert)
        want = {i: (frozenset({fp1}), tls.fingerprint(final[f"broker-{i}.crt"])) for i in range(3)}
        wait_for(lambda: reports(sok) == want, 90, "the brokers trusting the new CA only", logs=sok.logs)
        assert {i: p.pid for i, p in sok.brokers.items()} == pids, "a broker was restarted"
        assert kubelet.error is None, kubelet.error
        wait_for(
            lambda: any("CA rotation to generation 1 complete" in str(e.get("message")) for e in sok.events()),
            90,
            "an Event for the rotation",
            logs=sok.logs,
        )

        # Replication and transactions still run, over the new certificates.
        producer = Producer(bootstrap_servers=sok.bootstrap_servers, acks="all", transactional_id="after-rotation")
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("orders", b"after the rotation")
        producer.commit_transaction()
        producer.close()
        consumer = Consumer(bootstrap_servers=sok.bootstrap_servers, group_id=None, isolation_level="read_committed")
        consumer.assign([TopicPartition("orders", 0)])
        got: list[bytes | None] = []
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            got += [r.value for r in consumer.poll(timeout=0.5)]
        consumer.close()
        assert got == [b"after the rotation"]

        def isr() -> list[int]:
            doc = sok.topic_doc("orders") or {"partitions": [{}]}
            return sorted(doc["partitions"][0].get("isr", []))

        wait_for(lambda: isr() == [0, 1, 2], 90, "a whole ISR", logs=sok.logs)
        admin.close()
    finally:
        kubelet.stop.set()
        kubelet.join(5)


def test_chart_lets_the_operator_own_the_certificates(k8s: KubeCluster) -> None:
    from .test_helm import CHART, find, render

    docs = render(k8s, namespace="prod")
    assert not [d for d in docs if d["kind"] == "Secret"], "Helm made a certificate the operator owns"
    pod = find(docs, "StatefulSet")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "broker-tls")
    assert volume["secret"] == {"secretName": "sluice-broker-certs", "defaultMode": 0o400}
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "broker-tls")
    assert mount["readOnly"] is True
    env = {
        e["name"]: e.get("value") for e in find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["SLUICE_BROKER_CERTS_SECRET"] == "sluice-broker-certs"
    assert env["SLUICE_CA_SECRET"] == "sluice-cluster-ca" and env["SLUICE_CA_CERT_SECRET"] == "sluice-cluster-ca-cert"
    assert (env["SLUICE_CERT_VALIDITY_DAYS"], env["SLUICE_CERT_RENEWAL_DAYS"]) == ("365", "30")
    assert (env["SLUICE_CA_VALIDITY_DAYS"], env["SLUICE_CA_RENEWAL_DAYS"]) == ("1825", "30")
    role = find(docs, "Role", "sluice-operator")
    secrets = [r for r in role["rules"] if r["resources"] == ["secrets"]]
    assert secrets == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "update"],
         "resourceNames": ["sluice-cluster-ca", "sluice-cluster-ca-cert", "sluice-broker-certs"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
    ]  # fmt: skip
    broker_role = find(docs, "Role", "sluice-broker")
    assert not [r for r in broker_role["rules"] if "secrets" in r["resources"]], "brokers need no Secret access"

    helm = render(k8s, "--set", "certificates.managedBy=helm")
    assert find(helm, "Secret", "sluice-broker-tls")
    assert "SLUICE_BROKER_CERTS_SECRET" not in str(find(helm, "Deployment"))
    assert not [r for r in find(helm, "Role", "sluice-operator")["rules"] if r["resources"] == ["secrets"]]

    for args, message in (
        (["--set", "certificates.managedBy=cert-manager"], "certificates.managedBy must be operator or helm"),
        (["--set", "operator.enabled=false"], "certificates.managedBy=operator needs operator.enabled"),
    ):
        result = k8s.helm("template", "x", str(CHART), *args, check=False)
        assert result.returncode != 0 and message in result.stderr, result.stderr
    assert render(k8s, "--set", "operator.enabled=false", "--set", "certificates.managedBy=helm")
