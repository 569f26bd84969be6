"""Installing the project's CRDs (manifests/crds/) and policies into a test cluster, once per session."""

from __future__ import annotations

from pathlib import Path

from sluice.testing._net import poll_until
from tests.support.k8s_env import KubeCluster

ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = ROOT / "manifests" / "crds"
POLICY_DIR = ROOT / "manifests" / "policies"
KINDS = ("topics", "coordinators", "transactionalids", "metadatadocuments", "sluiceusers", "sluicerebalances")
PEERING_CRD = "kopfpeerings.kopf.dev"
ESTABLISHED_S = 180


def install_crds(k8s: KubeCluster) -> None:
    """Apply every CRD and wait until the API server serves them (bounded)."""
    k8s.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=sluice-tests", "-f", str(CRD_DIR))
    # 180 s: on a 2-core machine under load (a benchmark beside the suite) the API server once took
    # longer than 60 s to establish one; a healthy one takes well under a second.
    for kind in KINDS:
        k8s.kubectl("wait", "--for=condition=Established", f"--timeout={ESTABLISHED_S}s", f"crd/{kind}.sluice.dev")
    k8s.kubectl("wait", "--for=condition=Established", f"--timeout={ESTABLISHED_S}s", f"crd/{PEERING_CRD}")

    def served() -> bool:
        return all(k8s.kubectl("get", kind, "-A", check=False).returncode == 0 for kind in KINDS)

    assert poll_until(served, timeout=30, interval=0.2), "the CRDs were established but are not served"
