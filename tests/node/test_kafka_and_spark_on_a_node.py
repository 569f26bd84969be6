"""Other clients of a chart-installed cluster on the real node: Kafka's protocol, and Spark jobs
whose executors are pods.

One release (three brokers, replication factor 3, the operator, the Kafka listener on) in a
namespace of its own, installed with the node's values and uninstalled at the end (with its pods
gone, so the host ports are free for the next release on the node).

1. A Kafka client on the host (kafka-python: an independent implementation of the protocol)
   bootstraps from one broker's Kafka port, learns every broker's advertised address
   (NODE:9292+N), creates a topic, produces to every partition (so to every broker's listener:
   each leads one) and consumes it back; the gRPC client reads the same records.
2. A Spark job in client mode: the driver on the host (``tests/node/spark_copy_job.py``) asks the
   API server for two executor pods of the image built by ``tools/k8s-node/build-image.sh spark``
   (Spark's own Kubernetes scheduler backend, the executor pod template of manifests/spark/ with
   the host network), as the service account of manifests/spark/rbac.yaml. It reads a topic with
   committed and aborted transactions through ``format("sluice")`` and writes it with the
   exactly-once sink while the first attempt of every task fails (``sluice.test.failTask=both``:
   mid-write or after its prepare), so retries run in the pods too. The output read_committed is
   every committed input record once; the executors are the pods the API server shows, on the
   node's host network.

The measured times (image build, job) are printed (``pytest -s``) and recorded in
docs/kubernetes.md and docs/spark.md.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluice.client import Admin, Producer
from tests.node.node_cluster import KAFKA_PORT_BASE, ROOT, Node, Release, read_committed, wait_for
from tests.support.k8s_env import ExistingCluster

pytestmark = [pytest.mark.node, pytest.mark.timeout(1800)]

PARTITIONS = 3
SPARK_RBAC = ROOT / "manifests" / "spark" / "rbac.yaml"
EXECUTOR_TEMPLATE = ROOT / "manifests" / "spark" / "executor-pod-template-host-network.yaml"
SPARK_JOB = Path(__file__).with_name("spark_copy_job.py")
SPARK_NAMESPACE = "sluice-jobs"  # manifests/spark/rbac.yaml's
RECORDS = 3000


@pytest.fixture(scope="module")
def release(node: Node, node_cluster: ExistingCluster) -> Iterator[Release]:
    rel = Release(node_cluster, node_cluster.create_namespace("sluice-clients"))
    took = rel.install()
    print(f"\nhelm install to all pods Ready: {took:.1f} s")
    yield rel
    rel.uninstall()


# -- Kafka clients ------------------------------------------------------------------------------


def test_a_kafka_client_on_the_host_reaches_every_broker_at_its_advertised_address(release: Release) -> None:
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import NewTopic

    bootstrap = release.kafka_address(1)  # any broker's: each one knows every other's address
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="node-test", request_timeout_ms=30_000)
    try:
        cluster = admin.describe_cluster()
        advertised = sorted((b["broker_id"], b["host"], b["port"]) for b in cluster["brokers"])
        assert advertised == [(b, release.node_ip, KAFKA_PORT_BASE + b) for b in range(3)]
        admin.create_topics([NewTopic("kafka-in", num_partitions=PARTITIONS, replication_factor=3)])
    finally:
        admin.close()
    with Admin(release.bootstrap()) as grpc_admin:
        leaders = wait_for(
            lambda: {p.leader for p in grpc_admin.describe_topic("kafka-in").partitions} == {0, 1, 2}, 60,
            "a leader on each broker for kafka-in's three partitions",
        )  # fmt: skip
        assert leaders

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5)
    sent: dict[tuple[int, int], bytes] = {}  # (partition, offset) -> value, as the brokers acknowledged them
    try:
        values = [f"kafka-{i}".encode() for i in range(300)]
        futures = [producer.send("kafka-in", value=v, partition=i % PARTITIONS) for i, v in enumerate(values)]
        for value, future in zip(values, futures, strict=True):
            meta = future.get(timeout=60)
            sent[(meta.partition, meta.offset)] = value
    finally:
        producer.close(timeout=30)
    assert sorted({p for p, _ in sent}) == [0, 1, 2]

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, isolation_level="read_committed",
        auto_offset_reset="earliest", consumer_timeout_ms=1000,
    )  # fmt: skip
    got: dict[tuple[int, int], bytes] = {}
    try:
        consumer.assign([TopicPartition("kafka-in", p) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 120
        while len(got) < len(sent) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=1000).values():
                got.update({(r.partition, r.offset): r.value for r in records})
    finally:
        consumer.close()
    assert got == sent
    # The same records through the gRPC client: one log, two protocols.
    assert Counter(read_committed(release, "kafka-in")) == Counter(sent.values())


# -- Spark ----------------------------------------------------------------------------------------


def fill_input(release: Release) -> list[bytes]:
    """RECORDS committed records over PARTITIONS partitions, and one aborted transaction in each
    partition among them; returns the committed values."""
    with Admin(release.bootstrap()) as admin:
        for topic in ("spark-in", "spark-out"):
            admin.create_topic(topic, partitions=PARTITIONS, replication_factor=3)
    committed = [f"spark-{i}".encode() for i in range(RECORDS)]
    producer = Producer(release.bootstrap(), acks="all", linger_ms=5)
    try:
        for i, value in enumerate(committed[: RECORDS // 2]):
            producer.send("spark-in", key=value, value=value, partition=i % PARTITIONS)
        producer.flush()
    finally:
        producer.close()
    aborting = Producer(release.bootstrap(), transactional_id="spark-node-aborted")
    try:
        aborting.init_transactions()
        aborting.begin_transaction()
        for p in range(PARTITIONS):
            aborting.send("spark-in", value=f"aborted-{p}".encode(), partition=p)
        aborting.flush()
        aborting.abort_transaction()
    finally:
        aborting.close()
    producer = Producer(release.bootstrap(), acks="all", linger_ms=5)
    try:
        for i, value in enumerate(committed[RECORDS // 2 :], start=RECORDS // 2):
            producer.send("spark-in", key=value, value=value, partition=i % PARTITIONS)
        producer.flush()
    finally:
        producer.close()
    return committed


def driver_credentials(release: Release, workdir: Path) -> tuple[Path, Path]:
    """The CA of the node's API server and a token of manifests/spark/rbac.yaml's service account
    (the driver may then do what that Role allows, nothing more)."""
    config: Any = release.k8s.kubectl_json("config", "view", "--raw", "--minify")
    ca = workdir / "api-ca.crt"
    ca.write_bytes(base64.b64decode(config["clusters"][0]["cluster"]["certificate-authority-data"]))
    token = release.k8s.kubectl("create", "token", "spark", "-n", SPARK_NAMESPACE, "--duration=1h").stdout.strip()
    token_file = workdir / "spark.token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    return ca, token_file


class PodWatcher:
    """Polls the executor pods of the Spark namespace while the job runs: what each one was seen as."""

    def __init__(self, release: Release) -> None:
        self.release = release
        self.seen: dict[str, dict[str, Any]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.wait(2.0):
            try:
                pods: Any = self.release.k8s.kubectl_json(
                    "get", "pods", "-n", SPARK_NAMESPACE, "-l", "spark-role=executor", timeout=20
                )
            except Exception:  # the API server is busy: try again on the next round
                continue
            for pod in pods["items"]:
                status = pod.get("status") or {}
                running = any((c.get("state") or {}).get("running") for c in status.get("containerStatuses") or [])
                name = pod["metadata"]["name"]
                if running or name not in self.seen:
                    self.seen[name] = {
                        "hostNetwork": pod["spec"].get("hostNetwork", False),
                        "node": pod["spec"].get("nodeName"),
                        "image": pod["spec"]["containers"][0]["image"],
                        "podIP": status.get("podIP"),
                        "running": running or self.seen.get(name, {}).get("running", False),
                    }

    def __enter__(self) -> PodWatcher:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


def test_a_spark_job_with_executor_pods_copies_a_topic_exactly_once(
    release: Release, node: Node, tmp_path: Path
) -> None:
    import pyspark

    image, built_s = node.image("spark", env={"SLUICE_PYSPARK_VERSION": pyspark.__version__})
    print(f"\nSpark image {image} current and in the node's containerd after {built_s:.1f} s")
    release.k8s.kubectl("apply", "-f", str(SPARK_RBAC))
    ca, token = driver_credentials(release, tmp_path)
    committed = fill_input(release)

    api_port = os.environ.get("SLUICE_NODE_PORT", "16443")
    prefix = "spark-node-copy"
    job = {
        "conf": {
            "spark.master": f"k8s://https://127.0.0.1:{api_port}",
            "spark.submit.deployMode": "client",
            "spark.kubernetes.namespace": SPARK_NAMESPACE,
            "spark.kubernetes.container.image": image,
            "spark.kubernetes.container.image.pullPolicy": "Never",
            "spark.kubernetes.executor.podTemplateFile": str(EXECUTOR_TEMPLATE),
            "spark.kubernetes.executor.podNamePrefix": "sluice-node-copy",
            "spark.kubernetes.authenticate.caCertFile": str(ca),
            "spark.kubernetes.authenticate.oauthTokenFile": str(token),
            "spark.executor.instances": "2",
            "spark.executor.cores": "1",
            "spark.executor.memory": "512m",
            # The pod's memory limit is heap + overhead, and the Python workers count against it.
            "spark.executor.memoryOverhead": "1g",
            # Requests small enough for two executors beside three brokers on 2 shared cores.
            "spark.kubernetes.executor.request.cores": "100m",
            # The driver on the host, at the node's address (where the executors on the host
            # network reach it); every port random, as two executors share the node's.
            "spark.driver.host": release.node_ip,
            "spark.driver.bindAddress": release.node_ip,
            "spark.blockManager.port": "0",
            "spark.ui.port": "0",
            # Start the job only with both executors registered (so both pods take part).
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.scheduler.maxRegisteredResourcesWaitingTime": "600s",
            "spark.task.maxFailures": "4",
        },
        "read": {"bootstrap.servers": release.bootstrap(), "subscribe": "spark-in", "minPartitions": "6"},
        "write": {
            "bootstrap.servers": release.bootstrap(),
            "topic": "spark-out",
            "transactionalIdPrefix": prefix,
            "sluice.test.failTask": "both",
        },
    }
    env = {
        **os.environ,
        # The executors run the driver's PYSPARK_PYTHON; "python3" is the right one on both sides.
        "PYSPARK_PYTHON": "python3",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    started = time.monotonic()
    with PodWatcher(release) as pods, open(tmp_path / "driver.log", "wb") as log:
        proc = subprocess.run(
            [sys.executable, str(SPARK_JOB), json.dumps(job)], stdout=subprocess.PIPE, stderr=log, env=env,
            timeout=900, cwd=tmp_path,
        )  # fmt: skip
    took = time.monotonic() - started
    driver_log = (tmp_path / "driver.log").read_text(errors="replace")
    lines = proc.stdout.decode().strip().splitlines()
    assert proc.returncode == 0 and lines, f"driver exited {proc.returncode}\n{driver_log[-6000:]}"
    result = json.loads(lines[-1])
    assert result["ok"], f"{result.get('error')}\n{driver_log[-6000:]}"
    print(
        f"Spark job in {took:.1f} s (session with both executors {result['session_s']} s, copy "
        f"{result['copy_s']} s); executors {result['executors']}"
    )

    # Exactly once: every committed input record, none of the aborted ones, nothing twice.
    copied = Counter(read_committed(release, "spark-out"))
    assert [v for v, n in copied.items() if n > 1] == [], "duplicates in the output"
    lost, extra = set(committed) - set(copied), set(copied) - set(committed)
    assert not lost and not extra, f"lost {len(lost)} records, e.g. {sorted(lost)[:5]}; extra {sorted(extra)[:5]}"
    with Admin(release.bootstrap()) as admin:
        left = [
            t.transactional_id for t in admin.list_transactions()
            if t.transactional_id.startswith(prefix) and t.state not in ("CompleteCommit", "CompleteAbort", "Empty")
        ]  # fmt: skip
    assert left == [], f"transactions of the job left open or prepared: {left}"

    # The executors were the two pods the API server showed, on the node's host network, of the image.
    names = {f"sluice-node-copy-exec-{i}" for i in (1, 2)}
    assert set(result["pods"]) == names, result["pods"]
    for name in names:
        seen = pods.seen.get(name)
        assert seen is not None, f"executor pod {name} never seen through the API ({sorted(pods.seen)})"
        assert seen["running"] and seen["hostNetwork"] is True and seen["image"] == image, seen
        assert seen["podIP"] == release.node_ip and seen["node"] == release.node()["metadata"]["name"], seen
    workers = [e for e in result["executors"] if e["id"] != "driver"]
    assert sorted(e["id"] for e in workers) == ["1", "2"], result["executors"]
    assert all(e["hostPort"].startswith(f"{release.node_ip}:") for e in workers), workers
    # Every task ran in an executor, the failed first attempts too (6 copy tasks, one failure each).
    assert sum(e["failedTasks"] for e in workers) >= 6, workers
    assert all(e["completedTasks"] > 0 for e in workers), workers
    driver = [e for e in result["executors"] if e["id"] == "driver"]
    assert all(e["totalTasks"] == 0 for e in driver), driver
    # spark.stop() deleted the executor pods.
    wait_for(
        lambda: release.k8s.kubectl_json("get", "pods", "-n", SPARK_NAMESPACE, "-l", "spark-role=executor")["items"]
        == [],
        120, "the executor pods deleted after the job",
    )  # fmt: skip
