"""ServiceAccount tokens for the token-listener tests: real ones from the TokenRequest API, and
hand-signed ones (forged with another key, or expired but signed with the control plane's own
service-account key) to show what the brokers refuse and why."""

from __future__ import annotations

import base64
import hashlib
import json
import time
import uuid
from pathlib import Path

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from sluice.testing.certs import broker_tls_dirs
from tests.k8s.sluice_on_k8s import HOSTS, SluiceOnK8s
from tests.support.k8s_env import SERVICE_ACCOUNT_ISSUER, KubeCluster


def request_token(k8s: KubeCluster, namespace: str, account: str, audience: str | None = "sluice") -> str:
    """A token of ``namespace/account`` from the API server's TokenRequest API (10 minutes)."""
    args = ["create", "token", account, "-n", namespace, "--duration=10m"]
    if audience is not None:
        args.append(f"--audience={audience}")
    return str(k8s.kubectl(*args).stdout.strip())


def write_token(directory: Path, name: str, token: str) -> Path:
    path = directory / f"{name}.token"
    path.write_text(token)
    path.chmod(0o600)
    return path


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def signed_token(
    key: ec.EllipticCurvePrivateKey, namespace: str, account: str, uid: str, *, audience: str, expires_in: float
) -> str:
    """A JWT shaped as the API server's bound ServiceAccount tokens, signed ES256 with ``key``."""
    now = int(time.time())
    der = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    header = {"alg": "ES256", "kid": _b64(hashlib.sha256(der).digest())}
    claims = {
        "aud": [audience],
        "exp": int(now + expires_in),
        "iat": now - 700,
        "nbf": now - 700,
        "iss": SERVICE_ACCOUNT_ISSUER,
        "jti": str(uuid.uuid4()),
        "sub": f"system:serviceaccount:{namespace}:{account}",
        "kubernetes.io": {"namespace": namespace, "serviceaccount": {"name": account, "uid": uid}},
    }
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
    r, s = decode_dss_signature(key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
    return f"{signing_input}.{_b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


def control_plane_signing_key(workdir: Path) -> ec.EllipticCurvePrivateKey:
    """The test control plane's service-account signing key (what kube-apiserver signs tokens with)."""
    key = serialization.load_pem_private_key((workdir / "pki" / "sa.key").read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return key


ONE_BROKER = {
    "default.replication.factor": "1",
    "transaction.state.log.replication.factor": "1",
    "offsets.topic.replication.factor": "1",
    "min.insync.replicas": "1",
}


def start_token_cluster(
    k8s: KubeCluster, namespace: str, workdir: Path, super_user: str, *, kafka_port: int | None = None
) -> tuple[SluiceOnK8s, Path]:
    """One broker whose client listener is ``token`` (audience ``sluice``) with the authorizer on
    and ``super_user`` its super user, behind a Pod as in the other tests; and the cluster CA file
    clients verify it with. ``kafka_port``: its Kafka listener too, on that port (SASL OAUTHBEARER)."""
    import grpc

    cluster = SluiceOnK8s(k8s, namespace, workdir, brokers=1)
    ca_file = broker_tls_dirs(workdir, [0], HOSTS[0])[0] / "ca.crt"
    cluster.broker_args = ["--client-listener", "token"]
    if kafka_port is not None:
        cluster.broker_args += ["--kafka-listen", f"{HOSTS[0]}:{kafka_port}"]
    cluster.health_credentials = grpc.ssl_channel_credentials(ca_file.read_bytes())
    try:
        cluster.start({**ONE_BROKER, "authorizer.enabled": "true", "super.users": super_user})
    except BaseException:
        cluster.close()
        raise
    return cluster, ca_file
