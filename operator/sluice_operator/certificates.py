"""The operator owns the cluster CA, the broker certificates and the clients CA: Secrets, renewal, rotation.

Three Secrets in the cluster's namespace (names from the settings, the chart's by default):

=====================  ==========================================================  ==============
Secret                 data                                                        read by
=====================  ==========================================================  ==============
CA (``ca_secret``)     ``ca.crt``, ``ca.key`` (the signing CA); ``ca-previous.crt``  the operator
                       during a rotation. Annotations: ``sluice.dev/ca-generation``,
                       ``sluice.dev/ca-phase``; ``sluice.dev/force-renew: "true"``
                       (set by hand) rotates the CA now.
broker certificates    ``ca.crt`` (the trust bundle: old + new during an overlap),  the brokers
(``broker_secret``)    ``broker-<id>.crt``/``.key`` for every broker id;            (mounted read-only)
                       ``sluice.dev/force-renew: "true"`` re-issues them all now.
CA certificate         ``ca.crt``: the same trust bundle, without any key           clients (tls listeners)
(``ca_cert_secret``)
=====================  ==========================================================  ==============

and, when it owns the clients CA too (``SLUICE_CLIENTS_CA_CERT_SECRET`` set), three more:

=====================  ==========================================================  ==============
clients CA             as the CA Secret: ``ca.crt``, ``ca.key``, ``ca-previous.crt``;  the operator
(``clients_ca``)       the same annotations (``force-renew`` rotates it)              (signs users)
clients CA certificate ``ca.crt``: the clients CA's certificate (old + new during a   the brokers'
(``clients_ca_cert``)  rotation), no key                                             ``--clients-ca``
operator client        ``tls.crt``, ``tls.key``: CN ``sluice-operator`` (a super    the operator
(``operator_client``)  user), from the clients CA: its own identity on an mtls      (mounted)
                       client listener
=====================  ==========================================================  ==============

The clients CA's steps are :func:`sluice.cert_rotation.reconcile_clients_ca`'s: the same phases
and state as the cluster CA's, the brokers' reports being the clients CAs they trust
(``tls_clients_trusted``). The users' certificates are the SluiceUser handler's
(:mod:`sluice.operator.user_certificates`), signed by whatever CA this Secret holds.

The decisions are :func:`sluice.cert_rotation.reconcile`'s (the same as a LocalCluster's): this
module only reads the Secrets and the brokers' reports (their ``brokers/<id>`` documents say
which CAs they trust and which certificate they present, see sluice.broker.security.reload),
and writes what a step says, each write a compare-and-set on the Secret's resourceVersion, the
CA Secret before the others. The phase of a CA rotation lives in the CA Secret's annotations,
so an operator that restarts (or another replica that takes over) continues where it was.

Brokers reload the mounted files (the kubelet updates a Secret volume in place within about a
minute), so nothing is restarted: a phase moves on when every live broker reported the previous
one. It runs as a thread of the operator (:mod:`sluice.operator.handlers.certificates`), in the
replica that holds the controller's Lease, every ``interval_s`` while nothing is under way and
every second while a step waits for the brokers.
"""

from __future__ import annotations

import base64
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sluice import cert_rotation, tls
from sluice.metadata import documents, keys
from sluice.metadata.documents import BrokerDocument, ControllerDocument
from sluice.metadata.store import MetadataStore

log = logging.getLogger("sluice.operator.certificates")

ANNOTATION_GENERATION = "sluice.dev/ca-generation"
ANNOTATION_PHASE = "sluice.dev/ca-phase"
ANNOTATION_FORCE_RENEW = "sluice.dev/force-renew"
CA_KEY = "ca.key"
CA_PREVIOUS = "ca-previous.crt"
MAX_STEPS = 10  # per reconcile: creating everything takes 2; a step that waits ends the round
WAITING_INTERVAL_S = 1.0
OPERATOR_CN = "sluice-operator"  # the operator's client certificate on an mtls listener (a super user)


@dataclass(frozen=True)
class SecretNames:
    ca: str
    brokers: str
    ca_cert: str = ""
    clients_ca: str = ""  # with clients_ca_cert: the operator owns the clients CA
    clients_ca_cert: str = ""
    operator_client: str = ""  # the operator's own client certificate (an mtls client listener)

    @property
    def owns_clients_ca(self) -> bool:
        return bool(self.clients_ca and self.clients_ca_cert)


class Conflict(Exception):
    """A Secret changed under us (409) or was created meanwhile: read again."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _data(secret: Any) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}


def _annotations(secret: Any) -> dict[str, str]:
    return dict(secret.metadata.annotations or {})


def _forced(annotations: Mapping[str, str]) -> bool:
    return annotations.get(ANNOTATION_FORCE_RENEW, "").lower() == "true"


class SecretStore:
    """The three Secrets through the API server (CoreV1Api), each write a compare-and-set."""

    def __init__(self, core: Any, namespace: str, names: SecretNames, labels: Mapping[str, str] | None = None) -> None:
        self.core = core
        self.namespace = namespace
        self.names = names
        self.labels = dict(
            labels or {"app.kubernetes.io/name": "sluice", "app.kubernetes.io/managed-by": "sluice-operator"}
        )
        self._versions: dict[str, str | None] = {}
        # labels and annotations as last read: kept on every write (others' too), ours updated
        self._meta: dict[str, tuple[dict[str, str], dict[str, str]]] = {}
        self._broker_data: dict[str, bytes] = {}  # as last read: entries of ids not asked for are kept
        self._ca_cert_bundle: bytes | None = None

    def _read(self, name: str) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            secret = self.core.read_namespaced_secret(name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                self._versions[name] = None
                return None
            raise
        self._versions[name] = secret.metadata.resource_version
        self._meta[name] = (dict(secret.metadata.labels or {}), _annotations(secret))
        return secret

    def _write(self, name: str, data: Mapping[str, bytes], annotations: Mapping[str, str | None]) -> None:
        """Create or replace ``name`` at the resourceVersion last read (Conflict if it moved).

        ``annotations`` are set over the ones read (None removes one); sluice.dev/force-renew is
        always removed, since every write acts on it.
        """
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        version = self._versions.get(name)
        labels, current = self._meta.get(name, ({}, {})) if version is not None else ({}, {})
        merged = {**current, **annotations, ANNOTATION_FORCE_RENEW: None}
        body = client.V1Secret(
            metadata=client.V1ObjectMeta(
                name=name,
                namespace=self.namespace,
                labels={**labels, **self.labels},
                annotations={k: v for k, v in merged.items() if v is not None},
                resource_version=version,
            ),
            type="Opaque",
            data={k: _b64(v) for k, v in data.items()},
        )
        try:
            if version is None:
                done = self.core.create_namespaced_secret(self.namespace, body)
            else:
                done = self.core.replace_namespaced_secret(name, self.namespace, body)
        except ApiException as exc:
            if exc.status in (404, 409):
                raise Conflict(f"Secret {name} changed meanwhile") from None
            raise
        self._versions[name] = done.metadata.resource_version

    def read(self, broker_ids: list[int]) -> tuple[cert_rotation.ClusterCa | None, cert_rotation.BrokerCerts | None]:
        ca = self._read_ca(self.names.ca)
        broker_secret = self._read(self.names.brokers)
        brokers = None
        self._broker_data = {}
        if broker_secret is not None:
            data = _data(broker_secret)
            certs = {}
            for i in broker_ids:
                crt, key = data.get(tls.broker_cert_file(i)), data.get(tls.broker_key_file(i))
                if crt and key:
                    certs[i] = tls.KeyPair(crt, key)
            brokers = cert_rotation.BrokerCerts(data.get(tls.CA_FILE, b""), certs, _forced(_annotations(broker_secret)))
            self._broker_data = data
        if self.names.ca_cert:
            ca_cert = self._read(self.names.ca_cert)
            self._ca_cert_bundle = None if ca_cert is None else _data(ca_cert).get(tls.CA_FILE, b"")
        return ca, brokers

    def _read_ca(self, name: str) -> cert_rotation.ClusterCa | None:
        secret = self._read(name)
        if secret is None:
            return None
        return ca_of(secret)

    def _write_ca(self, name: str, ca: cert_rotation.ClusterCa) -> None:
        data = {tls.CA_FILE: ca.current.cert_pem, CA_KEY: ca.current.key_pem}
        if ca.previous_pem:
            data[CA_PREVIOUS] = ca.previous_pem
        annotations = {ANNOTATION_GENERATION: str(ca.generation), ANNOTATION_PHASE: ca.phase}
        self._write(name, data, annotations)

    def write_ca(self, ca: cert_rotation.ClusterCa) -> None:
        self._write_ca(self.names.ca, ca)

    # -- the clients CA (names.clients_ca set) -------------------------------------------------------

    def read_clients(self) -> tuple[cert_rotation.ClusterCa | None, bytes | None, tls.KeyPair | None]:
        """(the clients CA, the brokers' bundle of it, the operator's own client certificate)."""
        ca = self._read_ca(self.names.clients_ca)
        bundle_secret = self._read(self.names.clients_ca_cert)
        bundle = None if bundle_secret is None else _data(bundle_secret).get(tls.CA_FILE, b"")
        own = None
        if self.names.operator_client:
            secret = self._read(self.names.operator_client)
            data = {} if secret is None else _data(secret)
            if data.get(tls.CERT_FILE) and data.get(tls.KEY_FILE):
                own = tls.KeyPair(data[tls.CERT_FILE], data[tls.KEY_FILE])
        return ca, bundle, own

    def write_clients_ca(self, ca: cert_rotation.ClusterCa) -> None:
        self._write_ca(self.names.clients_ca, ca)

    def write_clients_bundle(self, bundle: bytes) -> None:
        self._write(self.names.clients_ca_cert, {tls.CA_FILE: bundle}, {})

    def write_operator_client(self, pair: tls.KeyPair) -> None:
        self._write(self.names.operator_client, {tls.CERT_FILE: pair.cert_pem, tls.KEY_FILE: pair.key_pem}, {})

    def write_brokers(self, brokers: cert_rotation.BrokerCerts) -> None:
        data = dict(self._broker_data)
        data[tls.CA_FILE] = brokers.trust_bundle
        for i, pair in brokers.certs.items():
            data[tls.broker_cert_file(i)] = pair.cert_pem
            data[tls.broker_key_file(i)] = pair.key_pem
        self._write(self.names.brokers, data, {})
        self._broker_data = data

    def sync_ca_cert(self, bundle: bytes) -> bool:
        """Make the clients' CA certificate Secret hold ``bundle`` (True if it was written)."""
        if not self.names.ca_cert or self._ca_cert_bundle == bundle:
            return False
        self._write(self.names.ca_cert, {tls.CA_FILE: bundle}, {})
        self._ca_cert_bundle = bundle
        return True


def ca_of(secret: Any) -> cert_rotation.ClusterCa:
    """A CA Secret as this module writes it (``ca.crt``, ``ca.key``, ``ca-previous.crt``, annotations)."""
    data, ann = _data(secret), _annotations(secret)
    return cert_rotation.ClusterCa(
        tls.KeyPair(data[tls.CA_FILE], data[CA_KEY]),
        data.get(CA_PREVIOUS, b""),
        int(ann.get(ANNOTATION_GENERATION, "0")),
        ann.get(ANNOTATION_PHASE, cert_rotation.READY),
        force_renew=_forced(ann),
    )


def clients_reports(store: MetadataStore) -> dict[int, frozenset[str]]:
    """The clients CAs each broker with an mtls listener reported trusting."""
    return {
        d.value.broker_id: frozenset(d.value.tls_clients_trusted)
        for d in documents.list_documents(store, keys.BROKERS, BrokerDocument)
        if d.value.tls_clients_trusted
    }


def broker_reports(store: MetadataStore) -> tuple[dict[int, cert_rotation.BrokerReport], list[int], list[int]]:
    """(what each broker reported, registered broker ids, live broker ids) from the metadata store."""
    registered = [d.value for d in documents.list_documents(store, keys.BROKERS, BrokerDocument)]
    reports = {
        b.broker_id: cert_rotation.BrokerReport(frozenset(b.tls_trusted), b.tls_certificate)
        for b in registered
        if b.tls_certificate
    }
    controller = documents.read(store, keys.CONTROLLER, ControllerDocument)
    live = list(controller.value.live_brokers) if controller is not None else []
    return reports, [b.broker_id for b in registered], live


class CertificateManager:
    """Reconciles the Secrets (see the module docstring); :meth:`run` is the operator's thread."""

    def __init__(
        self,
        secrets: SecretStore,
        store: MetadataStore,
        policy: cert_rotation.Policy,
        *,
        expected_brokers: Callable[[], int],
        may_act: Callable[[], bool] = lambda: True,
        on_done: Callable[[str], None] | None = None,
        interval_s: float = 30.0,
    ) -> None:
        policy.check()
        self.secrets = secrets
        self.store = store
        self.policy = policy
        self.expected_brokers = expected_brokers
        self.may_act = may_act
        self.on_done = on_done
        self.interval_s = interval_s
        self.waiting = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def reconcile(self) -> list[str]:
        """Take every step that can be taken now; returns what was done (``waiting`` says what is awaited)."""
        done: list[str] = []
        for _ in range(MAX_STEPS):
            reports, registered, live = broker_reports(self.store)
            ids = sorted(set(range(self.expected_brokers())) | set(registered))
            ca, brokers = self.secrets.read(ids)
            step = cert_rotation.reconcile(ca, brokers, ids, reports, live, self.policy)
            self.waiting = step.waiting
            if not step.changed:
                if brokers is not None and self.secrets.sync_ca_cert(brokers.trust_bundle):
                    done.append("CA certificate Secret updated")
                break
            if step.ca is not None:
                self.secrets.write_ca(step.ca)
            if step.brokers is not None:
                self.secrets.write_brokers(step.brokers)
            log.info("certificates: %s", step.done)
            if self.on_done is not None:
                self.on_done(step.done)
            done.append(step.done)
        if self.secrets.names.owns_clients_ca:
            done += self.reconcile_clients()
        return done

    def reconcile_clients(self) -> list[str]:
        """The clients CA's steps (:func:`sluice.cert_rotation.reconcile_clients_ca`), then the
        operator's own client certificate (CN ``sluice-operator``), issued and renewed like a user's."""
        done: list[str] = []
        waiting = ""
        for _ in range(MAX_STEPS):
            _, _, live = broker_reports(self.store)
            ca, bundle, own = self.secrets.read_clients()
            step = cert_rotation.reconcile_clients_ca(ca, bundle, clients_reports(self.store), live, self.policy)
            waiting = step.waiting
            if not step.changed:
                if ca is not None and self._operator_client_due(ca, own):
                    pair = tls.issue(ca.current, OPERATOR_CN, validity_days=self.policy.validity_days)
                    self.secrets.write_operator_client(pair)
                    done.append(f"issued the operator's client certificate ({OPERATOR_CN})")
                break
            if step.ca is not None:
                self.secrets.write_clients_ca(step.ca)
            if step.bundle is not None:
                self.secrets.write_clients_bundle(step.bundle)
            done.append(step.done)
        for what in done:
            log.info("certificates: %s", what)
            if self.on_done is not None:
                self.on_done(what)
        self.waiting = self.waiting or waiting
        return done

    def _operator_client_due(self, ca: cert_rotation.ClusterCa, own: tls.KeyPair | None) -> bool:
        if not self.secrets.names.operator_client:
            return False
        return own is None or not cert_rotation.client_cert_current(own.cert_pem, ca, self.policy)

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                if self.may_act():
                    self.reconcile()
            except Conflict as exc:
                log.info("certificates: %s; reading again", exc)
                self.waiting = "a Secret changed meanwhile"
            except Exception:
                log.exception("certificate reconciliation failed")
                self.waiting = "a failed reconciliation to be retried"
            self._stop.wait(WAITING_INTERVAL_S if self.waiting else self.interval_s)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="sluice-certificates", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
