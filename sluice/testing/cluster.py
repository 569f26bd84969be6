"""LocalCluster: a real Sluice cluster of broker processes on loopback.

Used by the integration tests, by ``sluice dev up``/``sluice demo``/``sluice
bench`` and by users in their own tests::

    with LocalCluster(brokers=1) as cluster:
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        cluster.kill(0); cluster.restart(0)   # crash, then recover on the same data and port

Why real processes and not an in-process server: exactly-once is about what
survives a crash. Only a separate process can be SIGKILLed in the middle of a
write, SIGSTOPped to look dead to its peers while holding its state, and
restarted on the RocksDB it left behind. Everything here is the production
broker started as ``python -m sluice.broker``, nothing is mocked.

Layout of ``data_dir``::

    metadata.sqlite      the local MetadataStore, shared by every process of the cluster
    broker-N/            broker N's RocksDB
    broker-N.log         broker N's stdout and stderr, appended across restarts
    tls/                 the cluster CA and each broker's certificate (mode 0600: sluice.testing.certs)

Brokers authenticate each other in every mode, this one included: each broker
gets a second, inter-broker port (``--inter-broker-listen``, kept across
restarts) served with mutual TLS and certificates from the cluster CA in
``tls/``. Replication and transaction markers go there; the client port
refuses them (see sluice.broker.server).
``renew_certificates()`` and ``rotate_ca()`` take the operator's certificate
steps (sluice.cert_rotation) over ``tls/``: the brokers reload the files, no
process restarts (docs/security.md, "Certificate lifecycle").

Broker ids are 0..N-1 and equal the index used by kill(i), restart(i) ...
Each broker keeps its port across restarts, so clients reconnect to the same
address the way they would to a restarted pod.

Metrics: every broker serves Prometheus metrics on a second port of its own
loopback address (``--metrics-listen``), also kept across restarts;
``metrics_url(i)`` is broker i's full URL, and :func:`sluice.testing.scrape`
reads it into samples a test can assert on.

Replication (several brokers): every broker gets the same ``--metadata``
file; that file is the cluster, as the Kubernetes API is in production.
One more process, the local controller (``python -m
sluice.operator.controller.local``, log in ``controller.log``), health-checks
the brokers and moves leadership away from a broker that stays unreachable
for ``failure_timeout_ms`` (see :mod:`sluice.operator.controller.local`). It
runs for every cluster, one broker included (there it re-elects the broker
after a restart that outlasted the timeout). It starts before the brokers
and stops after them: brokers stop with a controlled shutdown, which the
controller carries out (see ``_stop_in_order``).

With several brokers the brokers get Kafka's production-like defaults unless
``config`` says otherwise: replication factor ``min(3, brokers)`` for new
topics and both internal topics, ``min.insync.replicas=2`` from three
brokers on, and a share of the machine's disk budget each
(``log.background.write.max.bytes.per.second``: 192 MiB/s divided by the
brokers). ``leader(topic, partition)``, ``partition_state`` and
``wait_for_leader_change`` read the metadata file, which is the truth about
leadership (clients learn it later, through metadata requests).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc

from sluice import cert_rotation, errors, tls
from sluice.client import Admin, TopicPartition
from sluice.metadata import documents, keys, open_store
from sluice.metadata.documents import NO_LEADER, BrokerDocument, ControllerDocument
from sluice.metadata.store import MetadataStore
from sluice.metadata.topic_view import TopicView
from sluice.testing import replicas as replica_check
from sluice.testing._net import SERVING, check_health, free_port, poll_until, port_is_free
from sluice.testing._process import ManagedProcess, stop_all
from sluice.testing.certs import (
    broker_tls_dirs,
    client_tls_dir,
    clients_ca_file,
    controller_tls_dir,
    read_broker_certs,
    read_cluster_ca,
    write_broker_certs,
    write_cluster_ca,
)

__all__ = ["BrokerProcess", "ClusterError", "ControllerProcess", "LocalCluster"]

DEFAULT_FAILURE_TIMEOUT_MS = 5000
METADATA_CUT_FILE = "metadata-cut"  # in a broker's data directory: the broker's metadata.cut hook
CONTROLLER_METADATA_CUT_FILE = "controller-metadata-cut"  # in the cluster's data directory
MACHINE_BACKGROUND_WRITE_RATE = 192 * 1024 * 1024  # the broker's default, which one broker alone gets
SUPER_USER = "User:admin"  # of a secure LocalCluster: client_config("admin") may do everything
_REPLICATION_FACTOR_KEYS = (
    "default.replication.factor",
    "transaction.state.log.replication.factor",
    "offsets.topic.replication.factor",
)

ConfigValue = str | int | float | bool


class ClusterError(RuntimeError):
    """The local cluster could not be started, or a broker failed to become healthy."""


def _config_str(value: ConfigValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class BrokerProcess(ManagedProcess):
    """A broker process of a :class:`LocalCluster`: its id, address and data directory."""

    def __init__(
        self,
        broker_id: int,
        host: str,
        port: int,
        data_path: Path,
        metadata_path: Path,
        log_path: Path,
        config: Mapping[str, str],
        *,
        python: str,
        env: Mapping[str, str],
        metrics_port: int | None = None,
        inter_broker_port: int | None = None,
        tls_dir: Path | None = None,
        clients_ca: Path | None = None,
        health_credentials: grpc.ChannelCredentials | None = None,
        kafka_port: int | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.health_credentials = health_credentials
        self.inter_broker_port = inter_broker_port
        self.tls_dir = tls_dir
        self.kafka_port = kafka_port
        self.host = host
        self.port = port
        self.metrics_port = metrics_port
        self.data_path = data_path
        self.config = dict(config)
        listen = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        argv = [
            python, "-m", "sluice.broker",
            "--id", str(broker_id),
            "--listen", listen,
            "--data", str(data_path),
            "--metadata", str(metadata_path),
        ]  # fmt: skip
        if metrics_port is not None:
            argv += ["--metrics-listen", f"[{host}]:{metrics_port}" if ":" in host else f"{host}:{metrics_port}"]
        if inter_broker_port is not None and tls_dir is not None:
            ib = f"[{host}]:{inter_broker_port}" if ":" in host else f"{host}:{inter_broker_port}"
            argv += ["--inter-broker-listen", ib, "--broker-tls-dir", str(tls_dir)]
        if clients_ca is not None:  # secure: clients need a certificate (mutual TLS)
            argv += ["--client-listener", "mtls", "--clients-ca", str(clients_ca)]
        if kafka_port is not None:
            argv += ["--kafka-listen", f"[{host}]:{kafka_port}" if ":" in host else f"{host}:{kafka_port}"]
        for key, value in self.config.items():
            argv += ["--config", f"{key}={value}"]
        super().__init__(f"broker-{broker_id}", argv, log_path, env=env)

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def kafka_address(self) -> str | None:
        """``HOST:PORT`` of this broker's Kafka-protocol listener (None if it has none)."""
        if self.kafka_port is None:
            return None
        return f"[{self.host}]:{self.kafka_port}" if ":" in self.host else f"{self.host}:{self.kafka_port}"

    @property
    def metrics_url(self) -> str | None:
        """``http://HOST:PORT/metrics`` of this broker's Prometheus endpoint (None if it has none)."""
        if self.metrics_port is None:
            return None
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.metrics_port}/metrics"

    def health(self, timeout: float = 1.0) -> str:
        """The broker's grpc.health.v1 status (``SERVING`` ...), or ``UNREACHABLE``/``PAUSED``/its state."""
        state = self.state
        if state == "paused":
            return "PAUSED"
        if state != "running":
            return state.upper()
        return check_health(self.address, timeout=timeout, credentials=self.health_credentials)


class ControllerProcess(ManagedProcess):
    """The local controller of a :class:`LocalCluster` (failure detection, leader election)."""

    def __init__(
        self,
        metadata_path: Path,
        log_path: Path,
        failure_timeout_ms: int,
        *,
        python: str,
        env: Mapping[str, str],
        extra_args: Sequence[str] = (),
        metrics_listen: str | None = None,
    ) -> None:
        self.failure_timeout_ms = failure_timeout_ms
        self.metrics_listen = metrics_listen
        metrics_args = [] if metrics_listen is None else ["--metrics-listen", metrics_listen]
        argv = [
            python, "-m", "sluice.operator.controller.local",
            *metrics_args,
            "--metadata", str(metadata_path),
            "--failure-timeout-ms", str(failure_timeout_ms),
            *extra_args,
        ]  # fmt: skip
        super().__init__("controller", argv, log_path, env=env)


def replication_defaults(brokers: int) -> dict[str, str]:
    """Broker settings a cluster of ``brokers`` gets unless its config overrides them (see the module docstring)."""
    if brokers < 2:
        return {}
    out = {key: str(min(3, brokers)) for key in _REPLICATION_FACTOR_KEYS}
    # The brokers share this machine's disk: its budget for flushes and compactions is split between
    # them (three brokers get the 64 MiB/s measured for the RF3 tail, docs/performance.md).
    out["log.background.write.max.bytes.per.second"] = str(MACHINE_BACKGROUND_WRITE_RATE // brokers)
    if brokers >= 3:
        out["min.insync.replicas"] = "2"
    return out


def _stop_in_order(processes: Sequence[ManagedProcess], timeout: float) -> None:
    """The brokers together, then the controller.

    Brokers stop with a controlled shutdown, which needs the controller: it
    sees them all leaving, finds no replica left to elect, and leaves every
    partition leaderless with its ISR kept, so whichever broker starts again
    on the same data is elected at once (see broker/sluice_broker/main.py).
    """
    running = [p for p in processes if p.is_alive()]
    brokers = [p for p in running if isinstance(p, BrokerProcess)]
    stop_all(brokers, timeout=timeout)
    stop_all([p for p in running if p not in brokers], timeout=timeout)


def _cleanup(processes: list[ManagedProcess], tmp_dir: str | None) -> None:
    """Finalizer of a LocalCluster: must not reference the cluster itself."""
    _stop_in_order(processes, timeout=10.0)
    if tmp_dir is not None:
        shutil.rmtree(tmp_dir, ignore_errors=True)


class LocalCluster:
    """A cluster of ``brokers`` broker processes on ``host`` (loopback).

    ``config`` is passed to every broker as ``--config KEY=VALUE`` (Kafka's
    names: ``transaction.max.timeout.ms``, ``num.partitions`` ...);
    ``broker_config`` adds or overrides keys for single brokers (``{1:
    {"broker.rack": "b"}}``). ``data_dir=None`` uses a temporary directory that
    is removed on exit; a given ``data_dir`` is kept, and a cluster started on
    it again finds its data. ``ports`` fixes the brokers' ports (default: free
    ports picked by the kernel). ``kafka_listener=True`` opens a Kafka-protocol
    listener on every broker (``kafka_bootstrap_servers``), on free ports unless ``kafka_ports``
    fixes them (``kafka_ports`` implies ``kafka_listener``; a 0 entry is a free port), secured as
    the gRPC port is: with ``secure=True`` it requires client certificates too
    (``kafka_client_config(name)``, ``kafka_client_properties(name)``). ``failure_timeout_ms`` is how long the
    controller lets a broker fail its health checks before it moves that
    broker's leaderships (tests use about 1000; Kafka-like default 5000).
    """

    def __init__(
        self,
        brokers: int = 1,
        data_dir: str | os.PathLike[str] | None = None,
        config: Mapping[str, ConfigValue] | None = None,
        *,
        broker_config: Mapping[int, Mapping[str, ConfigValue]] | None = None,
        host: str = "127.0.0.1",
        ports: Sequence[int] | None = None,
        startup_timeout: float = 60.0,
        python: str = sys.executable,
        env: Mapping[str, str] | None = None,
        failure_timeout_ms: int = DEFAULT_FAILURE_TIMEOUT_MS,
        secure: bool = False,
        kafka_listener: bool = False,
        kafka_ports: Sequence[int] | None = None,
    ) -> None:
        if brokers < 1:
            raise ValueError(f"brokers must be >= 1, not {brokers}")
        if failure_timeout_ms <= 0:
            raise ValueError(f"failure_timeout_ms must be positive, not {failure_timeout_ms}")
        if ports is not None and len(ports) != brokers:
            raise ValueError(f"ports gives {len(ports)} ports for {brokers} brokers")
        if kafka_ports is not None and len(kafka_ports) != brokers:
            raise ValueError(f"kafka_ports gives {len(kafka_ports)} ports for {brokers} brokers")
        kafka_listener = kafka_listener or kafka_ports is not None
        self.host = host
        self.startup_timeout = startup_timeout
        self._python = python
        self._tmp_dir: str | None = None
        if data_dir is None:
            self._tmp_dir = tempfile.mkdtemp(prefix="sluice-cluster-")
            data_dir = self._tmp_dir
        self.data_dir = Path(data_dir).resolve()
        self.metadata_path = self.data_dir / "metadata.sqlite"
        common = replication_defaults(brokers)
        if secure:  # the authorizer on, deny by default, User:admin the super user (docs/security.md)
            common.update({"authorizer.enabled": "true", "super.users": SUPER_USER})
        common.update({k: _config_str(v) for k, v in (config or {}).items()})
        per_broker = broker_config or {}
        unknown = set(per_broker) - set(range(brokers))
        if unknown:
            raise ValueError(f"broker_config names brokers {sorted(unknown)}; ids are 0..{brokers - 1}")
        child_env = dict(os.environ if env is None else env)
        # Unbuffered output: the log file is what we show when a broker fails.
        child_env.setdefault("PYTHONUNBUFFERED", "1")
        self._brokers: list[BrokerProcess] = []
        # Made now (not at start) so that the argv of every broker names its material; cheap (EC keys).
        tls_dirs = broker_tls_dirs(self.data_dir, range(brokers), host)
        self.secure = secure
        clients_ca: Path | None = None
        health_credentials: grpc.ChannelCredentials | None = None
        controller_args: list[str] = []
        if secure:
            clients_ca = clients_ca_file(self.data_dir)
            controller_dir = controller_tls_dir(self.data_dir)
            m = tls.load_dir(controller_dir)
            health_credentials = grpc.ssl_channel_credentials(m.ca_pem, m.key_pem, m.cert_pem)
            controller_args += ["--tls-dir", str(controller_dir)]
        for i in range(brokers):
            cfg = dict(common)
            cfg.update({k: _config_str(v) for k, v in per_broker.get(i, {}).items()})
            port = ports[i] if ports is not None and ports[i] else free_port(host)
            kafka_port = (kafka_ports[i] or free_port(host)) if kafka_ports is not None else None
            if kafka_listener and kafka_port is None:
                kafka_port = free_port(host)
            self._brokers.append(
                BrokerProcess(
                    i,
                    host,
                    port,
                    self.data_dir / f"broker-{i}",
                    self.metadata_path,
                    self.data_dir / f"broker-{i}.log",
                    cfg,
                    python=python,
                    env=child_env,
                    metrics_port=free_port(host),
                    inter_broker_port=free_port(host),
                    tls_dir=tls_dirs[i],
                    clients_ca=clients_ca,
                    health_credentials=health_credentials,
                    kafka_port=kafka_port,
                )
            )
        if common.get("unclean.leader.election.enable", "").lower() == "true":
            controller_args.append("--unclean-leader-election")
        self.controller_cut_path = self.data_dir / CONTROLLER_METADATA_CUT_FILE
        if "metadata.cut" in common.get("sluice.test.hooks", "").split(","):  # the controller can be cut too
            controller_args += ["--test-metadata-cut", str(self.controller_cut_path)]
        self._controller = ControllerProcess(
            self.metadata_path,
            self.data_dir / "controller.log",
            failure_timeout_ms,
            python=python,
            env=child_env,
            extra_args=controller_args,
            # the controller's metrics (sluice.operator.metrics), on its own port of the cluster's address
            metrics_listen=f"[{host}]:{free_port(host)}" if ":" in host else f"{host}:{free_port(host)}",
        )
        # Every process of the cluster: the controller, then the brokers.
        self._processes: list[ManagedProcess] = [self._controller, *self._brokers]
        self._store: MetadataStore | None = None
        self._store_lock = threading.Lock()
        self._started = False
        self._finalizer = weakref.finalize(self, _cleanup, self._processes, self._tmp_dir)

    # -- whole cluster ---------------------------------------------------------------------------

    @property
    def brokers(self) -> Sequence[BrokerProcess]:
        return tuple(self._brokers)

    @property
    def bootstrap_servers(self) -> str:
        """Every broker's address, comma-separated: what clients take as ``bootstrap_servers``."""
        return ",".join(b.address for b in self._brokers)

    @property
    def kafka_bootstrap_servers(self) -> str:
        """Every broker's Kafka-protocol address, comma-separated (``LocalCluster(kafka_listener=True)``)."""
        if any(b.kafka_port is None for b in self._brokers):
            raise ClusterError("this cluster was started without kafka_listener=True")
        return ",".join(str(b.kafka_address) for b in self._brokers)

    def start(self) -> LocalCluster:
        """Start every process and wait until every broker is healthy (or raise ClusterError)."""
        if self._started:
            raise ClusterError("the cluster is already started")
        self._check_runnable()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        busy = [b.address for b in self._brokers if not port_is_free(b.host, b.port)]
        busy += [
            f"{b.host}:{b.inter_broker_port}"
            for b in self._brokers
            if b.inter_broker_port is not None and not port_is_free(b.host, b.inter_broker_port)
        ]
        busy += [
            str(b.kafka_address)
            for b in self._brokers
            if b.kafka_port is not None and not port_is_free(b.host, b.kafka_port)
        ]
        if busy:
            raise ClusterError(f"port(s) already in use: {', '.join(busy)}")
        self._started = True
        try:
            self._start_controller()
            for b in self._brokers:
                b.start()
            # every broker, by index: one that died at once must fail the start, not be skipped
            self.wait_until_healthy(timeout=self.startup_timeout, brokers=range(len(self._brokers)))
        except BaseException:
            self.close()
            raise
        return self

    def _start_controller(self) -> None:
        """Start the local controller (before the brokers, so it sees them register)."""
        self._controller.start()

    @property
    def controller(self) -> ControllerProcess:
        """The local controller process (``controller.log`` in ``data_dir``)."""
        return self._controller

    def close(self, timeout: float = 20.0) -> None:
        """Stop every process (SIGTERM, then SIGKILL after ``timeout`` s); remove a temporary data_dir."""
        _stop_in_order(self._processes, timeout=timeout)
        with self._store_lock:
            if self._store is not None:
                self._store.close()
                self._store = None
        self._finalizer()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- one broker ------------------------------------------------------------------------------

    def broker(self, i: int) -> BrokerProcess:
        try:
            return self._brokers[i]
        except IndexError:
            raise IndexError(f"no broker {i}: the cluster has brokers 0..{len(self._brokers) - 1}") from None

    def address(self, i: int) -> str:
        return self.broker(i).address

    def metrics_url(self, i: int) -> str:
        """Broker ``i``'s Prometheus endpoint, ``http://HOST:PORT/metrics`` (the same across restarts)."""
        url = self.broker(i).metrics_url
        assert url is not None  # every broker of a LocalCluster serves metrics
        return url

    def controller_metrics_url(self) -> str:
        """The controller process's Prometheus endpoint (the operator's metrics), ``http://HOST:PORT/metrics``."""
        listen = self._controller.metrics_listen
        assert listen is not None
        return f"http://{listen}/metrics"

    def client_config(self, name: str) -> dict[str, Any]:
        """Keyword arguments with which Producer, Consumer and Admin connect as ``User:<name>``.

        ``Producer(**cluster.client_config("alice"))``: the bootstrap servers and, for a secure
        cluster, TLS with a certificate for CN ``name`` from the cluster's clients CA (made in
        ``data_dir/tls/clients/<name>``, mode 0600, on first use). A plaintext cluster needs no
        name: it gets the bootstrap servers only.
        """
        if not self.secure:
            return {"bootstrap_servers": self.bootstrap_servers}
        d = client_tls_dir(self.data_dir, name)
        return {
            "bootstrap_servers": self.bootstrap_servers,
            "security_protocol": "SSL",
            "ssl_cafile": str(d / tls.CA_FILE),
            "ssl_certfile": str(d / tls.CERT_FILE),
            "ssl_keyfile": str(d / tls.KEY_FILE),
        }

    def kafka_client_config(self, name: str | None = None) -> dict[str, Any]:
        """Keyword arguments with which kafka-python's clients connect to the Kafka listener as ``User:<name>``.

        ``KafkaProducer(**cluster.kafka_client_config("alice"))``: the Kafka bootstrap servers and,
        for a secure cluster, the same TLS files as :meth:`client_config` (kafka-python's
        ``security_protocol``/``ssl_*`` names are Sluice's), so one certificate is one principal
        on both protocols. A plaintext cluster needs no name.
        """
        config = self.client_config(name or "") if self.secure else {}
        return {**config, "bootstrap_servers": self.kafka_bootstrap_servers}

    def kafka_client_properties(self, name: str | None = None) -> dict[str, str]:
        """Apache Kafka's (Java) client settings for the Kafka listener as ``User:<name>``.

        For a secure cluster: SSL with PEM stores (``ssl.keystore.type=PEM``), the keystore being
        ``keystore.pem`` (key and certificate, mode 0600) beside the client's certificate.
        """
        props = {"bootstrap.servers": self.kafka_bootstrap_servers}
        if not self.secure:
            return props
        d = client_tls_dir(self.data_dir, name or "")
        keystore = d / "keystore.pem"
        if not keystore.exists():
            tls.write_private(keystore, (d / tls.KEY_FILE).read_bytes() + (d / tls.CERT_FILE).read_bytes())
        return {
            **props,
            "security.protocol": "SSL",
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(d / tls.CA_FILE),
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(keystore),
        }

    def interbroker_channel(self, i: int) -> grpc.Channel:
        """A channel to broker ``i``'s inter-broker listener holding broker ``i``'s own certificate.

        For tests that look at replication as a broker does (OffsetsForLeaderEpoch ...): the
        caller *is* a broker of this cluster, proven the only way there is, with a certificate
        from the cluster CA in ``data_dir/tls``. Close it after use.
        """
        b = self.broker(i)
        if b.inter_broker_port is None or b.tls_dir is None:
            raise ClusterError(f"broker {i} has no inter-broker listener")
        m = tls.load_dir(b.tls_dir)
        creds = grpc.ssl_channel_credentials(m.ca_pem, m.key_pem, m.cert_pem)
        host = f"[{b.host}]" if ":" in b.host else b.host
        return grpc.secure_channel(
            f"{host}:{b.inter_broker_port}", creds, options=[("grpc.ssl_target_name_override", tls.BROKER_SERVER_NAME)]
        )

    def kill(self, i: int) -> None:
        """SIGKILL broker ``i`` (a crash: no shutdown code runs) and reap it."""
        self.broker(i).kill()

    def stop(self, i: int, timeout: float = 20.0) -> int | None:
        """Clean shutdown of broker ``i`` (SIGTERM; SIGKILL after ``timeout`` s). Returns its exit code."""
        return self.broker(i).stop(timeout=timeout)

    def pause(self, i: int) -> None:
        """SIGSTOP broker ``i``: alive, holding its state and connections, but answering nothing."""
        self.broker(i).pause()

    def resume(self, i: int) -> None:
        """SIGCONT a paused broker."""
        self.broker(i).resume()

    def restart(self, i: int, *, wait: bool = True, timeout: float | None = None) -> None:
        """Start broker ``i`` again on the same data and port.

        A running (or paused) broker is first stopped cleanly; to restart after
        a crash, ``kill(i)`` first. With ``wait`` (default), returns once it is
        healthy.
        """
        b = self.broker(i)
        if b.is_alive():
            b.stop()
        # The ports may linger for a moment after the old process is reaped.
        poll_until(lambda: port_is_free(b.host, b.port), timeout=10.0)
        if b.inter_broker_port is not None:
            ib_port = b.inter_broker_port
            poll_until(lambda: port_is_free(b.host, ib_port), timeout=10.0)
        b.start()
        if wait:
            self.wait_until_healthy(timeout=self.startup_timeout if timeout is None else timeout, brokers=[i])

    def cut_metadata(self, i: int | None, cut: bool = True) -> None:
        """Cut broker ``i`` (None: the controller) from the metadata store, or heal it with ``cut=False``.

        Test-only: needs ``config={"sluice.test.hooks": "metadata.cut"}`` (every store call of that
        process then fails as with an unreachable API server while the cut lasts; docs/architecture.md).
        """
        path = self.controller_cut_path if i is None else self.broker(i).data_path / METADATA_CUT_FILE
        if cut:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
        else:
            path.unlink(missing_ok=True)

    def is_healthy(self, i: int, timeout: float = 1.0) -> bool:
        return self.broker(i).health(timeout) == SERVING

    def health(self) -> dict[int, str]:
        """Every broker's status: SERVING, NOT_SERVING, UNREACHABLE, PAUSED, KILLED, STOPPED, EXITED ..."""
        return {b.broker_id: b.health() for b in self._brokers}

    def wait_until_healthy(self, timeout: float = 30.0, brokers: Iterable[int] | None = None) -> None:
        """Wait until the brokers are SERVING; raise ClusterError with their log tails if not.

        ``brokers=None`` means every broker whose process is running (paused,
        stopped and killed ones are left out). A broker whose process exits
        while we wait fails the wait at once.
        """
        targets = (
            [self.broker(i) for i in brokers]
            if brokers is not None
            else [b for b in self._brokers if b.state == "running"]
        )
        pending = list(targets)

        def check() -> bool:
            self._check_controller()
            for b in list(pending):
                if b.state not in ("running", "paused"):
                    raise ClusterError(self._failure(b, f"{b.name} exited with code {b.returncode}"))
                if b.health(timeout=1.0) == SERVING:
                    pending.remove(b)
            return not pending

        started = time.monotonic()
        if not poll_until(check, timeout=timeout):
            b = pending[0]
            raise ClusterError(
                self._failure(b, f"{b.name} at {b.address} not healthy after {timeout:.0f}s ({b.health()})")
            )
        ids = {b.broker_id for b in targets if b.state == "running"}
        left = max(timeout - (time.monotonic() - started), 1.0)
        if self._controller.state == "running" and not poll_until(lambda: self._settled(ids), timeout=left):
            raise ClusterError(
                self._failure(
                    self._controller,
                    f"the controller did not see brokers {sorted(ids)} alive and elect leaders within {timeout:.0f}s"
                    f" (controller document: {self.controller_state()})",
                )
            )

    def _check_controller(self) -> None:
        c = self._controller
        if c.starts and c.state == "exited":
            raise ClusterError(self._failure(c, f"the controller exited with code {c.returncode}"))

    def _settled(self, brokers: set[int]) -> bool:
        """The controller counts ``brokers`` as live and has elected every partition it can."""
        self._check_controller()
        state = documents.read(self.metadata, keys.CONTROLLER, ControllerDocument)
        if state is None:
            return False
        live = set(state.value.live_brokers)
        if not brokers <= live:
            return False
        for topic in TopicView.load(self.metadata).topics().values():
            for p in topic.partitions:
                if p.leader == NO_LEADER and live & set(p.isr):
                    return False
        return True

    def _failure(self, b: ManagedProcess, what: str) -> str:
        tail = b.log_tail(40) or "(empty)"
        return f"{what}\n--- last lines of {b.log_path} ---\n{tail}\n---"

    def _check_runnable(self) -> None:
        if self._python == sys.executable and importlib.util.find_spec("sluice.broker") is None:
            raise ClusterError("cannot import sluice.broker: install the project first (pip install -e .)")

    # -- leadership, from the metadata file -------------------------------------------------------

    @property
    def metadata(self) -> MetadataStore:
        """The cluster's MetadataStore (the shared SQLite file), opened on first use; read it, do not write."""
        with self._store_lock:
            if self._store is None:
                self.data_dir.mkdir(parents=True, exist_ok=True)
                self._store = open_store(str(self.metadata_path))
            return self._store

    def topic_document(self, topic: str) -> dict[str, Any] | None:
        """The topic as the brokers see it (replicas, leader, leader_epoch, isr per partition), or None:
        ``topics/<name>`` composed with its partition change records (:mod:`sluice.metadata.topic_view`).

        The JSON form (:meth:`sluice.metadata.documents.TopicDocument.to_json`), so tests can
        compare it with plain dicts; ``TopicDocument.from_json`` gives the typed form.
        """
        doc = TopicView.load(self.metadata, topic).topic(topic)
        return None if doc is None else doc.to_json()

    def partition_state(self, topic: str, partition: int) -> dict[str, Any]:
        """``{"replicas", "leader", "leader_epoch", "isr"}`` of one partition; KeyError if it does not exist."""
        value = self.topic_document(topic)
        if value is None or not 0 <= partition < len(value["partitions"]):
            raise KeyError(f"no partition {topic}-{partition} in the metadata")
        return dict(value["partitions"][partition])

    def leader(self, topic: str, partition: int) -> int:
        """The broker (index = id) leading ``topic-partition`` now, -1 if none."""
        return int(self.partition_state(topic, partition)["leader"])

    def controller_state(self) -> dict[str, Any] | None:
        """The controller's document as stored: ``{"epoch", "live_brokers", "dead_brokers", "updated_ms", ...}``
        (the JSON form of :class:`sluice.metadata.documents.ControllerDocument`)."""
        doc = self.metadata.get(keys.CONTROLLER)
        return None if doc is None else doc.value

    def wait_for_partition(
        self,
        topic: str,
        partition: int,
        predicate: Callable[[dict[str, Any]], bool],
        timeout: float = 30.0,
        what: str = "the expected state",
    ) -> dict[str, Any]:
        """Poll the partition's state until ``predicate`` holds; returns it (ClusterError after ``timeout``)."""
        seen: list[dict[str, Any]] = []

        def check() -> bool:
            self._check_controller()
            try:
                state = self.partition_state(topic, partition)
            except KeyError:
                return False
            seen[:] = [state]
            return predicate(state)

        if not poll_until(check, timeout=timeout, interval=0.05, max_interval=0.2):
            raise ClusterError(
                self._failure(
                    self._controller,
                    f"{topic}-{partition} did not reach {what} within {timeout:.0f}s; last state "
                    f"{seen[0] if seen else None}, controller {self.controller_state()}",
                )
            )
        return seen[0]

    def wait_for_leader_change(
        self, topic: str, partition: int, *, after_epoch: int | None = None, timeout: float = 30.0
    ) -> dict[str, Any]:
        """Wait until ``topic-partition`` has a leader at an epoch above ``after_epoch`` (default: the current one).

        Returns the partition state. Kill or pause the leader first, then call this
        (``after_epoch`` taken before the kill avoids missing a fast election).
        """
        if after_epoch is None:
            after_epoch = int(self.partition_state(topic, partition)["leader_epoch"])
        return self.wait_for_partition(
            topic,
            partition,
            lambda p: p["leader"] != -1 and p["leader_epoch"] > after_epoch,
            timeout=timeout,
            what=f"a leader at an epoch above {after_epoch}",
        )

    # -- certificates: renewal and CA rotation, the operator's steps over tls/ ----------------------

    def certificate_reports(self) -> dict[int, cert_rotation.BrokerReport]:
        """What each broker says it loaded (its ``brokers/<id>`` document): trusted CAs, its certificate."""
        reports = {}
        for d in documents.list_documents(self.metadata, keys.BROKERS, BrokerDocument):
            if d.value.tls_certificate:
                reports[d.value.broker_id] = cert_rotation.BrokerReport(
                    frozenset(d.value.tls_trusted), d.value.tls_certificate
                )
        return reports

    def certificate_step(
        self, *, renew_certificates: bool = False, rotate_ca: bool = False, policy: cert_rotation.Policy | None = None
    ) -> cert_rotation.Step:
        """One step of :func:`sluice.cert_rotation.reconcile` over ``data_dir/tls``, applied (CA first).

        Waits for the running brokers (a stopped one loads the current files when it starts).
        """
        ids = range(len(self._brokers))
        ca = read_cluster_ca(self.data_dir, force_renew=rotate_ca)
        brokers = read_broker_certs(self.data_dir, ids, force_renew=renew_certificates)
        running = [b.broker_id for b in self._brokers if b.state == "running"]
        step = cert_rotation.reconcile(
            ca, brokers, ids, self.certificate_reports(), running, policy or cert_rotation.Policy(),
            hosts={i: [self.host] for i in ids},
        )  # fmt: skip
        if step.ca is not None:
            write_cluster_ca(self.data_dir, step.ca)
        if step.brokers is not None:
            write_broker_certs(self.data_dir, step.brokers)
        return step

    def _certificate_steps(
        self, first: Callable[[], cert_rotation.Step], timeout: float, stop_at: str | None = None
    ) -> list[str]:
        """Steps until there is nothing to do or wait for (or the CA phase is ``stop_at``); what was done."""
        done: list[str] = []
        step = first()
        deadline = time.monotonic() + timeout
        while step.changed or step.waiting:
            if step.done:
                done.append(step.done)
            if stop_at is not None and step.ca is not None and step.ca.phase == stop_at:
                break
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"certificate rotation stuck after {timeout:.0f}s: waiting for {step.waiting}; done: {done}"
                )
            if not step.changed:
                time.sleep(0.2)
            step = self.certificate_step()
        return done

    def _wait_presenting(self, timeout: float) -> None:
        """Until every running broker reports the certificate its files hold."""
        ids = range(len(self._brokers))

        def presenting() -> bool:
            certs = read_broker_certs(self.data_dir, ids).certs
            reports = self.certificate_reports()
            want = {i: tls.fingerprint(pair.cert_pem) for i, pair in certs.items()}
            running = [b.broker_id for b in self._brokers if b.state == "running"]
            return all(i in reports and reports[i].certificate == want.get(i) for i in running)

        if not poll_until(presenting, timeout=timeout):
            raise ClusterError(f"brokers did not load their renewed certificates within {timeout:.0f}s")

    def renew_certificates(self, timeout: float = 60.0) -> list[str]:
        """Re-issue every broker's certificate from the current CA now, as the operator does before
        expiry; returns once every running broker presents its new one (they reload, no restart)."""
        if read_cluster_ca(self.data_dir).phase != cert_rotation.READY:
            raise ClusterError("a CA rotation is under way: finish it first (rotate_ca)")
        done = self._certificate_steps(lambda: self.certificate_step(renew_certificates=True), timeout)
        self._wait_presenting(timeout)
        return done

    def rotate_ca(self, timeout: float = 120.0, *, stop_at: str | None = None) -> list[str]:
        """Rotate the cluster CA with an overlap, the operator's phases (:mod:`sluice.cert_rotation`):
        trust old + new, re-issue every broker certificate from the new CA, drop the old one, each
        step once every running broker reported the previous. Returns what was done, in order.

        ``stop_at`` (a phase) returns as soon as the rotation entered it; calling again continues
        where it stopped (it starts a new rotation only from Ready). Not for a ``secure`` cluster
        yet: its controller and clients load their CA once.
        """
        if self.secure:
            raise ClusterError(
                "rotate_ca is not supported on a secure LocalCluster yet: the local controller and the clients "
                "load the cluster CA once (renew_certificates works)"
            )
        start = read_cluster_ca(self.data_dir).phase == cert_rotation.READY
        return self._certificate_steps(lambda: self.certificate_step(rotate_ca=start), timeout, stop_at)

    # -- replica consistency ---------------------------------------------------------------------

    def _high_watermarks(self, tps: Iterable[tuple[str, int]], timeout: float) -> dict[tuple[str, int], int]:
        """The HW (ListOffsets latest, read_uncommitted) of each partition, one request per topic; a topic
        that does not answer in ``timeout`` is left out (the check then uses the replicas' HW checkpoints)."""
        by_topic: dict[str, list[int]] = {}
        for topic, partition in tps:
            by_topic.setdefault(topic, []).append(partition)
        out: dict[tuple[str, int], int] = {}
        admin = Admin(**self.client_config("admin"), request_timeout_ms=int(timeout * 1000))
        try:
            for topic, partitions in by_topic.items():
                with contextlib.suppress(errors.SluiceError):
                    specs = {TopicPartition(topic, p): Admin.LATEST for p in partitions}
                    for tp, info in admin.list_offsets(specs, timeout=timeout).items():
                        out[(tp.topic, tp.partition)] = info.offset
        finally:
            admin.close()
        return out

    def check_replica_consistency(self, timeout: float = 60.0, *, brokers: Iterable[int] | None = None) -> int:
        """Compare every partition's replicas batch by batch (:mod:`sluice.testing.replicas`); raise on a difference.

        Call it after a fault test healed. It reads the HWs (ListOffsets) and the ISRs (the
        metadata) first, then each broker's stored log (a RocksDB secondary open: safe on running,
        stopped or killed brokers), and reads again (bounded by ``timeout``) while an ISR member
        still ends before the HW. Raises :class:`~sluice.testing.replicas.ReplicaDivergence`
        naming the first difference; returns how many batches were compared.
        """
        ids = sorted(range(len(self._brokers)) if brokers is None else brokers)
        deadline = time.monotonic() + timeout
        while True:
            isr: dict[tuple[str, int], list[int]] = {}
            leaders: dict[tuple[str, int], int] = {}
            compacted: set[str] = set()
            for doc in TopicView.load(self.metadata).topics().values():
                if doc.internal or "compact" in doc.config.get("cleanup.policy", ""):
                    compacted.add(doc.name)
                for p, state in enumerate(doc.partitions):
                    isr[(doc.name, p)] = list(state.isr)
                    leaders[(doc.name, p)] = state.leader
            hws = self._high_watermarks(sorted(isr), timeout=min(10.0, timeout))
            logs: list[replica_check.ReplicaLog] = []
            for i in ids:
                logs += replica_check.read_replica_logs(self._python, i, self.broker(i).data_path / "rocksdb")
            behind = replica_check.lagging(logs, isr, hws)
            if not behind or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        found = replica_check.compare(logs, isr, hws, leaders, frozenset(compacted)) + [
            f"still behind at the deadline: {b}" for b in behind
        ]
        if found:
            raise replica_check.ReplicaDivergence(found)
        return sum(len(log.batches) for log in logs)

    # -- introspection ---------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """A JSON-able snapshot: data directory, metadata file, and each broker's pid, address, state."""
        return {
            "bootstrap_servers": self.bootstrap_servers,
            "data_dir": str(self.data_dir),
            "metadata": str(self.metadata_path),
            "controller": {
                "pid": self._controller.pid,
                "state": self._controller.state,
                "log": str(self._controller.log_path),
                "failure_timeout_ms": self._controller.failure_timeout_ms,
            },
            "brokers": [
                {
                    "id": b.broker_id,
                    "address": b.address,
                    "pid": b.pid,
                    "state": b.state,
                    "log": str(b.log_path),
                    "data": str(b.data_path),
                    "metrics_url": b.metrics_url,
                    "inter_broker_port": b.inter_broker_port,
                    "kafka_address": b.kafka_address,
                }
                for b in self._brokers
            ],
        }

    def log_tail(self, i: int, lines: int = 40) -> str:
        return self.broker(i).log_tail(lines)

    def __repr__(self) -> str:
        return f"<LocalCluster {self.bootstrap_servers} data_dir={self.data_dir}>"
