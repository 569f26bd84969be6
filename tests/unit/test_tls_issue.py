"""sluice.tls.issue: what a certificate carries (the brokers', the operator's and the test API server's)."""

from __future__ import annotations

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from sluice import tls


def test_a_certificate_names_its_organizations_its_hosts_and_serves_both_ends() -> None:
    ca = tls.generate_ca("test-ca", validity_days=1)
    pair = tls.issue(ca, "admin", organizations=["system:masters"], dns_names=["localhost"], ip_addresses=["127.0.0.1"])
    cert = pair.certificate
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == ["system:masters"]
    assert pair.common_name == "admin"
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usage) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert tls.signed_by(pair.cert_pem, ca.cert_pem) and tls.key_matches(pair.cert_pem, pair.key_pem)
    # without organizations the subject is the common name alone (brokers' certificates)
    plain = tls.issue(ca, "sluice-broker-0").certificate
    assert plain.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME) == []
