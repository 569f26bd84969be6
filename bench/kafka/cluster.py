"""A local Apache Kafka cluster in KRaft mode (no ZooKeeper), for side-by-side benchmarks.

    with KafkaCluster(nodes=3) as kafka:
        kafka.bootstrap_servers   # "127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3"
        kafka.pids()              # the broker JVMs, for CPU and memory accounting

Each node is a combined broker+controller JVM (``process.roles=broker,controller``) with a static
quorum of all nodes, PLAINTEXT on 127.0.0.1 on ports the kernel picked free (with
``inter_broker_tls``, the brokers replicate over a mutual-TLS listener of their own, as Strimzi
runs Kafka and as Sluice's brokers always replicate; clients stay on PLAINTEXT). The storage is
formatted with a new cluster id in a fresh directory (a temporary one unless ``data_dir`` is
given and kept), as Sluice's bench starts a fresh ``LocalCluster``. The settings mirror what
``LocalCluster(brokers=N)`` sets: 3 partitions by default, replication factor min(N, 3) for new and
internal topics, ``min.insync.replicas`` 2 with three or more nodes, no automatic topic creation,
no group rebalance delay. Kafka's defaults are kept otherwise, in particular no fsync per write
(Sluice does not sync its RocksDB WAL per write either) and ``compression.type=producer``.

A node is started when its log says ``Kafka Server started``; :meth:`restart` times that, which is
the start-up figure of the scale benchmarks. Nodes run in their own session (so a Ctrl-C of the
benchmark reaches them only through :meth:`close`) and are stopped by pid, SIGTERM first
(Kafka's controlled shutdown), SIGKILL after ``stop_timeout``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from bench.kafka.fetch import DEFAULT_VERSION, classpath, ensure_jars
from sluice.testing import free_port

HERE = Path(__file__).resolve().parent
LOG4J = HERE / "log4j2.properties"
# kafka-run-class.sh's JVM flags, so the broker runs as Kafka's own scripts would run it.
JVM_FLAGS = [
    "-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent", "-XX:MaxInlineLevel=15", "-Djava.awt.headless=true",
]  # fmt: skip
STARTED = "Kafka Server started"


class KafkaError(RuntimeError):
    """A node did not start, or a Kafka tool failed."""


def java() -> str:
    home = os.environ.get("JAVA_HOME")
    exe = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not exe:
        raise KafkaError("java is not on PATH (Kafka needs Java 17 or newer)")
    return exe


def java_command(lib: Path, main: str, args: list[str], *, heap: str, tool: bool) -> list[str]:
    """The command line of one Kafka JVM: a tool (warnings to stderr) or a broker (INFO to stdout)."""
    log = ["-Dsluice.bench.log.target=SYSTEM_ERR", "-Dsluice.bench.log.level=WARN"] if tool else []
    heap_flags = [f"-Xmx{heap}"] if tool else [f"-Xms{heap}", f"-Xmx{heap}"]
    return [java(), *heap_flags, *JVM_FLAGS, f"-Dlog4j2.configurationFile={LOG4J}", *log,
            "-cp", classpath(lib), main, *args]  # fmt: skip


def node_properties(
    node: int, nodes: int, ports: list[int], controller_ports: list[int], log_dir: Path, host: str,
    extra: Mapping[str, str] | None = None, replication: InterBrokerTls | None = None,
) -> str:  # fmt: skip
    """server.properties of node ``node`` (1-based) of a combined KRaft cluster of ``nodes``."""
    rf = min(nodes, 3)
    min_isr = 2 if nodes >= 3 else 1
    voters = ",".join(f"{i + 1}@{host}:{controller_ports[i]}" for i in range(nodes))
    listeners = f"PLAINTEXT://{host}:{ports[node - 1]},CONTROLLER://{host}:{controller_ports[node - 1]}"
    advertised = f"PLAINTEXT://{host}:{ports[node - 1]}"
    inter_broker = {"inter.broker.listener.name": "PLAINTEXT"}
    protocols = "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
    if replication is not None:  # a REPLICATION listener on mutual TLS, the one brokers use
        rport = replication.ports[node - 1]
        listeners += f",REPLICATION://{host}:{rport}"
        advertised += f",REPLICATION://{host}:{rport}"
        protocols += ",REPLICATION:SSL"
        inter_broker = replication.properties(node)
    props = {
        "process.roles": "broker,controller",
        "node.id": str(node),
        "controller.quorum.voters": voters,
        "listeners": listeners,
        "advertised.listeners": advertised,
        "controller.listener.names": "CONTROLLER",
        **inter_broker,
        "listener.security.protocol.map": protocols,
        "log.dirs": str(log_dir),
        "num.partitions": "3",
        "default.replication.factor": str(rf),
        "min.insync.replicas": str(min_isr),
        "offsets.topic.replication.factor": str(rf),
        "transaction.state.log.replication.factor": str(rf),
        "transaction.state.log.min.isr": str(min_isr),
        "share.coordinator.state.topic.replication.factor": str(rf),
        "share.coordinator.state.topic.min.isr": str(min_isr),
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "false",
        # Kafka's defaults, written out because the comparison depends on them.
        "log.flush.interval.messages": str(2**63 - 1),
        "compression.type": "producer",
    }
    props.update(extra or {})
    return "".join(f"{k}={v}\n" for k, v in props.items())


class InterBrokerTls:
    """Replication between Kafka's brokers over mutual TLS, as Strimzi runs it (and as Sluice's
    brokers always replicate): a REPLICATION listener per node with a certificate from a CA made for
    the cluster, client certificates required, PEM files (Kafka reads them since KIP-651)."""

    def __init__(self, nodes: int, host: str, directory: Path) -> None:
        from sluice import tls

        self.ports = [free_port(host) for _ in range(nodes)]
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        ca = tls.generate_ca("sluice-bench-kafka-ca")
        (directory / "ca.pem").write_bytes(ca.cert_pem)
        for node in range(1, nodes + 1):
            pair = tls.issue(ca, f"kafka-{node}", ip_addresses=[host])
            # a PEM key store: the private key (PKCS#8, unencrypted) and then the certificate
            tls.write_private(directory / f"node-{node}.pem", pair.key_pem + pair.cert_pem)

    def properties(self, node: int) -> dict[str, str]:
        prefix = "listener.name.replication."
        return {
            "inter.broker.listener.name": "REPLICATION",
            f"{prefix}ssl.keystore.type": "PEM",
            f"{prefix}ssl.keystore.location": str(self.directory / f"node-{node}.pem"),
            f"{prefix}ssl.truststore.type": "PEM",
            f"{prefix}ssl.truststore.location": str(self.directory / "ca.pem"),
            f"{prefix}ssl.client.auth": "required",
        }


class KafkaCluster:
    """``nodes`` combined KRaft nodes on ``host``; see the module docstring.

    ``inter_broker_tls``: brokers replicate over mutual TLS (:class:`InterBrokerTls`); clients keep
    the PLAINTEXT listener."""

    def __init__(
        self,
        nodes: int = 1,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        version: str = DEFAULT_VERSION,
        heap: str = "1g",
        config: Mapping[str, str] | None = None,
        host: str = "127.0.0.1",
        start_timeout: float = 120.0,
        stop_timeout: float = 30.0,
        inter_broker_tls: bool = False,
    ) -> None:
        if not 1 <= nodes <= 9:
            raise ValueError(f"nodes must be 1..9, not {nodes}")
        self.nodes = nodes
        self.version = version
        self.heap = heap
        self.host = host
        self.config = dict(config or {})
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._tmp: str | None = None
        if data_dir is None:
            self._tmp = tempfile.mkdtemp(prefix="sluice-kafka-")
            data_dir = self._tmp
        self.data_dir = Path(data_dir).resolve()
        self.ports = [free_port(host) for _ in range(nodes)]
        self.controller_ports = [free_port(host) for _ in range(nodes)]
        self.replication = InterBrokerTls(nodes, host, self.data_dir / "tls") if inter_broker_tls else None
        self.lib: Path | None = None
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._log_offsets: dict[int, int] = {}  # where in its log a node's current run starts
        self.cluster_id = ""

    # -- paths ----------------------------------------------------------------------------------

    def log_dir(self, node: int) -> Path:
        return self.data_dir / f"node-{node}"

    def config_path(self, node: int) -> Path:
        return self.data_dir / f"node-{node}.properties"

    def log_path(self, node: int) -> Path:
        return self.data_dir / f"node-{node}.log"

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"{self.host}:{p}" for p in self.ports)

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs.values() if p.poll() is None]

    # -- life cycle -----------------------------------------------------------------------------

    def start(self) -> KafkaCluster:
        """Format fresh storage (unless already formatted in a kept ``data_dir``) and start every node."""
        self.lib = ensure_jars(self.version)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        id_file = self.data_dir / "cluster.id"
        self.cluster_id = id_file.read_text().strip() if id_file.exists() else ""
        if not self.cluster_id:
            # Kafka's cluster ids are 16 random bytes in URL-safe base64 without padding.
            import base64

            # As Kafka's own Uuid.randomUuid(), never one that starts with "-": the storage tool would
            # take it for an option ("--cluster-id: expected one argument"), one start in 64.
            while not self.cluster_id or self.cluster_id.startswith("-"):
                self.cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            for i in range(1, self.nodes + 1):
                self._write_config(i)
                self._format(i)
            id_file.write_text(self.cluster_id + "\n")
        try:
            for i in range(1, self.nodes + 1):
                self._launch(i)
            for i in range(1, self.nodes + 1):
                self._wait_started(i, time.monotonic() + self.start_timeout)
        except BaseException:
            self.close()
            raise
        return self

    def _write_config(self, node: int) -> None:
        text = node_properties(node, self.nodes, self.ports, self.controller_ports, self.log_dir(node),
                               self.host, self.config, self.replication)  # fmt: skip
        self.config_path(node).write_text(f"# written by bench/kafka/cluster.py, Kafka {self.version}\n{text}")

    def _format(self, node: int) -> None:
        assert self.lib is not None
        cmd = java_command(self.lib, "kafka.tools.StorageTool",
                           ["format", "-t", self.cluster_id, "-c", str(self.config_path(node))],
                           heap="256m", tool=True)  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if proc.returncode != 0:
            raise KafkaError(f"formatting node {node} failed:\n{(proc.stdout + proc.stderr)[-2000:]}")

    def _launch(self, node: int) -> None:
        assert self.lib is not None
        old = self._procs.get(node)
        if old is not None and old.poll() is None:
            raise KafkaError(f"node {node} is already running (pid {old.pid})")
        cmd = java_command(self.lib, "kafka.Kafka", [str(self.config_path(node))], heap=self.heap, tool=False)
        cmd.insert(1, f"-Xlog:gc*:file={self.data_dir / f'node-{node}-gc.log'}:time,tags:filecount=2,filesize=20M")
        log = open(self.log_path(node), "ab")  # noqa: SIM115 (the child owns the descriptor)
        try:
            self._procs[node] = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        finally:
            log.close()

    def _wait_started(self, node: int, deadline: float) -> None:
        proc = self._procs[node]
        path = self.log_path(node)
        start_offset = self._log_offsets.get(node, 0)
        while True:
            with open(path, "rb") as f:
                f.seek(start_offset)
                if STARTED.encode() in f.read():
                    return
            if proc.poll() is not None:
                raise KafkaError(f"Kafka node {node} exited ({proc.returncode}); last lines:\n{self.log_tail(node)}")
            if time.monotonic() > deadline:
                raise KafkaError(f"Kafka node {node} not started in time; last lines:\n{self.log_tail(node)}")
            time.sleep(0.1)

    def log_tail(self, node: int, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path(node).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, node: int, *, hard: bool = False) -> None:
        """Stop node ``node``: SIGTERM (controlled shutdown) or, with ``hard``, SIGKILL."""
        proc = self._procs.get(node)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGKILL if hard else signal.SIGTERM)
        try:
            proc.wait(timeout=self.stop_timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)

    def restart(self, node: int, *, hard: bool = False) -> float:
        """Stop node ``node`` and start it again on the same data; seconds from launch to started."""
        self.stop(node, hard=hard)
        self._log_offsets[node] = self.log_path(node).stat().st_size if self.log_path(node).exists() else 0
        t0 = time.perf_counter()
        self._launch(node)
        self._wait_started(node, time.monotonic() + self.start_timeout)
        return time.perf_counter() - t0

    def close(self) -> None:
        for node in list(self._procs):
            self.stop(node)
        self._procs.clear()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
