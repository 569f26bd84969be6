"""sluice.cert_rotation's clients CA: created, published, rotated with the cluster CA's phases.

The brokers are their reports (the clients CAs a broker with an mtls listener says it trusts);
tests/k8s/test_clients_ca.py runs the operator and a real broker.
"""

from __future__ import annotations

import datetime

from sluice import cert_rotation as cr
from sluice import tls

POLICY = cr.Policy()
NOW = datetime.datetime.now(datetime.UTC)


def ready() -> tuple[cr.ClusterCa, bytes]:
    step = cr.reconcile_clients_ca(None, None, {}, [], POLICY)
    assert step.ca is not None and step.bundle is None and step.done == "created the clients CA (generation 0)"
    assert step.ca.current.common_name == "sluice-clients-ca v0"
    published = cr.reconcile_clients_ca(step.ca, None, {}, [], POLICY)
    assert published.bundle == step.ca.current.cert_pem and published.ca is None
    assert not cr.reconcile_clients_ca(step.ca, published.bundle, {}, [], POLICY).changed
    return step.ca, published.bundle


def trusting(bundle: bytes) -> frozenset[str]:
    return frozenset(tls.bundle_fingerprints(bundle))


def test_a_forced_rotation_waits_for_the_brokers_and_keeps_the_old_ca_until_it_expires() -> None:
    ca, bundle = ready()
    user = tls.issue(ca.current, "alice")
    assert cr.client_cert_current(user.cert_pem, ca, POLICY)

    step = cr.reconcile_clients_ca(cr.ClusterCa(ca.current, force_renew=True), bundle, {}, [0], POLICY)
    assert step.ca is not None and step.ca.phase == cr.TRUST_NEW_CA and step.ca.generation == 1
    rotated = step.ca
    assert "clients CA rotation to generation 1 started (forced)" in step.done
    # the old CA's certificates stay while the brokers may not trust the new CA yet
    assert cr.client_cert_current(user.cert_pem, rotated, POLICY)
    step = cr.reconcile_clients_ca(rotated, bundle, {0: trusting(bundle)}, [0], POLICY)
    assert step.bundle is not None and len(tls.bundle_fingerprints(step.bundle)) == 2
    both = step.bundle
    # broker 0 (live, mtls) still trusts the old one only; broker 1 has no mtls listener: not waited for
    step = cr.reconcile_clients_ca(rotated, both, {0: trusting(bundle)}, [0, 1], POLICY)
    assert step.waiting == "brokers [0] to trust the new clients CA" and not step.changed
    step = cr.reconcile_clients_ca(rotated, both, {0: trusting(both)}, [0, 1], POLICY)
    assert step.ca is not None and step.ca.phase == cr.REISSUE_CERTS
    reissuing = step.ca
    # from now on a certificate of the old CA is re-issued; the old CA stays trusted until it expires
    assert not cr.client_cert_current(user.cert_pem, reissuing, POLICY)
    assert not cr.reconcile_clients_ca(reissuing, both, {0: trusting(both)}, [0], POLICY).changed
    later = tls.not_after(ca.current.cert_pem) + datetime.timedelta(seconds=1)
    step = cr.reconcile_clients_ca(reissuing, both, {0: trusting(both)}, [0], POLICY, now=later)
    assert step.ca is not None and step.ca.phase == cr.DROP_OLD_CA and not step.ca.previous_pem
    dropping = step.ca
    step = cr.reconcile_clients_ca(dropping, both, {0: trusting(both)}, [0], POLICY, now=later)
    assert step.bundle == dropping.current.cert_pem
    new_only = step.bundle
    step = cr.reconcile_clients_ca(dropping, new_only, {0: trusting(both)}, [0], POLICY, now=later)
    assert step.waiting == "brokers [0] to stop trusting the old clients CA"
    step = cr.reconcile_clients_ca(dropping, new_only, {0: trusting(new_only)}, [0], POLICY, now=later)
    assert step.ca is not None and step.ca.phase == cr.READY
    assert step.done == "clients CA rotation to generation 1 complete"


def test_a_client_certificate_is_renewed_within_its_window_and_when_from_another_ca() -> None:
    ca, _ = ready()
    soon = tls.issue(ca.current, "alice", validity_days=POLICY.renewal_days - 1)
    assert not cr.client_cert_current(soon.cert_pem, ca, POLICY)
    other = tls.issue(tls.generate_ca("sluice-clients-ca v0"), "alice")  # same CA name, another key
    assert not cr.client_cert_current(other.cert_pem, ca, POLICY)


def test_the_clients_ca_is_rotated_before_it_expires() -> None:
    ca, bundle = ready()
    near = tls.not_after(ca.current.cert_pem) - datetime.timedelta(days=POLICY.ca_renewal_days - 1)
    step = cr.reconcile_clients_ca(ca, bundle, {}, [], POLICY, now=near)
    assert step.ca is not None and step.ca.phase == cr.TRUST_NEW_CA and "it expires in" in step.done
