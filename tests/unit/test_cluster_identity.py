"""Who is a broker: a broker's CN is not enough, the cluster CA must have signed the certificate.

On an mtls client listener the clients CA is trusted beside the cluster CA, so a client
certificate named ``sluice-broker-0`` passes the handshake; it must not make its holder a super
user. Real certificates, made with the same code the LocalCluster and the operator use.
"""

from __future__ import annotations

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from sluice import tls
from sluice.broker.security.peers import ClusterIdentity


def der(pem: bytes) -> bytes:
    return x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)


def test_a_broker_certificate_of_the_cluster_ca_is_a_broker_in_pem_and_der() -> None:
    cluster_ca = tls.generate_ca("sluice-cluster-ca")
    cert = tls.issue_broker(cluster_ca, 0).cert_pem
    identity = ClusterIdentity(lambda: cluster_ca.cert_pem)
    assert identity.is_broker("sluice-broker-0", cert)
    assert identity.is_broker("sluice-broker-0", der(cert))  # what the Kafka listener's ssl module gives


def test_a_clients_ca_certificate_with_a_broker_name_is_not_a_broker() -> None:
    cluster_ca, clients_ca = tls.generate_ca("sluice-cluster-ca"), tls.generate_ca("sluice-clients-ca")
    identity = ClusterIdentity(lambda: cluster_ca.cert_pem)
    forged = tls.issue(clients_ca, "sluice-broker-0").cert_pem
    assert not identity.is_broker("sluice-broker-0", forged)
    # not even from a CA that took the cluster CA's name: the signature is checked, not the issuer name
    namesake = tls.generate_ca("sluice-cluster-ca")
    assert not identity.is_broker("sluice-broker-0", tls.issue(namesake, "sluice-broker-0").cert_pem)


def test_a_client_name_or_no_tls_material_is_never_a_broker() -> None:
    cluster_ca = tls.generate_ca("sluice-cluster-ca")
    assert not ClusterIdentity(lambda: cluster_ca.cert_pem).is_broker("admin", tls.issue(cluster_ca, "admin").cert_pem)
    assert not ClusterIdentity(None).is_broker("sluice-broker-0", tls.issue_broker(cluster_ca, 0).cert_pem)
    assert not ClusterIdentity(lambda: cluster_ca.cert_pem).is_broker("sluice-broker-0", None)


def test_during_a_ca_rotation_both_cas_of_the_bundle_sign_brokers_and_the_dropped_one_no_longer() -> None:
    old, new = tls.generate_ca("sluice-cluster-ca"), tls.generate_ca("sluice-cluster-ca-2")
    bundle = [tls.join_bundle(old.cert_pem, new.cert_pem)]
    identity = ClusterIdentity(lambda: bundle[0])
    old_cert, new_cert = tls.issue_broker(old, 1).cert_pem, tls.issue_broker(new, 1).cert_pem
    assert identity.is_broker("sluice-broker-1", old_cert) and identity.is_broker("sluice-broker-1", new_cert)
    bundle[0] = new.cert_pem  # DropOldCa
    assert not identity.is_broker("sluice-broker-1", old_cert)
    assert identity.is_broker("sluice-broker-1", new_cert)
