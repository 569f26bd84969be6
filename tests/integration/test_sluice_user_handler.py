"""The SluiceUser handler's ACLs enforced by real brokers (no Kubernetes needed).

The operator's own handler (``reconcile_user``, ``delete_user``) writes into a secure
LocalCluster's metadata store (the SQLite store stands where the Kubernetes one would, as in
test_txn_id_allowed_users.py). A ``tls`` SluiceUser's principal is ``User:<name>``, which is what
the cluster's client certificates for that name authenticate as: alice is refused before the
resource, allowed once it is reconciled, refused again when a spec change drops the ACL and when
the resource is deleted; an ACL made by hand through Admin stays. The same path runs on
Kubernetes in tests/k8s/test_users.py (the operator process, the CRD, a token listener).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kopf
import pytest

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
)
from sluice.metadata import open_store
from sluice.operator.handlers.runtime import OperatorRuntime
from sluice.operator.handlers.users import delete_user, reconcile_user
from sluice.operator.settings import OperatorSettings
from sluice.testing import LocalCluster


@pytest.fixture
def secure(tmp_path: Path) -> Iterator[tuple[LocalCluster, OperatorRuntime]]:
    with LocalCluster(brokers=1, data_dir=tmp_path / "c", secure=True) as c:
        settings = OperatorSettings(namespace="test", metadata_url=str(c.metadata_path), expected_brokers=1)
        ops = OperatorRuntime(settings, open_store(settings.metadata_url))
        try:
            yield c, ops
        finally:
            ops.close()


def body(generation: int, *acls: dict[str, Any], name: str = "alice") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "test", "generation": generation, "uid": f"uid-{name}"},
        "spec": {"authentication": {"type": "tls"}, "authorization": {"acls": list(acls)}},
        "status": {},
    }


def write(topic: str) -> dict[str, Any]:
    return {"resource": {"type": "topic", "name": topic}, "operations": ["Write"]}


def produces(cluster: LocalCluster, user: str) -> bool:
    try:
        with Producer(**cluster.client_config(user), request_timeout_ms=10_000, max_block_ms=20_000) as producer:
            producer.send("orders", b"x", partition=0).get(timeout=30)
        return True
    except (errors.TopicAuthorizationFailedError, errors.ClusterAuthorizationFailedError):
        return False


def eventually(check: Any, expected: bool, timeout: float = 60.0) -> None:
    """The brokers follow the store by polling: wait (bounded) for the answer."""
    deadline = time.monotonic() + timeout
    for _ in range(100):
        if check() == expected:
            return
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    raise AssertionError(f"still {not expected} after {timeout} s")


def test_a_users_acls_are_enforced_diffed_and_removed(secure: tuple[LocalCluster, OperatorRuntime]) -> None:
    cluster, ops = secure
    with Admin(**cluster.client_config("admin")) as admin:
        admin.create_topic("orders", 1, 1)
        by_hand = AclBinding(ResourceType.TOPIC, "audit", ResourcePatternType.LITERAL, "User:alice", "*",
                             AclOperation.READ, AclPermissionType.ALLOW)  # fmt: skip
        admin.create_acls([by_hand])
        assert not produces(cluster, "alice")

        patch = kopf.Patch()
        reconcile_user(body(1, write("orders")), patch, ops)
        ready = next(c for c in patch["status"]["conditions"] if c["type"] == "Ready")
        assert (ready["status"], ready["reason"]) == ("True", "AclsApplied")
        assert (patch["status"]["principal"], patch["status"]["acls"]) == ("User:alice", 1)
        certificate = next(c for c in patch["status"]["conditions"] if c["type"] == "CertificateIssued")
        assert (certificate["status"], certificate["reason"]) == ("False", "NoClientsCA")
        eventually(lambda: produces(cluster, "alice"), True)
        assert not produces(cluster, "bob")

        reconcile_user(body(2, write("other")), kopf.Patch(), ops)  # the spec no longer allows orders
        eventually(lambda: produces(cluster, "alice"), False)
        reconcile_user(body(3, write("orders")), kopf.Patch(), ops)
        eventually(lambda: produces(cluster, "alice"), True)

        delete_user(body(3), ops)
        eventually(lambda: produces(cluster, "alice"), False)
        assert admin.describe_acls(AclBindingFilter(principal="User:alice")) == [by_hand]


def test_an_invalid_spec_changes_nothing_and_says_why(secure: tuple[LocalCluster, OperatorRuntime]) -> None:
    cluster, ops = secure
    reconcile_user(body(1, write("orders")), kopf.Patch(), ops)
    patch = kopf.Patch()
    bad = {"resource": {"type": "group", "name": "g"}, "operations": ["Write"]}
    reconcile_user(body(2, write("orders"), bad), patch, ops)
    ready = next(c for c in patch["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert "acls[1]" in ready["message"] and "GROUP has no operation Write" in ready["message"]
    with Admin(**cluster.client_config("admin")) as admin:  # the last valid spec's ACL is still there
        assert [b.name for b in admin.describe_acls(AclBindingFilter(principal="User:alice"))] == ["orders"]
    patch = kopf.Patch()
    reconcile_user(body(1, write("orders"), name="sluice-broker-0"), patch, ops)
    ready = next(c for c in patch["status"]["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "InvalidSpec" and "cluster's own" in ready["message"]
