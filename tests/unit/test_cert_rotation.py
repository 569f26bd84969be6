"""sluice.cert_rotation: the steps of the certificate lifecycle, decided from what is stored and reported.

The brokers here are their reports (what a broker's ``brokers/<id>`` document says it loaded);
the integration test (tests/integration/test_cert_rotation.py) runs the same steps with real
brokers reloading real files.
"""

from __future__ import annotations

import datetime

import pytest

from sluice import cert_rotation as cr
from sluice import tls

POLICY = cr.Policy()
IDS = [0, 1, 2]


def loaded(brokers: cr.BrokerCerts, ids: list[int] = IDS) -> dict[int, cr.BrokerReport]:
    """Every broker in ``ids`` has loaded ``brokers`` (the files as written)."""
    trusted = frozenset(tls.bundle_fingerprints(brokers.trust_bundle))
    return {i: cr.BrokerReport(trusted, tls.fingerprint(brokers.certs[i].cert_pem)) for i in ids}


def apply(
    ca: cr.ClusterCa | None, brokers: cr.BrokerCerts | None, step: cr.Step
) -> tuple[cr.ClusterCa, cr.BrokerCerts]:
    new_ca = step.ca or ca
    new_brokers = step.brokers or brokers
    assert new_ca is not None and new_brokers is not None
    return new_ca, new_brokers


def created() -> tuple[cr.ClusterCa, cr.BrokerCerts]:
    step = cr.reconcile(None, None, IDS, {}, [], POLICY)
    assert step.ca is not None and step.brokers is None and step.done.startswith("created the cluster CA")
    step2 = cr.reconcile(step.ca, None, IDS, {}, [], POLICY)
    assert step2.brokers is not None
    return step.ca, step2.brokers


def test_creation_issues_a_certificate_per_broker_from_a_new_ca() -> None:
    ca, brokers = created()
    assert ca.generation == 0 and ca.phase == cr.READY
    assert brokers.trust_bundle == ca.current.cert_pem
    assert sorted(brokers.certs) == IDS
    for i, pair in brokers.certs.items():
        assert pair.common_name == f"sluice-broker-{i}" and tls.signed_by(pair.cert_pem, ca.current.cert_pem)
    # nothing more to do: no loop
    assert not cr.reconcile(ca, brokers, IDS, loaded(brokers), IDS, POLICY).changed


def test_a_certificate_near_expiry_or_missing_or_foreign_is_reissued_alone() -> None:
    ca, brokers = created()
    stranger = tls.generate_ca("someone-else")
    certs = dict(brokers.certs)
    certs[0] = tls.issue_broker(ca.current, 0, validity_days=29)  # inside the 30-day window
    certs[1] = tls.issue_broker(stranger, 1)
    del certs[2]
    step = cr.reconcile(ca, cr.BrokerCerts(brokers.trust_bundle, certs), IDS, {}, IDS, POLICY)
    assert step.done == "renewed the certificates of brokers [0, 1, 2]"
    assert step.brokers is not None
    for i in IDS:
        assert tls.signed_by(step.brokers.certs[i].cert_pem, ca.current.cert_pem)
        assert tls.not_after(step.brokers.certs[i].cert_pem) - datetime.datetime.now(datetime.UTC) > datetime.timedelta(
            days=360
        )
    fine = dict(brokers.certs)
    fine[0] = tls.issue_broker(ca.current, 0, validity_days=31)
    step = cr.reconcile(ca, cr.BrokerCerts(brokers.trust_bundle, fine), IDS, {}, IDS, POLICY)
    assert not step.changed  # outside the window: left alone


def test_ca_rotation_waits_for_every_live_broker_at_every_phase() -> None:
    ca, brokers = created()
    old_fp = tls.fingerprint(ca.current.cert_pem)
    step = cr.reconcile(cr.ClusterCa(ca.current, force_renew=True), brokers, IDS, loaded(brokers), IDS, POLICY)
    assert step.ca is not None and step.ca.phase == cr.TRUST_NEW_CA and step.ca.generation == 1
    assert not step.ca.force_renew
    assert step.ca.current.common_name == "sluice-cluster-ca v1"
    ca, brokers = apply(ca, brokers, step)
    new_fp = tls.fingerprint(ca.current.cert_pem)

    # the brokers' bundle first: old + new, certificates unchanged
    step = cr.reconcile(ca, brokers, IDS, loaded(brokers), IDS, POLICY)
    assert step.brokers is not None and tls.bundle_fingerprints(step.brokers.trust_bundle) == [old_fp, new_fp]
    assert step.brokers.certs == brokers.certs
    before = brokers
    ca, brokers = apply(ca, brokers, step)

    # broker 2 has not reloaded yet: wait for it (a broker not live is not waited for)
    partial = {**loaded(brokers, [0, 1]), **loaded(before, [2])}
    step = cr.reconcile(ca, brokers, IDS, partial, IDS, POLICY)
    assert not step.changed and step.waiting == "brokers [2] to trust the new CA"
    assert cr.reconcile(ca, brokers, IDS, partial, [0, 1], POLICY).ca is not None
    step = cr.reconcile(ca, brokers, IDS, loaded(brokers), IDS, POLICY)
    assert step.ca is not None and step.ca.phase == cr.REISSUE_CERTS
    ca, brokers = apply(ca, brokers, step)

    # re-issue by the new CA, still trusting both
    step = cr.reconcile(ca, brokers, IDS, loaded(brokers), IDS, POLICY)
    assert step.brokers is not None
    assert all(tls.signed_by(p.cert_pem, ca.current.cert_pem) for p in step.brokers.certs.values())
    assert tls.bundle_fingerprints(step.brokers.trust_bundle) == [old_fp, new_fp]
    stale = brokers
    ca, brokers = apply(ca, brokers, step)
    step = cr.reconcile(ca, brokers, IDS, {**loaded(brokers, [0, 2]), **loaded(stale, [1])}, IDS, POLICY)
    assert step.waiting == "brokers [1] to present their new certificates"
    step = cr.reconcile(ca, brokers, IDS, loaded(brokers), IDS, POLICY)
    assert step.ca is not None and step.ca.phase == cr.DROP_OLD_CA and step.ca.previous_pem == b""
    ca, brokers = apply(ca, brokers, step)

    # drop the old CA, then Ready once every broker trusts the new one only
    step = cr.reconcile(ca, brokers, IDS, loaded(brokers), IDS, POLICY)
    assert step.brokers is not None and tls.bundle_fingerprints(step.brokers.trust_bundle) == [new_fp]
    overlap = brokers
    ca, brokers = apply(ca, brokers, step)
    step = cr.reconcile(ca, brokers, IDS, loaded(overlap), IDS, POLICY)
    assert step.waiting == "brokers [0, 1, 2] to stop trusting the old CA"
    step = cr.reconcile(ca, brokers, IDS, loaded(brokers), IDS, POLICY)
    assert step.ca is not None and step.ca.phase == cr.READY and step.done == "CA rotation to generation 1 complete"
    ca, brokers = apply(ca, brokers, step)
    assert not cr.reconcile(ca, brokers, IDS, loaded(brokers), IDS, POLICY).changed


def test_a_stop_between_writes_is_repaired_by_the_next_step() -> None:
    """The CA written, the brokers' files not (an operator killed in between): the bundle is set again."""
    ca, brokers = created()
    step = cr.reconcile(cr.ClusterCa(ca.current, force_renew=True), brokers, IDS, loaded(brokers), IDS, POLICY)
    assert step.ca is not None
    # ... crash: the brokers' Secret never got the new bundle; the next operator sees TrustNewCa
    again = cr.reconcile(step.ca, brokers, IDS, loaded(brokers), IDS, POLICY)
    assert again.brokers is not None and again.ca is None and again.done == "trust bundle set for phase TrustNewCa"
    # and in ReissueCerts with the certificates not yet re-issued: re-issued, not skipped
    reissue = cr.ClusterCa(step.ca.current, step.ca.previous_pem, 1, cr.REISSUE_CERTS)
    bundled = cr.BrokerCerts(reissue.trust_bundle(), brokers.certs)
    nxt = cr.reconcile(reissue, bundled, IDS, loaded(bundled), IDS, POLICY)
    assert nxt.brokers is not None and nxt.done == "re-issued the certificates of brokers [0, 1, 2]"


def test_a_ca_near_expiry_is_rotated_rather_than_its_certificates_renewed_in_a_loop() -> None:
    policy = cr.Policy(validity_days=365, renewal_days=30, ca_validity_days=1825, ca_renewal_days=60)
    ca = cr.ClusterCa(tls.generate_ca("old", validity_days=45))  # within the CA's window
    brokers = cr.BrokerCerts(ca.current.cert_pem, {i: tls.issue_broker(ca.current, i) for i in IDS})
    step = cr.reconcile(ca, brokers, IDS, loaded(brokers), IDS, policy)
    assert step.ca is not None and step.ca.phase == cr.TRUST_NEW_CA
    assert "expires in 44 days" in step.done


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (cr.Policy(validity_days=10, renewal_days=10), "renewal days"),
        (cr.Policy(ca_validity_days=30, ca_renewal_days=30), "CA renewal days"),
        (cr.Policy(renewal_days=40, ca_renewal_days=30), "due again at once"),
    ],
)
def test_policies_that_would_loop_are_refused(policy: cr.Policy, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        policy.check()


def test_operator_settings_refuse_bad_windows_naming_the_variables() -> None:
    from sluice.operator.settings import OperatorSettings, SettingsError

    with pytest.raises(SettingsError, match="renewal days"):
        OperatorSettings.from_environment({"SLUICE_NAMESPACE": "x", "SLUICE_CERT_RENEWAL_DAYS": "400"})
    with pytest.raises(SettingsError, match="due again at once"):
        OperatorSettings.from_environment(
            {"SLUICE_NAMESPACE": "x", "SLUICE_CA_RENEWAL_DAYS": "10", "SLUICE_CERT_RENEWAL_DAYS": "20"}
        )
    s = OperatorSettings.from_environment({"SLUICE_NAMESPACE": "x", "SLUICE_BROKER_CERTS_SECRET": "b"})
    assert (s.broker_certs_secret, s.ca_secret, s.cert_policy) == ("b", "sluice-cluster-ca", cr.Policy())
    assert OperatorSettings.from_environment({"SLUICE_NAMESPACE": "x"}).broker_certs_secret is None


def test_load_dir_reads_the_operator_layout_and_refuses_a_mismatched_pair(tmp_path: object) -> None:
    from pathlib import Path

    d = Path(str(tmp_path))
    ca = tls.generate_ca("ca")
    a, b = tls.issue_broker(ca, 4), tls.issue_broker(ca, 5)
    tls.write_private(d / "ca.crt", ca.cert_pem)
    tls.write_private(d / "broker-4.crt", a.cert_pem)
    tls.write_private(d / "broker-4.key", a.key_pem)
    assert tls.load_dir(d, 4).cert_pem == a.cert_pem
    with pytest.raises(tls.TlsError, match=r"broker-5\.crt"):
        tls.load_dir(d, 5)
    tls.write_private(d / "broker-4.key", b.key_pem)
    with pytest.raises(tls.TlsError, match="not the certificate's"):
        tls.load_dir(d, 4)
