"""Fixtures of the Kubernetes tests: a real control plane (envtest-style) or a given cluster.

* ``k8s`` (session): a :class:`tests.support.k8s_env.KubeCluster`. By default a
  :class:`~tests.support.k8s_env.TestControlPlane` (etcd + kube-apiserver on loopback, client
  certificates, RBAC, service-account tokens; binaries from ``tools/k8s-testenv/build.sh``),
  started once for the session and stopped after it. With ``SLUICE_TEST_KUBECONFIG`` set, the
  suite runs against that cluster instead (a kind cluster, see docs/kubernetes.md) and starts
  nothing. Its API: ``k8s.kubeconfig`` (path), ``k8s.server`` (URL), ``k8s.kubectl(*args,
  input=None, check=True)``, ``k8s.kubectl_json(*args)``, ``k8s.helm(*args)``, ``k8s.apply(yaml)``,
  ``k8s.create_namespace()``, ``k8s.service_account_kubeconfig(ns, name)``.
* ``k8s_namespace``: a fresh namespace for one test (deleted afterwards without waiting: with no
  controller-manager, the test control plane leaves it Terminating, which harms nothing).
* ``control_plane``: the session's TestControlPlane itself, for tests that need its CA
  (``user_kubeconfig``); skipped against an external cluster, where there is no such thing.

The binaries missing is an error, not a skip: CI builds them (.ci/run), and a developer gets the
command to run in the error.

When a test fails, the tail of the API server's log is added to its report.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.k8s_env import ExistingCluster, KubeCluster, TestControlPlane

_LOG_LINES = 40


@pytest.fixture(scope="session")
def k8s(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeCluster]:
    workdir = tmp_path_factory.mktemp("k8s")
    external = os.environ.get("SLUICE_TEST_KUBECONFIG")
    if external:
        with ExistingCluster(Path(external), workdir) as cluster:
            yield cluster
        return
    with TestControlPlane(workdir) as plane:
        yield plane


@pytest.fixture
def control_plane(k8s: KubeCluster) -> TestControlPlane:
    if not isinstance(k8s, TestControlPlane):
        pytest.skip("needs the suite's own test control plane (SLUICE_TEST_KUBECONFIG names another cluster)")
    return k8s


@pytest.fixture
def k8s_namespace(k8s: KubeCluster) -> Iterator[str]:
    name = k8s.create_namespace()
    yield name
    k8s.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed and "k8s" in getattr(item, "fixturenames", ()):
        plane = item.funcargs.get("k8s") if hasattr(item, "funcargs") else None
        if isinstance(plane, TestControlPlane) and plane.apiserver is not None:
            report.sections.append(("kube-apiserver log (tail)", plane.apiserver.log_tail(_LOG_LINES)))
