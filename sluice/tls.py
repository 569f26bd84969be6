"""TLS material: a certificate authority, the certificates it signs, and the files they live in.

Two authorities, as in Strimzi: the *cluster CA* signs broker certificates only, so holding a
certificate it signed is what makes a peer a broker of this cluster; a *clients CA* signs client
certificates (``User:<CN>``), so a client certificate can never pass as a broker's. Keys are
EC P-256 (small and fast to generate: a local cluster makes its own at every first start).

A broker reads its material from one directory in the layout of a Kubernetes TLS Secret
(``ca.crt``, ``tls.crt``, ``tls.key``), so the same files come from a LocalCluster's data
directory or a mounted Secret. ``ca.crt`` may hold several CA certificates (a rotation overlap:
the old and the new CA are trusted together until every certificate is re-issued). The
operator's broker Secret holds every broker's pair in one Secret (``broker-<id>.crt``,
``broker-<id>.key`` beside ``ca.crt``): :func:`load_dir` with a broker id reads that layout
when there is no ``tls.crt``. A pair whose key does not match its certificate is refused, so
a reload that catches a directory half-written (one file new, the other old) is told to wait.

Every file written here is created mode 0600 (private keys and certificates alike: nothing in a
data directory is for other users).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# The name every broker certificate carries as a DNS SAN, and the name brokers verify each other
# against (grpc.ssl_target_name_override): a broker is reached by pod IP or loopback address, and
# what matters is the signing CA, not the address.
BROKER_SERVER_NAME = "sluice-broker"
BROKER_CN_PREFIX = "sluice-broker"
CA_FILE = "ca.crt"
CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
DEFAULT_VALIDITY_DAYS = 365


class TlsError(ValueError):
    """TLS material is missing, unreadable or inconsistent."""


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key, PEM-encoded."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    @property
    def common_name(self) -> str:
        attrs = self.certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        return str(attrs[0].value) if attrs else ""


@dataclass(frozen=True)
class TlsMaterial:
    """What one process presents and trusts: its key pair and the CA bundle it verifies peers with."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes


_CA_KEY_USAGE = x509.KeyUsage(
    digital_signature=True,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=True,
    crl_sign=True,
    encipher_only=False,
    decipher_only=False,
)


def fingerprint(cert_pem: bytes) -> str:
    """SHA-256 of the (first) certificate's DER, hex: how brokers report what they loaded."""
    return x509.load_pem_x509_certificate(cert_pem).fingerprint(hashes.SHA256()).hex()


def bundle_fingerprints(bundle_pem: bytes) -> list[str]:
    """The fingerprints of every certificate in a PEM bundle (``ca.crt`` during an overlap holds two)."""
    return [c.fingerprint(hashes.SHA256()).hex() for c in x509.load_pem_x509_certificates(bundle_pem)]


def join_bundle(*pems: bytes) -> bytes:
    """One PEM bundle of the certificates in ``pems``, in order, each once."""
    seen: set[str] = set()
    out: list[bytes] = []
    for pem in pems:
        if not pem.strip():
            continue
        for cert in x509.load_pem_x509_certificates(pem):
            fp = cert.fingerprint(hashes.SHA256()).hex()
            if fp not in seen:
                seen.add(fp)
                out.append(cert.public_bytes(serialization.Encoding.PEM))
    return b"".join(out)


def not_after(cert_pem: bytes) -> datetime.datetime:
    """When the certificate expires (UTC)."""
    return x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc


def signed_by(cert_pem: bytes, ca_pem: bytes) -> bool:
    """Whether ``ca_pem``'s key signed ``cert_pem`` (names and signature checked, not dates)."""
    try:
        x509.load_pem_x509_certificate(cert_pem).verify_directly_issued_by(x509.load_pem_x509_certificate(ca_pem))
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def key_matches(cert_pem: bytes, key_pem: bytes) -> bool:
    """Whether ``key_pem`` is the private key of ``cert_pem``."""
    key = serialization.load_pem_private_key(key_pem, password=None)
    public = x509.load_pem_x509_certificate(cert_pem).public_key()
    fmt = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return key.public_key().public_bytes(*fmt) == public.public_bytes(*fmt)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    fmt = serialization.PrivateFormat.PKCS8
    return key.private_bytes(serialization.Encoding.PEM, fmt, serialization.NoEncryption())


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def generate_ca(name: str, validity_days: float = DEFAULT_VALIDITY_DAYS) -> KeyPair:
    """A new self-signed CA named ``name`` (its CN)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    start = _now() - datetime.timedelta(minutes=5)  # tolerate small clock differences between hosts
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=validity_days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_CA_KEY_USAGE, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue(
    ca: KeyPair,
    common_name: str,
    *,
    dns_names: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
    organizations: Sequence[str] = (),
    validity_days: float = DEFAULT_VALIDITY_DAYS,
) -> KeyPair:
    """A certificate for ``common_name`` signed by ``ca``, good for both TLS server and client use.

    ``organizations`` go into the subject as O= attributes (a Kubernetes API server reads them as
    the user's groups)."""
    ca_cert = ca.certificate
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TlsError("the CA key is not an EC key")
    key = ec.generate_private_key(ec.SECP256R1())
    start = _now() - datetime.timedelta(minutes=5)
    end = min(start + datetime.timedelta(days=validity_days), ca_cert.not_valid_after_utc)
    names: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    names += [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]
    builder = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
                + [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
            )
        )
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def broker_common_name(broker_id: int) -> str:
    return f"{BROKER_CN_PREFIX}-{broker_id}"


def issue_broker(
    ca: KeyPair, broker_id: int, hosts: Sequence[str] = (), validity_days: float = DEFAULT_VALIDITY_DAYS
) -> KeyPair:
    """Broker ``broker_id``'s certificate: CN ``sluice-broker-<id>``, SAN ``sluice-broker`` plus ``hosts``."""
    ips, dns = [], [BROKER_SERVER_NAME]
    for h in hosts:
        try:
            ipaddress.ip_address(h)
            ips.append(h)
        except ValueError:
            dns.append(h)
    return issue(ca, broker_common_name(broker_id), dns_names=dns, ip_addresses=ips, validity_days=validity_days)


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` created mode 0600 (replaced atomically, never readable by others)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def write_dir(directory: Path, ca_pem: bytes, pair: KeyPair) -> None:
    """``directory``/{ca.crt, tls.crt, tls.key}, each mode 0600 (the layout of a Kubernetes TLS Secret)."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    write_private(directory / CA_FILE, ca_pem)
    write_private(directory / CERT_FILE, pair.cert_pem)
    write_private(directory / KEY_FILE, pair.key_pem)


def broker_cert_file(broker_id: int) -> str:
    """The key of broker ``broker_id``'s certificate in the operator's broker Secret."""
    return f"broker-{broker_id}.crt"


def broker_key_file(broker_id: int) -> str:
    return f"broker-{broker_id}.key"


def material_files(directory: str | os.PathLike[str], broker_id: int | None = None) -> tuple[Path, Path, Path]:
    """The CA bundle, certificate and key files a process reads from ``directory``.

    ``tls.crt``/``tls.key`` when ``tls.crt`` exists (a TLS Secret's layout, a LocalCluster's
    broker directory), else ``broker-<id>.crt``/``.key`` (the operator's broker Secret).
    """
    d = Path(directory)
    if broker_id is None or (d / CERT_FILE).exists():
        return d / CA_FILE, d / CERT_FILE, d / KEY_FILE
    return d / CA_FILE, d / broker_cert_file(broker_id), d / broker_key_file(broker_id)


def load_dir(directory: str | os.PathLike[str], broker_id: int | None = None) -> TlsMaterial:
    """Read the CA bundle, certificate and key from ``directory`` (TlsError naming what is wrong).

    With ``broker_id``, a directory without ``tls.crt`` is read as the operator's broker Secret
    (``broker-<id>.crt``, ``broker-<id>.key``). The key must be the certificate's.
    """
    d = Path(directory)
    out: list[bytes] = []
    for path in material_files(d, broker_id):
        try:
            out.append(path.read_bytes())
        except OSError as exc:
            raise TlsError(f"cannot read {path}: {exc.strerror or exc}") from None
    material = TlsMaterial(*out)
    try:
        x509.load_pem_x509_certificates(material.ca_pem)
        x509.load_pem_x509_certificate(material.cert_pem)
        matches = key_matches(material.cert_pem, material.key_pem)
    except ValueError as exc:
        raise TlsError(f"{d}: not PEM certificates and key: {exc}") from None
    if not matches:
        raise TlsError(f"{d}: the private key is not the certificate's (a directory being rewritten?)")
    return material
