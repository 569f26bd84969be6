"""A Sluice cluster on the test control plane: broker processes on 127.0.0.10-12, Pods, the operator.

There is no kubelet on these machines, so what a kubelet would do the test does: each broker is
a real ``python -m sluice.broker`` process on its own loopback address (127.0.0.10, .11, .12,
the same port, the way pods have their own IPs), with ``--metadata kubernetes://NAMESPACE`` (the
Kubernetes MetadataStore: custom resources through the API server), and a Pod object
``sluice-broker-N`` whose status (Ready, podIP) the test sets, as a kubelet would from the
readiness probe. The operator runs as ``sluice operator`` in a subprocess with the admin
kubeconfig. Nothing is mocked: the brokers, the operator and the API server are the real ones.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sluice.metadata import open_store
from sluice.metadata.kubernetes import KubernetesMetadataStore, api_client
from sluice.metadata.topic_view import TopicView
from sluice.testing._net import SERVING, check_health, poll_until, port_is_free
from sluice.testing._process import ManagedProcess, stop_all
from sluice.testing.certs import broker_tls_dirs
from tests.support import waiting
from tests.support.k8s_env import KubeCluster

# tests/support/waiting.wait_for as the Kubernetes tests use it: resources move between states, so a
# check that raises (a resource not there yet, a broker moving) is "not yet"; the last error is reported.
wait_for = functools.partial(waiting.wait_for, interval=0.2, tolerate=(Exception,))

HOSTS = ("127.0.0.10", "127.0.0.11", "127.0.0.12", "127.0.0.13")  # a fourth for a broker that joins later
SELECTOR = {"app.kubernetes.io/name": "sluice", "app.kubernetes.io/component": "broker"}
INTERNAL_PARTITIONS = 4
BROKER_CONFIG = {
    "default.replication.factor": "3",
    "transaction.state.log.replication.factor": "3",
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.num.partitions": str(INTERNAL_PARTITIONS),
    "offsets.topic.num.partitions": str(INTERNAL_PARTITIONS),
    "min.insync.replicas": "2",
    "replica.lag.time.max.ms": "3000",
}


def common_port(hosts: tuple[str, ...] = HOSTS, after: int = 0) -> int:
    """A port free on every host (brokers share a port on distinct addresses, like pods), above ``after``."""
    for port in range(max(20000 + os.getpid() % 20000, after + 1), 60000, 7):
        if all(port_is_free(h, port) for h in hosts):
            return port
    raise RuntimeError("no port free on every broker address")


class SluiceOnK8s:
    """Brokers, their Pods and the operator in one namespace (see the module docstring)."""

    def __init__(self, k8s: KubeCluster, namespace: str, workdir: Path, brokers: int = 3) -> None:
        from kubernetes import client

        self.k8s = k8s
        self.namespace = namespace
        self.workdir = workdir
        self.count = brokers
        self.port = common_port(HOSTS[:brokers])
        self.inter_broker_port = common_port(HOSTS[:brokers], after=self.port)
        self.url = f"kubernetes://{namespace}?kubeconfig={k8s.kubeconfig}"
        self.env = {**os.environ, "KUBECONFIG": str(k8s.kubeconfig), "PYTHONUNBUFFERED": "1"}
        self.env.pop("KUBERNETES_SERVICE_HOST", None)
        self.api = api_client(str(k8s.kubeconfig))
        self.core: Any = client.CoreV1Api(self.api)
        self.custom: Any = client.CustomObjectsApi(self.api)
        self.store: KubernetesMetadataStore = open_store(self.url)  # type: ignore[assignment]
        self.brokers: dict[int, ManagedProcess] = {}
        # the interpreter every process starts with: a NetworkPartitions wrapper gives each its own group id
        self.python = sys.executable
        self.operator: ManagedProcess | None = None
        self.extra_operators: list[ManagedProcess] = []
        # each broker's --broker-tls-dir: by default a certificate of a local CA (sluice.testing.certs);
        # tests of the operator's certificates point it at a projection of the operator's Secret
        self.tls_dirs: dict[int, Path] = {}
        # More broker arguments (a secure client listener) and the TLS credentials its health
        # checks then need; the health service itself needs no token.
        self.broker_args: list[str] = []
        self.health_credentials: Any = None

    # -- addresses --------------------------------------------------------------------------------

    def address(self, i: int) -> str:
        return f"{HOSTS[i]}:{self.port}"

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(self.address(i) for i in range(self.count))

    # -- pods -------------------------------------------------------------------------------------

    def pod_name(self, i: int) -> str:
        return f"sluice-broker-{i}"

    def create_pod(self, i: int) -> None:
        self.core.create_namespaced_pod(
            self.namespace,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": self.pod_name(i), "labels": dict(SELECTOR)},
                "spec": {"containers": [{"name": "broker", "image": "sluice:test"}]},
            },
        )

    def set_ready(self, i: int, ready: bool) -> None:
        """What the kubelet does from the readiness probe: the Pod's Ready condition and podIP."""
        status = "True" if ready else "False"
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.core.patch_namespaced_pod_status(
            self.pod_name(i),
            self.namespace,
            {
                "status": {
                    "phase": "Running",
                    "podIP": HOSTS[i],
                    "conditions": [
                        {"type": "Ready", "status": status, "lastTransitionTime": now},
                        {"type": "ContainersReady", "status": status, "lastTransitionTime": now},
                    ],
                }
            },
        )

    def delete_pod(self, i: int) -> None:
        self.core.delete_namespaced_pod(self.pod_name(i), self.namespace, grace_period_seconds=0)

    # -- brokers ----------------------------------------------------------------------------------

    def start_broker(self, i: int, config: Mapping[str, str] | None = None) -> None:
        settings = {**BROKER_CONFIG, **(config or {})}
        argv = [
            self.python, "-m", "sluice.broker",
            "--id", str(i),
            "--listen", self.address(i),
            "--data", str(self.workdir / f"broker-{i}"),
            "--metadata", self.url,
            # brokers reach each other only on the inter-broker port, mutual TLS with the cluster CA
            "--inter-broker-listen", f"{HOSTS[i]}:{self.inter_broker_port}",
            "--broker-tls-dir", str(self.tls_dirs.get(i) or broker_tls_dirs(self.workdir, [i], HOSTS[i])[i]),
        ]  # fmt: skip
        argv += self.broker_args
        for key, value in settings.items():
            argv += ["--config", f"{key}={value}"]
        if i not in self.brokers:
            self.brokers[i] = ManagedProcess(f"broker-{i}", argv, self.workdir / f"broker-{i}.log", env=self.env)
        self.brokers[i].start()

    def wait_serving(self, i: int, timeout: float = 90.0) -> None:
        def serving() -> bool:
            return check_health(self.address(i), credentials=self.health_credentials) == SERVING

        if not poll_until(serving, timeout=timeout, interval=0.2):
            raise AssertionError(f"broker {i} not SERVING within {timeout} s\n{self.brokers[i].log_tail()}")

    def start(self, config: Mapping[str, str] | None = None) -> None:
        for i in range(self.count):
            self.create_pod(i)
            self.set_ready(i, False)
            self.start_broker(i, config)
        for i in range(self.count):
            self.wait_serving(i)
            self.set_ready(i, True)

    def kill(self, i: int) -> None:
        self.brokers[i].kill()

    def restart(self, i: int) -> None:
        self.start_broker(i)
        self.wait_serving(i)

    # -- operator ---------------------------------------------------------------------------------

    def start_operator(self, *extra: str, identity: str = "operator-a", gid: int | None = None) -> None:
        """Start the operator; ``gid``: its group id under a NetworkPartitions wrapper (``python``)."""
        argv = [
            self.python, "-m", "sluice.operator.main",
            "--namespace", self.namespace,
            "--metadata", self.url,
            "--broker-selector", ",".join(f"{k}={v}" for k, v in SELECTOR.items()),
            "--pod-grace-s", "2",
            "--preferred-leader-delay-s", "2",
            "--reconcile-interval-s", "3",
            "--status-interval-s", "1",
            "--liveness", "",
            "--brokers", str(self.count),
            *extra,
        ]  # fmt: skip
        if self.operator is None:
            env = {**self.env, "HOSTNAME": identity, **({} if gid is None else {"SLUICE_TEST_GID": str(gid)})}
            self.operator = ManagedProcess("operator", argv, self.workdir / "operator.log", env=env)
        self.operator.start()

    def start_second_operator(self, identity: str = "operator-b", gid: int | None = None) -> ManagedProcess:
        """Another replica, as a Deployment with replicas: 2 would run."""
        assert self.operator is not None
        env = {**self.env, "HOSTNAME": identity, **({} if gid is None else {"SLUICE_TEST_GID": str(gid)})}
        second = ManagedProcess("operator-2", self.operator.argv, self.workdir / "operator-2.log", env=env)
        second.start()
        self.extra_operators.append(second)
        return second

    def stop_operator(self) -> None:
        if self.operator is not None and self.operator.is_alive():
            self.operator.stop(timeout=30)

    # -- reading state ----------------------------------------------------------------------------

    def topic_doc(self, name: str) -> dict[str, Any] | None:
        """The topic as the brokers see it: its document composed with its partition change records."""
        doc = TopicView.load(self.store, name).topic(name)
        return None if doc is None else doc.to_json()

    def leaders(self, name: str) -> list[int]:
        doc = self.topic_doc(name) or {}
        return [int(p["leader"]) for p in doc.get("partitions", [])]

    def get(self, plural: str, name: str) -> dict[str, Any]:
        return dict(self.custom.get_namespaced_custom_object("sluice.dev", "v1alpha1", self.namespace, plural, name))

    def rebalance_in_state(self, name: str, state: str) -> dict[str, Any] | None:
        """The SluiceRebalance ``name`` if its ``status.state`` is ``state``, else None (for wait_for)."""
        obj = self.get("sluicerebalances", name)
        return obj if (obj.get("status") or {}).get("state") == state else None

    def apply(self, obj: Mapping[str, Any]) -> None:
        import json

        self.k8s.kubectl("apply", "-n", self.namespace, "-f", "-", input=json.dumps(obj))

    def events(self) -> list[dict[str, Any]]:
        return [self.api.sanitize_for_serialization(e) for e in self.core.list_namespaced_event(self.namespace).items]

    def logs(self) -> str:
        parts = [f"--- {p.name}\n{p.log_tail(60)}" for p in self.brokers.values()]
        for op in ([self.operator] if self.operator is not None else []) + self.extra_operators:
            parts.append(f"--- {op.name}\n{op.log_tail(120)}")
        return "\n".join(parts)

    def lease_holder(self) -> str:
        from kubernetes import client

        lease = client.CoordinationV1Api(self.api).read_namespaced_lease("sluice-controller", self.namespace)
        return str(lease.spec.holder_identity or "")

    def close(self) -> None:
        operators = [op for op in [*self.extra_operators, self.operator] if op is not None and op.is_alive()]
        stop_all(operators, timeout=30)
        # Together, and briefly: with the controller gone, each broker's controlled shutdown waits
        # out its timeout (one after another, that was 45-60 s of every test's teardown). A test
        # that needs a clean stop stops its broker itself.
        stop_all([p for p in self.brokers.values() if p.is_alive()], timeout=10)
        self.store.close()
        self.api.close()
