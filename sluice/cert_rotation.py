"""The certificate lifecycle of a cluster: create, renew, and rotate the CA with an overlap.

One pure function, :func:`reconcile`, decides the next step from what is stored (the cluster
CA, the brokers' certificates and trust bundle) and what the brokers say they have loaded (their
``brokers/<id>`` documents: the fingerprints of the CAs they trust and of the certificate they
present). Its callers only read and write: the operator keeps the state in Secrets
(sluice.operator.certificates), a LocalCluster in its data directory (sluice.testing.certs), so
both take exactly the same steps, and the local integration tests prove the operator's path.

A CA rotation (the CA is near expiry, or a renewal is forced) goes through phases, the way
Strimzi's CA reconciler does (CA generations, trust the new CA before using it), without its
rolling restarts: brokers reload their files (sluice.broker.security.reload)::

    Ready --> TrustNewCa    new CA made; brokers trust old + new; certificates still from the old
          --> ReissueCerts  every live broker trusts the new CA: certificates re-issued by the new
          --> DropOldCa     every live broker presents its new certificate: the old CA dropped
          --> Ready         every live broker trusts the new CA only

Each phase is written to the store before its effects, and every step is idempotent: a caller
that stops anywhere (an operator restart) continues where the store says. A phase moves on
only when every live broker reported the state that makes the next one safe, so no broker is
ever asked to trust a certificate it cannot verify: no failed handshake, no restart, no loop.
A broker that is down is not waited for: when it starts it loads whatever is current.

Outside a rotation, a broker certificate that is missing, not from the current CA, or within
``renewal_days`` of its expiry is re-issued (same CA: nothing to trust first). The CA is
rotated ``ca_renewal_days`` before its own expiry, which must be at least ``renewal_days`` so a
certificate capped at the CA's expiry is never due again at once (the loop Policy.check rules out).

The *clients CA* (client certificates, ``User:<CN>`` on an mtls listener) goes through the same
phases with the same state (:class:`ClusterCa`) in :func:`reconcile_clients_ca`: what the brokers
trust is then their ``--clients-ca`` bundle (reported as ``tls_clients_trusted``), and the
certificates it signs belong to clients the operator cannot ask what they loaded, so the old CA
is trusted until it expires, as Strimzi keeps an old clients CA (every certificate it signed is
capped at its expiry, so nothing valid is refused when it is dropped).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from sluice import tls

READY = "Ready"
TRUST_NEW_CA = "TrustNewCa"
REISSUE_CERTS = "ReissueCerts"
DROP_OLD_CA = "DropOldCa"
PHASES = (READY, TRUST_NEW_CA, REISSUE_CERTS, DROP_OLD_CA)
CA_COMMON_NAME = "sluice-cluster-ca"
CLIENTS_CA_COMMON_NAME = "sluice-clients-ca"


@dataclass(frozen=True)
class Policy:
    """Validity and renewal windows, in days (fractions allowed)."""

    validity_days: float = 365.0
    renewal_days: float = 30.0
    ca_validity_days: float = 1825.0
    ca_renewal_days: float = 30.0

    def check(self) -> None:
        """ValueError naming the setting when the windows would renew in a loop or never."""
        if not 0 < self.renewal_days < self.validity_days:
            raise ValueError(f"renewal days ({self.renewal_days:g}) must be > 0 and below validity days")
        if not 0 < self.ca_renewal_days < self.ca_validity_days:
            raise ValueError(f"CA renewal days ({self.ca_renewal_days:g}) must be > 0 and below CA validity days")
        if self.ca_renewal_days < self.renewal_days:
            raise ValueError(
                f"CA renewal days ({self.ca_renewal_days:g}) must be at least the certificates' renewal days "
                f"({self.renewal_days:g}): a certificate capped at the CA's expiry would be due again at once"
            )


@dataclass(frozen=True)
class ClusterCa:
    """What the CA's store holds: the signing CA, the one it replaces during a rotation, the phase."""

    current: tls.KeyPair
    previous_pem: bytes = b""  # the old CA certificate, trusted until DropOldCa
    generation: int = 0
    phase: str = READY
    force_renew: bool = False  # asked by hand (annotation sluice.dev/force-renew): rotate now

    def trust_bundle(self) -> bytes:
        """The ``ca.crt`` the brokers should have in this phase."""
        if self.phase in (TRUST_NEW_CA, REISSUE_CERTS):
            return tls.join_bundle(self.previous_pem, self.current.cert_pem)
        return self.current.cert_pem


@dataclass(frozen=True)
class BrokerCerts:
    """What the brokers read: the trust bundle and one certificate per broker id."""

    trust_bundle: bytes
    certs: Mapping[int, tls.KeyPair] = field(default_factory=dict)
    force_renew: bool = False  # re-issue every certificate now (annotation sluice.dev/force-renew)


@dataclass(frozen=True)
class BrokerReport:
    """What one broker says it loaded (its ``brokers/<id>`` document)."""

    trusted: frozenset[str]
    certificate: str


@dataclass(frozen=True)
class Step:
    """What to write (None: unchanged), what was done, and what the next step waits for."""

    ca: ClusterCa | None = None
    brokers: BrokerCerts | None = None
    done: str = ""
    waiting: str = ""

    @property
    def changed(self) -> bool:
        return self.ca is not None or self.brokers is not None


def new_ca(generation: int, policy: Policy, name: str = CA_COMMON_NAME) -> tls.KeyPair:
    """A CA of ``generation``; the CN names it, so two CAs of an overlap never look alike."""
    return tls.generate_ca(f"{name} v{generation}", policy.ca_validity_days)


def _start_rotation(ca: ClusterCa, policy: Policy, now: datetime.datetime, name: str, label: str) -> Step | None:
    """The step that starts a rotation of ``ca`` (in phase Ready) when it is due or forced, else None."""
    ca_left = tls.not_after(ca.current.cert_pem) - now
    if not (ca.force_renew or ca_left <= datetime.timedelta(days=policy.ca_renewal_days)):
        return None
    why = "forced" if ca.force_renew else f"it expires in {ca_left.days} days"
    generation = ca.generation + 1
    rotated = ClusterCa(new_ca(generation, policy, name), ca.current.cert_pem, generation, TRUST_NEW_CA)
    return Step(ca=rotated, done=f"{label} rotation to generation {generation} started ({why}): new CA trusted")


def _due(pair: tls.KeyPair | None, ca: tls.KeyPair, policy: Policy, now: datetime.datetime) -> bool:
    if pair is None or not tls.signed_by(pair.cert_pem, ca.cert_pem):
        return True
    return tls.not_after(pair.cert_pem) - now <= datetime.timedelta(days=policy.renewal_days)


def _issue(
    ca: tls.KeyPair, ids: Iterable[int], hosts: Mapping[int, list[str]], policy: Policy
) -> dict[int, tls.KeyPair]:
    return {i: tls.issue_broker(ca, i, hosts.get(i, []), policy.validity_days) for i in ids}


def _waiting_for(
    reports: Mapping[int, BrokerReport], live: Iterable[int], ok: Callable[[int, BrokerReport], bool], what: str
) -> str:
    """Who the next phase waits for (live brokers not reporting ``ok``, or not reporting at all), or ""."""
    behind = sorted(i for i in live if i in reports and not ok(i, reports[i]))
    unreported = sorted(i for i in live if i not in reports)
    late = behind + unreported
    return f"brokers {late} to {what}" if late else ""


def reconcile(
    ca: ClusterCa | None,
    brokers: BrokerCerts | None,
    broker_ids: Iterable[int],
    reports: Mapping[int, BrokerReport],
    live: Iterable[int],
    policy: Policy,
    *,
    now: datetime.datetime | None = None,
    hosts: Mapping[int, list[str]] | None = None,
) -> Step:
    """The next step (see the module docstring). Apply it (CA first, then the brokers) and call again.

    ``broker_ids``: the brokers that need a certificate; ``live``: the brokers to wait for before
    a phase moves on (running ones: a stopped broker loads the current files when it starts);
    ``hosts``: extra SAN entries per broker.
    """
    now = now or datetime.datetime.now(datetime.UTC)
    hosts = hosts or {}
    ids = sorted(set(broker_ids))
    live_ids = sorted(set(live))
    if ca is None:
        return Step(ca=ClusterCa(new_ca(0, policy)), done="created the cluster CA (generation 0)")
    if brokers is None:
        certs = _issue(ca.current, ids, hosts, policy)
        return Step(brokers=BrokerCerts(ca.trust_bundle(), certs), done=f"issued certificates to brokers {ids}")
    bundle = ca.trust_bundle()
    if tls.bundle_fingerprints(brokers.trust_bundle) != tls.bundle_fingerprints(bundle):
        return Step(brokers=replace(brokers, trust_bundle=bundle), done=f"trust bundle set for phase {ca.phase}")
    current_fp = tls.fingerprint(ca.current.cert_pem)

    if ca.phase == READY:
        started = _start_rotation(ca, policy, now, CA_COMMON_NAME, "CA")
        if started is not None:
            return started
        due = [i for i in ids if brokers.force_renew or _due(brokers.certs.get(i), ca.current, policy, now)]
        if due:
            certs = {**brokers.certs, **_issue(ca.current, due, hosts, policy)}
            return Step(brokers=BrokerCerts(bundle, certs), done=f"renewed the certificates of brokers {due}")
        return Step()

    if ca.phase == TRUST_NEW_CA:
        waiting = _waiting_for(reports, live_ids, lambda _i, r: current_fp in r.trusted, "trust the new CA")
        if waiting:
            return Step(waiting=waiting)
        return Step(ca=replace(ca, phase=REISSUE_CERTS), done="every live broker trusts the new CA")

    if ca.phase == REISSUE_CERTS:
        bundle_ca = ca.current.cert_pem
        stale = [i for i in ids if i not in brokers.certs or not tls.signed_by(brokers.certs[i].cert_pem, bundle_ca)]
        if stale:
            certs = {**brokers.certs, **_issue(ca.current, stale, hosts, policy)}
            return Step(brokers=BrokerCerts(bundle, certs), done=f"re-issued the certificates of brokers {stale}")

        def presents_new(i: int, r: BrokerReport) -> bool:
            pair = brokers.certs.get(i)
            return pair is not None and r.certificate == tls.fingerprint(pair.cert_pem)

        waiting = _waiting_for(reports, live_ids, presents_new, "present their new certificates")
        if waiting:
            return Step(waiting=waiting)
        dropped = replace(ca, phase=DROP_OLD_CA, previous_pem=b"")
        return Step(ca=dropped, done="every live broker presents a certificate of the new CA: old CA dropped")

    if ca.phase == DROP_OLD_CA:
        waiting = _waiting_for(
            reports, live_ids, lambda _i, r: r.trusted == frozenset({current_fp}), "stop trusting the old CA"
        )
        if waiting:
            return Step(waiting=waiting)
        return Step(ca=replace(ca, phase=READY), done=f"CA rotation to generation {ca.generation} complete")

    raise ValueError(f"unknown CA rotation phase {ca.phase!r} (one of {', '.join(PHASES)})")


@dataclass(frozen=True)
class ClientsCaStep:
    """What to write for the clients CA (None: unchanged): the CA, the brokers' ``--clients-ca`` bundle."""

    ca: ClusterCa | None = None
    bundle: bytes | None = None
    done: str = ""
    waiting: str = ""

    @property
    def changed(self) -> bool:
        return self.ca is not None or self.bundle is not None


def reconcile_clients_ca(
    ca: ClusterCa | None,
    bundle: bytes | None,
    reports: Mapping[int, frozenset[str]],
    live: Iterable[int],
    policy: Policy,
    *,
    now: datetime.datetime | None = None,
) -> ClientsCaStep:
    """The next step of the clients CA (the module docstring), the cluster CA's phases reused.

    ``bundle``: the brokers' clients CA file as stored (None: no Secret yet); ``reports``: what each
    broker with a clients CA reported trusting (brokers without an mtls listener report nothing and
    are not waited for); ``live`` as for :func:`reconcile`. Client certificates follow by
    themselves: whoever issues them signs with ``ca.current`` from phase ReissueCerts on, and
    keeps a certificate of the old CA while the phase is TrustNewCa (:func:`client_cert_signer_ok`).
    """
    now = now or datetime.datetime.now(datetime.UTC)
    if ca is None:
        created = ClusterCa(new_ca(0, policy, CLIENTS_CA_COMMON_NAME))
        return ClientsCaStep(ca=created, done="created the clients CA (generation 0)")
    wanted = ca.trust_bundle()
    if bundle is None or tls.bundle_fingerprints(bundle) != tls.bundle_fingerprints(wanted):
        return ClientsCaStep(bundle=wanted, done=f"clients CA bundle set for phase {ca.phase}")
    current_fp = tls.fingerprint(ca.current.cert_pem)
    live_ids = sorted(i for i in set(live) if i in reports)
    trusted = {i: BrokerReport(r, "") for i, r in reports.items()}
    if ca.phase == READY:
        started = _start_rotation(ca, policy, now, CLIENTS_CA_COMMON_NAME, "clients CA")
        return ClientsCaStep() if started is None else ClientsCaStep(ca=started.ca, done=started.done)
    if ca.phase == TRUST_NEW_CA:
        waiting = _waiting_for(trusted, live_ids, lambda _i, r: current_fp in r.trusted, "trust the new clients CA")
        if waiting:
            return ClientsCaStep(waiting=waiting)
        return ClientsCaStep(ca=replace(ca, phase=REISSUE_CERTS), done="every live broker trusts the new clients CA")
    if ca.phase == REISSUE_CERTS:
        # Client certificates are re-issued by the new CA now; the old CA stays trusted until it expires.
        if ca.previous_pem and tls.not_after(ca.previous_pem) > now:
            return ClientsCaStep()
        return ClientsCaStep(
            ca=replace(ca, phase=DROP_OLD_CA, previous_pem=b""), done="the old clients CA expired: dropped"
        )
    if ca.phase == DROP_OLD_CA:
        waiting = _waiting_for(
            trusted, live_ids, lambda _i, r: r.trusted == frozenset({current_fp}), "stop trusting the old clients CA"
        )
        if waiting:
            return ClientsCaStep(waiting=waiting)
        return ClientsCaStep(
            ca=replace(ca, phase=READY), done=f"clients CA rotation to generation {ca.generation} complete"
        )
    raise ValueError(f"unknown CA rotation phase {ca.phase!r} (one of {', '.join(PHASES)})")


def client_cert_current(
    cert_pem: bytes, ca: ClusterCa, policy: Policy, *, now: datetime.datetime | None = None
) -> bool:
    """Whether a client certificate may stay as it is: signed by the signing CA (or, while brokers do
    not all trust the new CA yet, by the old one) and not within ``renewal_days`` of its expiry."""
    now = now or datetime.datetime.now(datetime.UTC)
    signers = [ca.current.cert_pem] + ([ca.previous_pem] if ca.phase == TRUST_NEW_CA and ca.previous_pem else [])
    if not any(tls.signed_by(cert_pem, signer) for signer in signers):
        return False
    return tls.not_after(cert_pem) - now > datetime.timedelta(days=policy.renewal_days)
