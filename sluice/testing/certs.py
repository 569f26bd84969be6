"""A local cluster's certificate authority and broker certificates, kept in its data directory.

Layout (every file mode 0600, every directory 0700)::

    tls/cluster-ca.crt, tls/cluster-ca.key   the cluster CA: signs broker certificates only
    tls/broker-N/{ca.crt,tls.crt,tls.key}    broker N's material for --broker-tls-dir

Made on the first start and reused after (a data directory started again keeps its CA, so a
restarted broker still trusts the others). A broker added later gets a certificate from the
same CA. Nothing here is a stand-in: the brokers run the same mutual TLS as in production.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from sluice import tls

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
    ca = load_or_create_ca(base, CLUSTER_CA, "sluice-local-cluster-ca")
    out: dict[int, Path] = {}
    for i in broker_ids:
        d = base / f"broker-{i}"
        if not all((d / f).exists() for f in (tls.CA_FILE, tls.CERT_FILE, tls.KEY_FILE)):
            tls.write_dir(d, ca.cert_pem, tls.issue_broker(ca, i, [host]))
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
