"""Helpers only this project's tests use (imported as ``tests.support``; not shipped in the wheel).

* :mod:`tests.support.k8s_env`: an envtest-style Kubernetes control plane (etcd and
  kube-apiserver on loopback) for tests/k8s.

What users' own tests may import stays in the package, :mod:`sluice.testing` (LocalCluster).
"""
