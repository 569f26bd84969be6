"""TransactionalId ``allowedUsers`` enforced by the brokers' authorizer.

The operator's own handler (``reconcile_transactional_id``) writes the ``transactional_ids/<id>``
document into a secure LocalCluster's metadata store (the SQLite store stands where the
Kubernetes one would, as in test_operator_handlers.py); real brokers then let only the listed
principals use the id, without an ACL on it, and refuse everybody else even with one. A spec
change moves the right; removing the fields hands the id back to ACLs alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kopf
import pytest

from sluice import errors
from sluice.acls import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType
from sluice.client import Admin, Producer
from sluice.metadata import open_store
from sluice.operator.handlers.runtime import OperatorRuntime
from sluice.operator.handlers.transactional_ids import reconcile_transactional_id
from sluice.operator.settings import OperatorSettings
from sluice.testing import LocalCluster

TXN = "orders-copier"


@pytest.fixture
def secure(tmp_path: Path) -> Iterator[tuple[LocalCluster, OperatorRuntime]]:
    with LocalCluster(brokers=1, data_dir=tmp_path / "c", secure=True) as c:
        settings = OperatorSettings(namespace="test", metadata_url=str(c.metadata_path), expected_brokers=1)
        ops = OperatorRuntime(settings, open_store(settings.metadata_url))
        try:
            yield c, ops
        finally:
            ops.close()


def _body(generation: int, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "copier", "namespace": "test", "generation": generation},
        "spec": {"transactionalId": TXN, **spec},
        "status": {},
    }


def _allow(principal: str, rtype: ResourceType, name: str, op: AclOperation) -> AclBinding:
    return AclBinding(rtype, name, ResourcePatternType.LITERAL, principal, "*", op, AclPermissionType.ALLOW)


def _transaction(cluster: LocalCluster, user: str) -> str:
    """Run one transaction on TXN as ``user``: "ok", or the authorization error's class name."""
    producer = Producer(**cluster.client_config(user), transactional_id=TXN, request_timeout_ms=15_000)
    try:
        producer.init_transactions(timeout=30)
        producer.begin_transaction()
        producer.send("out", f"by {user}".encode(), partition=0)
        producer.commit_transaction(timeout=30)
        return "ok"
    except (errors.TransactionalIdAuthorizationFailedError, errors.TopicAuthorizationFailedError) as exc:
        return type(exc).__name__
    finally:
        producer.close()


def _eventually(check: Callable[[], dict[str, str]], expected: dict[str, str], timeout: float = 60.0) -> None:
    """The brokers follow the metadata store by polling: wait (bounded) until they answer as expected."""
    deadline = time.monotonic() + timeout
    got: dict[str, str] = {}
    for _ in range(60):
        got = check()
        if got == expected or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    assert got == expected


def test_allowed_users_decide_who_uses_the_transactional_id(secure: tuple[LocalCluster, OperatorRuntime]) -> None:
    cluster, ops = secure
    with Admin(**cluster.client_config("admin")) as admin:
        admin.create_topic("out", 1, 1)
        admin.create_acls(
            [
                _allow("User:alice", ResourceType.TOPIC, "out", AclOperation.WRITE),
                _allow("User:bob", ResourceType.TOPIC, "out", AclOperation.WRITE),
                # bob may use the id by ACL: the resource's list overrides it while it is set
                _allow("User:bob", ResourceType.TRANSACTIONAL_ID, TXN, AclOperation.WRITE),
            ]
        )

    def both() -> dict[str, str]:
        return {u: _transaction(cluster, u) for u in ("alice", "bob")}

    refused = "TransactionalIdAuthorizationFailedError"
    # without a TransactionalId resource: ACLs alone (bob has one, alice has none)
    assert both() == {"alice": refused, "bob": "ok"}

    patch = kopf.Patch()
    reconcile_transactional_id(_body(1, allowedUsers=["alice"]), patch, ops, describe=False)
    doc = ops.meta.get(f"transactional_ids/{TXN}")
    assert doc is not None and doc.value == {
        "transactional_id": TXN,
        "resource": "test/copier",
        "allowed_principals": ["User:alice"],
    }
    not_supported = next(c for c in patch["status"]["conditions"] if c["type"] == "NotSupported")
    assert not_supported["status"] == "False"
    _eventually(both, {"alice": "ok", "bob": refused})

    # the spec changes: the operator rewrites the list, the brokers follow
    reconcile_transactional_id(_body(2, allowedUsers=["bob"]), kopf.Patch(), ops, describe=False)
    assert ops.meta.get(f"transactional_ids/{TXN}").value["allowed_principals"] == ["User:bob"]  # type: ignore[union-attr]
    _eventually(both, {"alice": refused, "bob": "ok"})

    # the fields removed: back to ACLs alone
    reconcile_transactional_id(_body(3), kopf.Patch(), ops, describe=False)
    assert "allowed_principals" not in ops.meta.get(f"transactional_ids/{TXN}").value  # type: ignore[union-attr]
    _eventually(both, {"alice": refused, "bob": "ok"})

    # a DENY ACL still wins over the resource's list
    reconcile_transactional_id(_body(4, allowedUsers=["alice", "User:bob"]), kopf.Patch(), ops, describe=False)
    with Admin(**cluster.client_config("admin")) as admin:
        admin.create_acls(
            [
                AclBinding(ResourceType.TRANSACTIONAL_ID, TXN, ResourcePatternType.LITERAL, "User:alice", "*",
                           AclOperation.WRITE, AclPermissionType.DENY)
            ]
        )  # fmt: skip
    _eventually(both, {"alice": refused, "bob": "ok"})


def test_service_accounts_become_principals(
    secure: tuple[LocalCluster, OperatorRuntime],
) -> None:
    _cluster, ops = secure
    patch = kopf.Patch()
    reconcile_transactional_id(
        _body(1, allowedServiceAccounts=["apps/copier"], allowedUsers=["carol"]), patch, ops, describe=False
    )
    doc = ops.meta.get(f"transactional_ids/{TXN}")
    assert doc is not None
    assert doc.value["allowed_principals"] == ["ServiceAccount:apps:copier", "User:carol"]
    cond = next(c for c in patch["status"]["conditions"] if c["type"] == "NotSupported")
    assert (cond["status"], cond["reason"]) == ("False", "Supported")  # a token listener authenticates them
