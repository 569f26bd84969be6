"""The single-node cluster of tools/k8s-node, as the node tests drive it.

:class:`Node` starts it with ``tools/k8s-node/node.sh up`` (which builds what is missing: the
image, the pause image; the binaries come from tools/k8s-testenv/build.sh) and stops it with
``down``, so a test session leaves nothing running. Everything here acts on real things: helm
and kubectl against the node's API server, broker processes found in the host's /proc and
killed with SIGKILL, the brokers' PersistentVolume directories on the host's disk.

Brokers run on the host network (the chart's hostNetwork option): broker N listens on
NODE_IP:9092+N, which is also the address it registers, so the test process on the host reaches
them as any client would; its Kafka-protocol listener (the node's values turn it on) is on
NODE_IP:9292+N, the address it advertises to Kafka clients.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from sluice.client import Consumer, TopicPartition
from tests.support import waiting
from tests.support.k8s_env import ExistingCluster

# tests/support/waiting.wait_for as the node's tests use it: a check that raises (a pod between states,
# kubectl answering an error) is "not yet"; every check runs kubectl, so it is not repeated too often.
wait_for = functools.partial(waiting.wait_for, interval=0.5, tolerate=(Exception,))

ROOT = Path(__file__).resolve().parents[2]
NODE_SH = ROOT / "tools" / "k8s-node" / "node.sh"
VALUES = ROOT / "tools" / "k8s-node" / "values.yaml"
CHART = ROOT / "charts" / "sluice"
MACHINE_CANNOT = 3  # node.sh check's exit status when the machine itself lacks something
GRPC_PORT_BASE = 9092  # the chart's broker.port: broker N on NODE_IP:9092+N
KAFKA_PORT_BASE = 9292  # the chart's hostNetwork.kafkaPortBase


class NodeUnavailable(RuntimeError):
    """The machine cannot run the node (no root, or the kernel lacks a feature): the tests skip."""


def node_sh(*args: str, timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(NODE_SH), *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


class Node:
    """The node: ``up()`` / ``down()``, and a :class:`ExistingCluster` on it (kubectl, helm)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.cluster: ExistingCluster | None = None
        self.up_seconds = 0.0

    def up(self) -> ExistingCluster:
        checked = node_sh("check", timeout=60)
        if checked.returncode == MACHINE_CANNOT:
            raise NodeUnavailable(checked.stdout.strip() or checked.stderr.strip())
        if checked.returncode != 0:
            raise RuntimeError(f"tools/k8s-node/node.sh check: {checked.stdout}{checked.stderr}")
        started = time.monotonic()
        result = node_sh("up", timeout=1500)
        (self.workdir / "node-up.log").write_text(result.stderr)
        if result.returncode != 0:
            raise RuntimeError(f"tools/k8s-node/node.sh up failed:\n{result.stderr[-4000:]}")
        self.up_seconds = time.monotonic() - started
        self.cluster = ExistingCluster(Path(result.stdout.strip().splitlines()[-1]), self.workdir)
        return self.cluster

    def image(self, name: str, env: dict[str, str] | None = None) -> tuple[str, float]:
        """``node.sh image NAME``: the image built if not current and in the node's containerd;
        its reference and how long that took."""
        started = time.monotonic()
        result = node_sh("image", name, timeout=1500, env=env)
        (self.workdir / f"image-{name}.log").write_text(result.stderr)
        if result.returncode != 0:
            raise RuntimeError(f"tools/k8s-node/node.sh image {name} failed:\n{result.stderr[-4000:]}")
        return result.stdout.strip().splitlines()[-1], time.monotonic() - started

    def down(self) -> None:
        result = node_sh("down", timeout=300)
        if result.returncode != 0:
            raise RuntimeError(f"tools/k8s-node/node.sh down failed:\n{result.stderr[-4000:]}")
        left = leftovers()
        if left:
            raise RuntimeError(f"tools/k8s-node/node.sh down left processes running: {left}")


def leftovers() -> list[str]:
    """Processes of the node still running: any whose command line names its state directory
    (every daemon, shim and container of the node does, through its config, socket or root)."""
    state = os.environ.get("SLUICE_NODE_DIR", "/var/lib/sluice-node")
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if state in cmdline:
                found.append(f"{entry.name}: {cmdline[:120]}")
    # Containers: anything left in the cgroups the kubelet made for pods.
    for procs in Path("/sys/fs/cgroup").glob("*/kubepods/**/cgroup.procs"):
        found += [f"{pid} in {procs.parent}" for pid in procs.read_text().split()]
    return found


class Release:
    """One Helm release of the chart on the node, in a namespace of its own."""

    def __init__(self, cluster: ExistingCluster, namespace: str, name: str = "sluice") -> None:
        self.k8s = cluster
        self.namespace = namespace
        self.name = name
        self.node_ip = next(a["address"] for a in self.node()["status"]["addresses"] if a["type"] == "InternalIP")
        self.install_seconds = 0.0
        self.replicas_peak = 3  # the most brokers it has had (each left a PersistentVolumeClaim)

    # -- objects ---------------------------------------------------------------------------------

    def node(self) -> dict[str, Any]:
        nodes: Any = self.k8s.kubectl_json("get", "nodes")
        return dict(nodes["items"][0])

    def get(self, kind: str, name: str) -> dict[str, Any]:
        return dict(self.k8s.kubectl_json("get", kind, name, "-n", self.namespace))

    def items(self, kind: str, *selector: str) -> list[dict[str, Any]]:
        found: Any = self.k8s.kubectl_json("get", kind, "-n", self.namespace, *selector)
        return list(found["items"])

    def apply(self, obj: dict[str, Any]) -> None:
        self.k8s.kubectl("apply", "-n", self.namespace, "-f", "-", input=json.dumps(obj))

    def helm(self, *args: str, timeout: float = 600.0) -> subprocess.CompletedProcess[str]:
        return self.k8s.helm(*args, "--namespace", self.namespace, timeout=timeout)

    def values_args(self) -> list[str]:
        port = os.environ.get("SLUICE_NODE_PORT", "16443")
        return ["-f", str(VALUES), "--set", f"hostNetwork.apiServer.port={port}"]

    def install(self, brokers: int = 3) -> float:
        """``helm install`` with the node's values, until every broker pod and the operator are
        Ready; returns the seconds that took."""
        started = time.monotonic()
        self.helm("install", self.name, str(CHART), *self.values_args())
        wait_for(lambda: len(self.brokers()) == brokers and all(self.ready(p) for p in self.brokers()), 300,
                 f"{brokers} broker pods Ready")  # fmt: skip
        operator = ("pods", "-l", "app.kubernetes.io/component=operator")
        wait_for(lambda: (pods := self.items(*operator)) and all(self.ready(p) for p in pods), 120,
                 "the operator pod Ready")  # fmt: skip
        self.install_seconds = time.monotonic() - started
        return self.install_seconds

    def uninstall(self) -> None:
        """``helm uninstall`` and, bounded, until no pod of the release is left (their host ports
        are free again for the next release on this node)."""
        self.helm("uninstall", self.name, "--wait", "--timeout", "180s", timeout=200)
        wait_for(lambda: self.items("pods") == [], 180, "every pod of the release gone")

    # -- brokers ---------------------------------------------------------------------------------

    def broker_pod(self, broker: int) -> dict[str, Any]:
        return self.get("pod", f"{self.name}-broker-{broker}")

    def brokers(self) -> list[dict[str, Any]]:
        return self.items("pods", "-l", f"app.kubernetes.io/instance={self.name},app.kubernetes.io/component=broker")

    @staticmethod
    def ready(pod: dict[str, Any]) -> bool:
        if pod["metadata"].get("deletionTimestamp"):
            return False
        conditions = (pod.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def address(self, broker: int) -> str:
        return f"{self.node_ip}:{GRPC_PORT_BASE + broker}"

    def bootstrap(self, brokers: int = 3) -> str:
        return ",".join(self.address(b) for b in range(brokers))

    def kafka_address(self, broker: int) -> str:
        """Where broker ``broker``'s Kafka-protocol listener is, and what it advertises."""
        return f"{self.node_ip}:{KAFKA_PORT_BASE + broker}"

    def broker_pid(self, broker: int) -> int:
        """The host PID of broker ``broker``'s process (its command line names its listen port)."""
        needle = f"--listen={self.address(broker)}"
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            words = [a.decode(errors="replace") for a in argv]
            if "broker" in words and needle in words and not any(w.endswith("/sh") for w in words[:1]):
                return int(entry.name)
        raise AssertionError(f"no process of broker {broker} ({needle}) on this machine")

    def sigkill(self, broker: int) -> int:
        pid = self.broker_pid(broker)
        os.kill(pid, signal.SIGKILL)
        return pid

    def restarts(self, broker: int) -> int:
        statuses = (self.broker_pod(broker).get("status") or {}).get("containerStatuses") or []
        return int(statuses[0]["restartCount"]) if statuses else 0

    def volume_dir(self, broker: int) -> Path:
        """The host directory of broker ``broker``'s PersistentVolume (a local volume of the node)."""
        claim = self.get("pvc", f"data-{self.name}-broker-{broker}")
        pv = self.k8s.kubectl_json("get", "pv", claim["spec"]["volumeName"])
        spec: Any = pv["spec"]
        return Path(spec["local"]["path"])

    def logs(self, tail: int = 40) -> str:
        out = []
        for pod in self.items("pods"):
            name = pod["metadata"]["name"]
            got = self.k8s.kubectl("logs", "-n", self.namespace, name, f"--tail={tail}", check=False, timeout=20)
            out.append(f"--- {name}\n{got.stdout}{got.stderr}")
        return "\n".join(out)


def read_committed(release: Release, topic: str, partitions: int = 3) -> list[bytes]:
    """Every committed value of ``topic``, read from the beginning to the end of each partition
    (bounded: 120 s) through the gRPC client."""
    consumer = Consumer(release.bootstrap(), group_id=None, isolation_level="read_committed")
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    consumer.assign(tps)
    consumer.seek_to_beginning()
    ends = consumer.end_offsets(tps)
    out: list[bytes] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not all(consumer.position(tp) >= ends[tp] for tp in tps):
        out.extend(r.value for r in consumer.poll(timeout=0.5) if r.value is not None)
    consumer.close()
    return out
