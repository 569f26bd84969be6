"""A full disk in Kubernetes: the operator fences the broker and says so on its Pod (issue 13, section 2).

A real API server, three real brokers with the Kubernetes MetadataStore, the operator in a
subprocess (tests/k8s/sluice_on_k8s.py). Broker 2's data directory is a small tmpfs mounted by the
test (root, as CI runs). While a producer writes, the test fills that filesystem: broker 2 records
``log_dir_failure`` in its ``brokers/2`` document through the API server, and the operator's
controller moves every leadership off it and out of every ISR (the Pod stays Ready: what moves
leadership is the document, not the readiness probe, which the test plays the kubelet for) and
posts Warning Events ``LogDirOffline`` and ``LogDirLowSpace`` on Pod ``sluice-broker-2``. After a
clean stop (exit 0), freed space and a restart, ``LogDirOnline`` and ``LogDirSpaceOk`` follow and
broker 2 is back in every ISR. Nothing
acknowledged is lost. Every wait is bounded.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluice import errors
from sluice.client import Consumer, Producer, TopicPartition
from tests.support.k8s_env import KubeCluster

from .crds import install_crds
from .sluice_on_k8s import INTERNAL_PARTITIONS, SluiceOnK8s, wait_for

V1 = "sluice.dev/v1alpha1"
FULL = 2
PARTITIONS = 3


def fill(path: Path) -> None:
    with open(path, "wb", buffering=0) as f:
        for chunk in (1 << 20, 4096, 512):
            for _ in range(100_000):
                try:
                    f.write(b"\0" * chunk)
                except OSError:
                    break


@pytest.fixture(scope="module")
def sluice(k8s: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceOnK8s]:
    install_crds(k8s)
    k8s.kubectl("delete", "validatingadmissionpolicybinding", "sluice-replication-factor", "--ignore-not-found")
    namespace = k8s.create_namespace("sluice-storage")
    workdir = tmp_path_factory.mktemp("sluice-storage")
    volume = workdir / f"broker-{FULL}"
    volume.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(volume)], check=True)
    cluster = SluiceOnK8s(k8s, namespace, workdir)
    try:
        k8s.kubectl("apply", "-n", namespace, "-f", str(Path(__file__).parents[2] / "manifests/operator/peering.yaml"))
        cluster.start()
        cluster.start_operator()
        for kind in ("transaction", "group"):
            cluster.apply(
                {
                    "apiVersion": V1,
                    "kind": "Coordinator",
                    "metadata": {"name": f"{kind}s"},
                    "spec": {"type": kind, "partitions": INTERNAL_PARTITIONS, "replicationFactor": 3},
                }
            )
        yield cluster
    finally:
        cluster.close()
        subprocess.run(["umount", "-l", str(volume)], check=False)


def pod_events(cluster: SluiceOnK8s, reason: str) -> list[dict[str, Any]]:
    return [
        e
        for e in cluster.events()
        if e.get("reason") == reason and e["involvedObject"].get("name") == cluster.pod_name(FULL)
    ]


def test_a_full_disk_is_fenced_by_the_operator_with_an_event_on_the_pod(sluice: SluiceOnK8s) -> None:
    sluice.apply({"apiVersion": V1, "kind": "Topic", "metadata": {"name": "disk"},
                  "spec": {"partitions": PARTITIONS, "replicationFactor": 3}})  # fmt: skip
    wait_for(lambda: len(sluice.leaders("disk")) == PARTITIONS, 60, "the topic", logs=sluice.logs)
    producer = Producer(sluice.bootstrap_servers, acks="all", linger_ms=2)
    acked: list[bytes] = []

    def write(n: int) -> None:
        for _ in range(n):
            value = b"d%06d-" % len(acked) + b"x" * 400
            try:
                producer.send("disk", value=value, partition=len(acked) % PARTITIONS).result(timeout=60)
                acked.append(value)
            except errors.SluiceError:
                pass

    write(200)
    fill(sluice.workdir / f"broker-{FULL}" / "filler")
    write(200)  # broker 2 fails at its next write (as a follower it writes every batch)

    def fenced() -> bool:
        doc = sluice.topic_doc("disk") or {}
        return all(p["leader"] != FULL and FULL not in p["isr"] for p in doc.get("partitions", [])) and bool(doc)

    wait_for(fenced, 60, "leadership and ISR membership off broker 2", logs=sluice.logs)
    broker_doc = sluice.store.get(f"brokers/{FULL}")
    assert broker_doc is not None and broker_doc.value is not None
    assert "No space left on device" in broker_doc.value.get("log_dir_failure", "")
    offline = wait_for(lambda: pod_events(sluice, "LogDirOffline"), 30, "the LogDirOffline Event", logs=sluice.logs)
    assert offline[0]["type"] == "Warning" and "log directory is offline" in offline[0]["message"]
    low = wait_for(lambda: pod_events(sluice, "LogDirLowSpace"), 30, "the LogDirLowSpace Event", logs=sluice.logs)
    assert low[0]["type"] == "Warning" and "MiB free of" in low[0]["message"]
    write(100)  # the two others go on

    assert sluice.brokers[FULL].stop(timeout=60) == 0, sluice.brokers[FULL].log_tail()
    (sluice.workdir / f"broker-{FULL}" / "filler").unlink()
    sluice.restart(FULL)
    wait_for(lambda: pod_events(sluice, "LogDirOnline"), 60, "the LogDirOnline Event", logs=sluice.logs)
    wait_for(lambda: pod_events(sluice, "LogDirSpaceOk"), 60, "the LogDirSpaceOk Event", logs=sluice.logs)
    wait_for(
        lambda: all(FULL in p["isr"] for p in (sluice.topic_doc("disk") or {}).get("partitions", [])),
        90,
        "broker 2 back in every ISR",
        logs=sluice.logs,
    )
    producer.close()

    consumer = Consumer(sluice.bootstrap_servers, group_id=None, isolation_level="read_committed")
    tps = [TopicPartition("disk", p) for p in range(PARTITIONS)]
    consumer.assign(tps)
    got: list[bytes] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(got) < len(acked):
        got.extend(r.value for r in consumer.poll(timeout=0.5) if r.value is not None)
    consumer.close()
    assert len(got) == len(set(got)), "a record stored twice"
    assert not set(acked) - set(got), f"{len(set(acked) - set(got))} acknowledged records lost"
