"""A token listener against the real API server: ServiceAccount tokens checked with TokenReview.

One broker (a real process, its metadata in the test API server) serves ``--client-listener
token``: TLS, and every call carries a ServiceAccount token that the broker reviews with the API
server for the audience ``sluice``. Clients are the real Producer and Admin with
``security_protocol="SASL_SSL"`` and a token file. Tokens come from the TokenRequest API
(``kubectl create token``), as a pod's projected token does; forged and expired ones are signed
by hand (the expired one with the control plane's own signing key, and the same token with a
future expiry is accepted, so it is the expiry that is refused).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from sluice import errors
from sluice.client import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    Admin,
    Producer,
    ResourcePatternType,
    ResourceType,
    TopicPartition,
)
from tests.k8s.crds import install_crds
from tests.k8s.sluice_on_k8s import SluiceOnK8s
from tests.k8s.tokens import (
    control_plane_signing_key,
    request_token,
    signed_token,
    start_token_cluster,
    write_token,
)
from tests.support.k8s_env import KubeCluster, TestControlPlane

# "sluice-broker-0": a ServiceAccount named like a broker (brokers are super users, but only by a
# cluster-CA certificate: peers.ClusterIdentity)
ACCOUNTS = ("admin", "app", "other", "sluice-broker-0")


@pytest.fixture(scope="module")
def token_cluster(k8s: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SluiceOnK8s, Path]]:
    """One broker serving a token listener (the authorizer on, ServiceAccount admin its super user)."""
    install_crds(k8s)
    ns = k8s.create_namespace("sluice-tokens")
    for account in ACCOUNTS:
        k8s.kubectl("create", "serviceaccount", account, "-n", ns)
    cluster, ca_file = start_token_cluster(k8s, ns, tmp_path_factory.mktemp("tokens"), f"ServiceAccount:{ns}:admin")
    try:
        yield cluster, ca_file
    finally:
        cluster.close()
        k8s.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)


def client_kwargs(cluster: SluiceOnK8s, ca_file: Path, token_file: Path | None) -> dict[str, Any]:
    if token_file is None:
        return {"bootstrap_servers": cluster.bootstrap_servers, "security_protocol": "SSL", "ssl_cafile": str(ca_file)}
    return {
        "bootstrap_servers": cluster.bootstrap_servers,
        "security_protocol": "SASL_SSL",
        "ssl_cafile": str(ca_file),
        "sasl_oauthbearer_token_file": str(token_file),
    }


def produce(kwargs: dict[str, Any], topic: str = "orders") -> None:
    with Producer(**kwargs, request_timeout_ms=10_000, max_block_ms=20_000) as producer:
        producer.send(topic, b"record", partition=0).get(timeout=30)


def write_acl(who: str, op: AclOperation, name: str = "orders") -> AclBinding:
    return AclBinding(ResourceType.TOPIC, name, ResourcePatternType.LITERAL, who, "*", op, AclPermissionType.ALLOW)


def test_a_service_account_token_authenticates_a_producer_and_its_acls_apply(
    k8s: KubeCluster, token_cluster: tuple[SluiceOnK8s, Path], tmp_path: Path
) -> None:
    cluster, ca_file = token_cluster
    ns = cluster.namespace
    tokens = {a: write_token(tmp_path, a, request_token(k8s, ns, a)) for a in ACCOUNTS}
    with Admin(**client_kwargs(cluster, ca_file, tokens["admin"])) as admin:  # the super user
        admin.create_topic("orders", 1, 1)

        # Authenticated, but no ACL: refused with Kafka's authorization error.
        with pytest.raises(errors.TopicAuthorizationFailedError):
            produce(client_kwargs(cluster, ca_file, tokens["app"]))
        admin.create_acls([write_acl(f"ServiceAccount:{ns}:app", AclOperation.WRITE)])
        produce(client_kwargs(cluster, ca_file, tokens["app"]))  # the principal is ServiceAccount:<ns>:app
        with pytest.raises(errors.TopicAuthorizationFailedError):
            produce(client_kwargs(cluster, ca_file, tokens["other"]))  # another account: not its ACL
        latest = admin.list_offsets({TopicPartition("orders", 0): Admin.LATEST})
        assert latest[TopicPartition("orders", 0)].offset == 1  # exactly the one allowed record
        admin.delete_acls([AclBindingFilter(principal=f"ServiceAccount:{ns}:app")])
        with pytest.raises(errors.TopicAuthorizationFailedError):
            produce(client_kwargs(cluster, ca_file, tokens["app"]))


def test_missing_foreign_forged_and_expired_tokens_are_refused(
    k8s: KubeCluster, control_plane: TestControlPlane, token_cluster: tuple[SluiceOnK8s, Path], tmp_path: Path
) -> None:
    cluster, ca_file = token_cluster
    ns = cluster.namespace

    def describe_acls(token: Path | None) -> None:
        with Admin(**client_kwargs(cluster, ca_file, token), request_timeout_ms=10_000) as admin:
            admin.describe_acls(AclBindingFilter())

    with pytest.raises(errors.SaslAuthenticationFailedError, match="authorization: Bearer"):
        describe_acls(None)  # TLS, but no token
    api_audience = write_token(tmp_path, "api", request_token(k8s, ns, "admin", audience=None))
    with pytest.raises(errors.SaslAuthenticationFailedError, match="authentication failed"):
        describe_acls(api_audience)  # the super user's token, but for the API server: never accepted here
    uid = str(k8s.kubectl_json("get", "serviceaccount", "admin", "-n", ns)["metadata"]["uid"])  # type: ignore[index]
    forged = signed_token(ec.generate_private_key(ec.SECP256R1()), ns, "admin", uid, audience="sluice", expires_in=600)
    with pytest.raises(errors.SaslAuthenticationFailedError):
        describe_acls(write_token(tmp_path, "forged", forged))
    key = control_plane_signing_key(control_plane.workdir)
    expired = signed_token(key, ns, "admin", uid, audience="sluice", expires_in=-60)
    with pytest.raises(errors.SaslAuthenticationFailedError):
        describe_acls(write_token(tmp_path, "expired", expired))
    # The same token, signed the same way but not expired, is the super user's: it is the expiry
    # that was refused above, not how the test signs.
    fresh = signed_token(key, ns, "admin", uid, audience="sluice", expires_in=600)
    describe_acls(write_token(tmp_path, "fresh", fresh))


def test_a_client_follows_its_token_file_when_it_is_rotated(
    k8s: KubeCluster, token_cluster: tuple[SluiceOnK8s, Path], tmp_path: Path
) -> None:
    cluster, ca_file = token_cluster
    ns = cluster.namespace
    path = write_token(tmp_path, "rotating", request_token(k8s, ns, "other"))
    with Admin(**client_kwargs(cluster, ca_file, path), request_timeout_ms=10_000) as admin:
        with pytest.raises(errors.ClusterAuthorizationFailedError):
            admin.describe_acls(AclBindingFilter())  # "other" is no super user
        # what the kubelet does: a new token swapped in by rename (here the super user's)
        staged = write_token(tmp_path, "staged", request_token(k8s, ns, "admin"))
        staged.replace(path)
        deadline = time.monotonic() + 30
        while True:  # bounded: the same client must succeed with the new token
            try:
                admin.describe_acls(AclBindingFilter())
                break
            except errors.ClusterAuthorizationFailedError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)


def test_a_token_named_like_a_broker_is_an_ordinary_principal(
    k8s: KubeCluster, token_cluster: tuple[SluiceOnK8s, Path], tmp_path: Path
) -> None:
    cluster, ca_file = token_cluster
    ns = cluster.namespace
    token = write_token(tmp_path, "broker-named", request_token(k8s, ns, "sluice-broker-0"))
    admin_token = write_token(tmp_path, "admin", request_token(k8s, ns, "admin"))
    with Admin(**client_kwargs(cluster, ca_file, admin_token)) as admin:  # the super user
        admin.create_topic("broker-named", 1, 1)
    with Admin(**client_kwargs(cluster, ca_file, token), request_timeout_ms=10_000) as admin:
        # authenticated (ServiceAccount:<ns>:sluice-broker-0), but no super user: brokers are known
        # by cluster-CA certificates only, never by a token
        with pytest.raises(errors.ClusterAuthorizationFailedError):
            admin.describe_acls(AclBindingFilter())
        with pytest.raises(errors.TopicAuthorizationFailedError):
            produce(client_kwargs(cluster, ca_file, token), topic="broker-named")
