"""The test control plane is a real, secured API server: it serves, stores, authenticates and authorizes.

Everything the other Kubernetes tests rely on: objects round-trip through etcd, the server's own
validation rejects bad objects, client certificates name users and groups, and RBAC is on (a
service account or a user without grants is forbidden, and a RoleBinding is what lets it in).
"""

from __future__ import annotations

import json

import pytest

from sluice.testing import poll_until
from tests.support.k8s_env import ControlPlaneError, KubeCluster, TestControlPlane


def test_serves_a_1_3x_release_and_is_ready(k8s: KubeCluster) -> None:
    assert k8s.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
    version = json.loads(k8s.kubectl("version", "-o", "json").stdout)
    server = version["serverVersion"]
    assert server["major"] == "1"
    assert int(server["minor"].rstrip("+")) >= 30
    assert server["gitVersion"].startswith(f"v1.{server['minor'].rstrip('+')}.")


def test_objects_round_trip_and_bad_ones_are_rejected(k8s: KubeCluster, k8s_namespace: str) -> None:
    k8s.kubectl("create", "configmap", "settings", "-n", k8s_namespace, "--from-literal=retention.ms=604800000")
    cm = k8s.kubectl_json("get", "configmap", "settings", "-n", k8s_namespace)
    assert cm["data"] == {"retention.ms": "604800000"}

    bad = k8s.kubectl("create", "configmap", "Not_A_DNS_Name", "-n", k8s_namespace, "--from-literal=a=b", check=False)
    assert bad.returncode != 0
    assert "Invalid value" in bad.stderr and "RFC 1123" in bad.stderr


def test_rbac_forbids_a_service_account_until_a_role_grants_it(k8s: KubeCluster, k8s_namespace: str) -> None:
    sa = k8s.service_account_kubeconfig(k8s_namespace, "nobody")
    whoami = json.loads(k8s.kubectl("auth", "whoami", "-o", "json", kubeconfig=sa).stdout)
    assert whoami["status"]["userInfo"]["username"] == f"system:serviceaccount:{k8s_namespace}:nobody"

    denied = k8s.kubectl("get", "configmaps", "-n", k8s_namespace, kubeconfig=sa, check=False)
    assert denied.returncode != 0
    assert "Forbidden" in denied.stderr or "forbidden" in denied.stderr
    assert (
        k8s.kubectl(
            "auth", "can-i", "list", "configmaps", "-n", k8s_namespace, kubeconfig=sa, check=False
        ).stdout.strip()
        == "no"
    )

    k8s.kubectl("create", "role", "read-configmaps", "-n", k8s_namespace, "--verb=get,list", "--resource=configmaps")
    k8s.kubectl(
        "create",
        "rolebinding",
        "nobody-reads",
        "-n",
        k8s_namespace,
        "--role=read-configmaps",
        f"--serviceaccount={k8s_namespace}:nobody",
    )
    # RBAC reaches the authorizer through a watch: the grant takes effect within moments (bounded).
    assert poll_until(
        lambda: k8s.kubectl("get", "configmaps", "-n", k8s_namespace, kubeconfig=sa, check=False).returncode == 0,
        timeout=15,
    )
    # The grant is exactly what the Role says: still no secrets, still nothing in other namespaces.
    assert k8s.kubectl("get", "secrets", "-n", k8s_namespace, kubeconfig=sa, check=False).returncode != 0
    assert k8s.kubectl("get", "configmaps", "-n", "default", kubeconfig=sa, check=False).returncode != 0


def test_client_certificates_name_users_and_groups(control_plane: TestControlPlane) -> None:
    alice = control_plane.user_kubeconfig("alice", groups=["developers"])
    whoami = json.loads(control_plane.kubectl("auth", "whoami", "-o", "json", kubeconfig=alice).stdout)
    assert whoami["status"]["userInfo"]["username"] == "alice"
    assert "developers" in whoami["status"]["userInfo"]["groups"]
    assert control_plane.kubectl("get", "namespaces", kubeconfig=alice, check=False).returncode != 0

    admin = control_plane.user_kubeconfig("root", groups=["system:masters"])
    assert "default" in control_plane.kubectl("get", "namespaces", "-o", "name", kubeconfig=admin).stdout


def test_a_failing_command_reports_what_the_server_said(k8s: KubeCluster) -> None:
    with pytest.raises(ControlPlaneError, match=r"NotFound|not found"):
        k8s.kubectl("get", "namespace", "no-such-namespace-anywhere")
