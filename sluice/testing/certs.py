"""A local cluster's certificate authority and broker certificates, kept in its data directory.

Layout (every file mode 0600, every directory 0700)::

    tls/cluster-ca.crt, tls/cluster-ca.key   the cluster CA: signs broker certificates only
    tls/broker-N/{ca.crt,tls.crt,tls.key}    broker N's material for --broker-tls-dir

Made on the first start and reused after (a data directory started again keeps its CA, so a
restarted broker still trusts the others). A broker added later gets a certificate from the
same CA. Nothing here is a stand-in: the brokers run the same mutual TLS as in production.

Rotation (``LocalCluster.renew_certificates`` / ``rotate_ca``) takes the operator's steps
(:mod:`sluice.cert_rotation`) over these files: ``tls/cluster-ca.json`` holds the CA, the old
one while both are trusted, and the generation and phase the operator keeps in its CA Secret's
annotations (written first, in one piece, so it is the truth).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from sluice import cert_rotation, tls

TLS_DIR = "tls"
CLUSTER_CA = "cluster-ca"


def load_or_create_ca(base: Path, name: str, common_name: str) -> tls.KeyPair:
    """The CA ``base/name.{crt,key}``, generated (mode 0600) when it does not exist yet."""
    crt, key = base / f"{name}.crt", base / f"{name}.key"
    if crt.exists() and key.exists():
        return tls.KeyPair(crt.read_bytes(), key.read_bytes())
    base.mkdir(parents=True, exist_ok=True)
    base.chmod(0o700)
    ca = tls.generate_ca(common_name)
    tls.write_private(key, ca.key_pem)
    tls.write_private(crt, ca.cert_pem)
    return ca


def broker_tls_dirs(data_dir: Path, broker_ids: Iterable[int], host: str) -> dict[int, Path]:
    """Each broker's ``--broker-tls-dir``, with its certificate issued by the cluster CA if missing."""
    base = data_dir / TLS_DIR
    ca = read_cluster_ca(data_dir)  # mid-rotation: the phase's trust bundle
    out: dict[int, Path] = {}
    for i in broker_ids:
        d = base / f"broker-{i}"
        if not all((d / f).exists() for f in (tls.CA_FILE, tls.CERT_FILE, tls.KEY_FILE)):
            tls.write_dir(d, ca.trust_bundle(), tls.issue_broker(ca.current, i, [host]))
        out[i] = d
    return out


CLIENTS_CA = "clients-ca"
CONTROLLER_CN = "sluice-controller"


def controller_tls_dir(data_dir: Path) -> Path:
    """The local controller's material (CN ``sluice-controller``, cluster CA): it health-checks
    brokers whose client listener requires a certificate. Not a broker's name: no inter-broker RPC."""
    base = data_dir / TLS_DIR
    d = base / "controller"
    if not (d / tls.KEY_FILE).exists():
        ca = load_or_create_ca(base, CLUSTER_CA, "sluice-local-cluster-ca")
        tls.write_dir(d, ca.cert_pem, tls.issue(ca, CONTROLLER_CN))
    return d


def clients_ca_file(data_dir: Path) -> Path:
    """The clients CA certificate (``tls/clients-ca.crt``), made on first use: what brokers verify clients with."""
    base = data_dir / TLS_DIR
    load_or_create_ca(base, CLIENTS_CA, "sluice-local-clients-ca")
    return base / f"{CLIENTS_CA}.crt"


def client_tls_dir(data_dir: Path, name: str) -> Path:
    """``tls/clients/<name>/``: a certificate for ``User:<name>`` from the clients CA, and the cluster CA
    (``ca.crt``) to verify brokers with. Made on first use, reused after."""
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"a client name is a certificate CN without '/', not {name!r}")
    base = data_dir / TLS_DIR
    d = base / "clients" / name
    if not (d / tls.KEY_FILE).exists():
        cluster_ca = load_or_create_ca(base, CLUSTER_CA, "sluice-local-cluster-ca")
        clients_ca = load_or_create_ca(base, CLIENTS_CA, "sluice-local-clients-ca")
        (base / "clients").mkdir(mode=0o700, exist_ok=True)
        tls.write_dir(d, cluster_ca.cert_pem, tls.issue(clients_ca, name))
    return d


# -- rotation: the operator's steps (sluice.cert_rotation) over the data directory ---------------

CA_STATE = "cluster-ca.json"  # the CA with its rotation state, as the operator keeps it in the CA Secret


def read_cluster_ca(data_dir: Path, *, force_renew: bool = False) -> cert_rotation.ClusterCa:
    """The cluster CA of ``data_dir/tls`` with its rotation state (generation 0, Ready, when none is written)."""
    base = data_dir / TLS_DIR
    if not (base / CA_STATE).exists():
        ca = load_or_create_ca(base, CLUSTER_CA, "sluice-local-cluster-ca")
        return cert_rotation.ClusterCa(ca, force_renew=force_renew)
    state = json.loads((base / CA_STATE).read_text())
    return cert_rotation.ClusterCa(
        tls.KeyPair(state["ca_crt"].encode(), state["ca_key"].encode()),
        state["previous_crt"].encode(),
        int(state["generation"]),
        str(state["phase"]),
        force_renew=force_renew,
    )


def write_cluster_ca(data_dir: Path, ca: cert_rotation.ClusterCa) -> None:
    """Store ``ca`` in one atomic write (``tls/cluster-ca.json``), then mirror the signing CA into
    ``tls/cluster-ca.crt|key`` for what issues the controller's and clients' certificates."""
    base = data_dir / TLS_DIR
    state = {
        "generation": ca.generation,
        "phase": ca.phase,
        "ca_crt": ca.current.cert_pem.decode(),
        "ca_key": ca.current.key_pem.decode(),
        "previous_crt": ca.previous_pem.decode(),
    }
    tls.write_private(base / CA_STATE, json.dumps(state).encode())
    tls.write_private(base / f"{CLUSTER_CA}.key", ca.current.key_pem)
    tls.write_private(base / f"{CLUSTER_CA}.crt", ca.current.cert_pem)


def read_broker_certs(
    data_dir: Path, broker_ids: Iterable[int], *, force_renew: bool = False
) -> cert_rotation.BrokerCerts:
    """What the brokers of ``data_dir`` read: broker 0's ``ca.crt`` (they all hold the same) and each pair."""
    base = data_dir / TLS_DIR
    certs: dict[int, tls.KeyPair] = {}
    bundle = b""
    for i in broker_ids:
        d = base / f"broker-{i}"
        if (d / tls.CERT_FILE).exists() and (d / tls.KEY_FILE).exists():
            certs[i] = tls.KeyPair((d / tls.CERT_FILE).read_bytes(), (d / tls.KEY_FILE).read_bytes())
        if not bundle and (d / tls.CA_FILE).exists():
            bundle = (d / tls.CA_FILE).read_bytes()
    return cert_rotation.BrokerCerts(bundle, certs, force_renew)


def write_broker_certs(data_dir: Path, brokers: cert_rotation.BrokerCerts) -> None:
    """Write each broker's directory (files replaced one by one, atomically each: a broker that reads a
    key and a certificate that do not match yet keeps its current ones and reads again)."""
    base = data_dir / TLS_DIR
    for i, pair in brokers.certs.items():
        d = base / f"broker-{i}"
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        files = ((tls.KEY_FILE, pair.key_pem), (tls.CERT_FILE, pair.cert_pem), (tls.CA_FILE, brokers.trust_bundle))
        for name, data in files:
            if not (d / name).exists() or (d / name).read_bytes() != data:
                tls.write_private(d / name, data)
