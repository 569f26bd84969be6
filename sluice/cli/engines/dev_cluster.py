"""The background dev cluster behind ``sluice dev up|down|status``.

``sluice dev up`` must return to the shell while the cluster keeps running.
Rather than leave broker processes orphaned, it starts one detached
*supervisor* process (``python -m sluice.cli.engines.dev_cluster --data DIR ...``) that
owns a :class:`LocalCluster` exactly as a test would. Consequences:

* the brokers die with the supervisor (PR_SET_PDEATHSIG), so killing one pid
  (``dev down``, or ``kill -9`` as a last resort) stops the whole cluster;
* the local controller (failure detection and leader election) comes for
  free, since the supervisor runs whatever LocalCluster runs, with the same
  replication defaults (``--brokers 3``: replication factor 3,
  min.insync.replicas 2); its pid and log are in the state file;
* ``dev down`` is a SIGTERM to the supervisor, which shuts the brokers down
  cleanly and removes its state file.

State lives in the data directory (default ``$SLUICE_HOME/dev``, with
``SLUICE_HOME`` defaulting to ``~/.sluice``): ``dev-cluster.json`` (supervisor
pid, bootstrap servers, brokers' pids and ports, status) next to the brokers'
data and logs. ``$SLUICE_HOME/dev-current`` names the data directory of the
last ``dev up``, so ``dev down``/``status`` and the client commands find a
cluster started with ``--data`` elsewhere.

``--kafka-listener`` opens a Kafka-protocol listener on every broker
(``LocalCluster(kafka_ports=...)``). Its ports follow the gRPC ones at a fixed
distance, ``KAFKA_PORT_OFFSET`` (broker N: gRPC 9092+N, Kafka 19092+N), rather
than Kafka's customary 9093 right after 9092: a dev cluster of several brokers
already uses 9093, 9094 ... for gRPC. The state file records each broker's
``kafka_address`` and the Kafka bootstrap servers.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sluice import tls
from sluice.testing import poll_until
from sluice.testing.certs import client_tls_dir

STATE_FILE = "dev-cluster.json"
ADMIN_CONFIG = "admin.properties"  # of a --secure dev cluster: the super user's client settings
ADMIN_KAFKA_CONFIG = "admin-kafka.properties"  # ... and with --kafka-listener, the same for Kafka's tools
ADMIN_LIBRDKAFKA_CONFIG = "admin-librdkafka.properties"  # ... and for librdkafka (kcat -F, confluent-kafka)
USERS_DIR = "users"  # `sluice dev user NAME`: NAME.properties, NAME-kafka.properties, NAME-librdkafka.properties
SUPERVISOR_LOG = "dev-supervisor.log"
KAFKA_PORT_OFFSET = 10000  # broker N's Kafka port is its gRPC port + this (19092 beside 9092)
_SUPERVISOR_MODULE = "sluice.cli.engines.dev_cluster"


def sluice_home() -> Path:
    return Path(os.environ.get("SLUICE_HOME") or "~/.sluice").expanduser()


def default_data_dir() -> Path:
    return sluice_home() / "dev"


def default_kafka_port(port: int) -> int:
    """Broker 0's Kafka port for a dev cluster whose broker 0 has gRPC ``port`` (0: free ports)."""
    return port + KAFKA_PORT_OFFSET if port else 0


def _pointer() -> Path:
    return sluice_home() / "dev-current"


def resolve_data_dir(data: str | os.PathLike[str] | None) -> Path:
    """``data`` if given, else the data directory of the last ``dev up``, else the default."""
    if data:
        return Path(data).expanduser().resolve()
    try:
        recorded = _pointer().read_text().strip()
    except OSError:
        recorded = ""
    return Path(recorded) if recorded else default_data_dir()


@dataclass
class DevState:
    supervisor_pid: int
    data_dir: str
    status: str = "starting"  # starting | running | failed
    bootstrap_servers: str = ""
    brokers: list[dict[str, Any]] = field(default_factory=list)
    controller: dict[str, Any] = field(default_factory=dict)
    started_at: float = field(default_factory=time.time)
    error: str = ""
    # --secure: mTLS client listeners and the authorizer (LocalCluster(secure=True)); admin_config
    # is the properties file (security.protocol=SSL, ssl.*) of the super user User:admin.
    secure: bool = False
    admin_config: str = ""
    # --kafka-listener: every broker's Kafka address, comma-separated ("" without a Kafka listener)
    kafka_bootstrap_servers: str = ""
    # both: the super user's settings for Kafka's own tools and clients (Java property names, PEM
    # stores: kafka-topics.sh --command-config FILE)
    admin_kafka_config: str = ""
    # ... and librdkafka's names for the same (kcat -F FILE; confluent-kafka: the file as a dict)
    admin_librdkafka_config: str = ""
    # the --config overrides it was started with: a later `up` with others is refused
    config: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> DevState:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in raw.items() if k in names})


def read_state(data_dir: Path) -> DevState | None:
    try:
        return DevState.from_json(json.loads((data_dir / STATE_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def write_state(data_dir: Path, state: DevState) -> None:
    """Atomic (write + rename): a reader never sees half a file."""
    path = data_dir / STATE_FILE
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(asdict(state), indent=2) + "\n")
    os.replace(tmp, path)


def pid_alive(pid: int, cmdline_contains: str | None = None) -> bool:
    """Whether ``pid`` runs (zombies count as dead), optionally checking its command line against pid reuse."""
    if pid <= 0:
        return False
    proc = Path(f"/proc/{pid}")
    if proc.is_dir():
        try:
            stat = (proc / "stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                return False
            if cmdline_contains is not None:
                return cmdline_contains in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError):
            return False
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not sys.platform.startswith("linux")


def running_state(data_dir: Path) -> DevState | None:
    """The state of a dev cluster whose supervisor is alive, else None."""
    state = read_state(data_dir)
    if state is None or not pid_alive(state.supervisor_pid, _SUPERVISOR_MODULE):
        return None
    return state


def _log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_bytes()[-64 * 1024 :].decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class DevClusterError(RuntimeError):
    pass


def up(
    data_dir: Path,
    brokers: int = 1,
    port: int = 9092,
    config: Mapping[str, str] | None = None,
    timeout: float = 90.0,
    on_wait: Callable[[float], None] | None = None,
    python: str = sys.executable,
    secure: bool = False,
    kafka_port: int | None = None,
) -> tuple[DevState, bool]:
    """Start the dev cluster in the background; returns (state, started_now).

    An already running dev cluster in ``data_dir`` is returned as it is
    (``started_now`` False). ``port`` is broker 0's port, the others follow;
    0 picks free ports. ``kafka_port`` (not None) opens a Kafka listener on
    every broker, broker 0 on that port and the others following (0: free ports).
    """
    existing = running_state(data_dir)
    if existing is not None:
        return existing, False
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / STATE_FILE).unlink(missing_ok=True)
    argv = [sys.executable, "-m", _SUPERVISOR_MODULE, "--data", str(data_dir), "--brokers", str(brokers)]
    argv += ["--port", str(port), "--startup-timeout", str(timeout), "--python", python]
    if secure:
        argv.append("--secure")
    if kafka_port is not None:
        argv += ["--kafka-port", str(kafka_port)]
    for key, value in (config or {}).items():
        argv += ["--config", f"{key}={value}"]
    log_path = data_dir / SUPERVISOR_LOG
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # detached: survives this command and the terminal
            close_fds=True,
        )
    started = time.monotonic()
    result: list[DevState] = []

    def ready() -> bool:
        if on_wait is not None:
            on_wait(time.monotonic() - started)
        state = read_state(data_dir)
        if state is not None and state.status in ("running", "failed"):
            result.append(state)
            return True
        return proc.poll() is not None

    poll_until(ready, timeout=timeout + 15.0, interval=0.2)
    state = result[0] if result else None
    if state is None or state.status != "running":
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        why = state.error if state is not None and state.error else "the dev cluster did not start"
        raise DevClusterError(f"{why}\n--- last lines of {log_path} ---\n{_log_tail(log_path)}\n---")
    _pointer().parent.mkdir(parents=True, exist_ok=True)
    _pointer().write_text(str(data_dir) + "\n")
    return state, True


def down(data_dir: Path, timeout: float = 30.0) -> DevState | None:
    """Stop the dev cluster of ``data_dir``; returns its last state, None if none was running."""
    state = running_state(data_dir)
    if state is None:
        (data_dir / STATE_FILE).unlink(missing_ok=True)
        return None
    pid = state.supervisor_pid
    os.kill(pid, signal.SIGTERM)
    if not poll_until(lambda: not pid_alive(pid), timeout=timeout, interval=0.1):
        # The brokers die with their supervisor (PR_SET_PDEATHSIG).
        os.kill(pid, signal.SIGKILL)
        poll_until(lambda: not pid_alive(pid), timeout=10.0)
    (data_dir / STATE_FILE).unlink(missing_ok=True)
    return state


# -- the supervisor process ---------------------------------------------------------------------


def write_client_properties(client_config: Mapping[str, Any], path: Path) -> Path:
    """Kafka-style client properties (``--command-config``) from LocalCluster.client_config, mode 0600."""
    return write_properties(
        {
            "security.protocol": client_config["security_protocol"],
            "ssl.cafile": client_config["ssl_cafile"],
            "ssl.certfile": client_config["ssl_certfile"],
            "ssl.keyfile": client_config["ssl_keyfile"],
        },
        path,
    )


def librdkafka_properties(tls_dir: Path, kafka_bootstrap_servers: str) -> dict[str, str]:
    """librdkafka's settings (kcat -F FILE; confluent-kafka takes them as its config dict) for the Kafka
    listener with the client certificate in ``tls_dir``: its names differ from Java's (ssl.*.location, PEM
    files directly, no stores)."""
    return {
        "bootstrap.servers": kafka_bootstrap_servers,
        "security.protocol": "ssl",
        "ssl.ca.location": str(tls_dir / tls.CA_FILE),
        "ssl.certificate.location": str(tls_dir / tls.CERT_FILE),
        "ssl.key.location": str(tls_dir / tls.KEY_FILE),
    }


def java_kafka_properties(tls_dir: Path, kafka_bootstrap_servers: str) -> dict[str, str]:
    """Kafka's Java client settings (--command-config FILE) for the same: PEM stores, the keystore being the
    key and certificate in one file (``keystore.pem``, mode 0600), as LocalCluster.kafka_client_properties."""
    keystore = tls_dir / "keystore.pem"
    if not keystore.exists():
        tls.write_private(keystore, (tls_dir / tls.KEY_FILE).read_bytes() + (tls_dir / tls.CERT_FILE).read_bytes())
    return {
        "bootstrap.servers": kafka_bootstrap_servers,
        "security.protocol": "SSL",
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(tls_dir / tls.CA_FILE),
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(keystore),
    }


@dataclass
class UserFiles:
    """The client settings ``sluice dev user NAME`` wrote: one certificate, User:NAME, three spellings."""

    sluice: Path  # --command-config of the sluice CLI (security.protocol, ssl.cafile ...)
    kafka_java: Path | None  # Kafka's tools and Java clients (None: the cluster has no Kafka listener)
    librdkafka: Path | None  # kcat -F, confluent-kafka


def add_user(state: DevState, name: str) -> UserFiles:
    """A client certificate for ``User:name`` from the dev cluster's clients CA, and the settings files using it."""
    if not state.secure:
        raise DevClusterError(
            "this dev cluster is plaintext: every client is User:ANONYMOUS and no certificate is needed; "
            "start one with `sluice dev up --secure` for principals and ACLs"
        )
    data_dir = Path(state.data_dir)
    try:
        tls_dir = client_tls_dir(data_dir, name)
    except ValueError as exc:
        raise DevClusterError(str(exc)) from None
    users = data_dir / USERS_DIR
    users.mkdir(mode=0o700, exist_ok=True)
    sluice_file = write_properties(
        {
            "security.protocol": "SSL",
            "ssl.cafile": str(tls_dir / tls.CA_FILE),
            "ssl.certfile": str(tls_dir / tls.CERT_FILE),
            "ssl.keyfile": str(tls_dir / tls.KEY_FILE),
        },
        users / f"{name}.properties",
    )
    java = librdkafka = None
    if state.kafka_bootstrap_servers:
        java = write_properties(
            java_kafka_properties(tls_dir, state.kafka_bootstrap_servers), users / f"{name}-kafka.properties"
        )
        librdkafka = write_properties(
            librdkafka_properties(tls_dir, state.kafka_bootstrap_servers), users / f"{name}-librdkafka.properties"
        )
    return UserFiles(sluice_file, java, librdkafka)


def write_properties(properties: Mapping[str, str], path: Path) -> Path:
    """A ``KEY=VALUE`` properties file, mode 0600 (it names a private key)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("".join(f"{k}={v}\n" for k, v in properties.items()))
    os.chmod(path, 0o600)
    return path


def _parse_kv(items: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--config wants KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def serve(argv: Sequence[str] | None = None) -> int:
    """Supervisor main: run a LocalCluster until SIGTERM/SIGINT, keeping the state file current."""
    from sluice.testing import LocalCluster

    ap = argparse.ArgumentParser(prog="python -m sluice.cli.engines.dev_cluster")
    ap.add_argument("--data", required=True)
    ap.add_argument("--brokers", type=int, default=1)
    ap.add_argument("--port", type=int, default=9092)
    ap.add_argument("--startup-timeout", type=float, default=90.0)
    ap.add_argument("--config", action="append", default=[])
    ap.add_argument("--python", default=sys.executable, help="interpreter that runs the brokers")
    ap.add_argument("--secure", action="store_true", help="mTLS client listeners and the authorizer")
    ap.add_argument("--kafka-port", type=int, help="open Kafka listeners: broker 0's port, the others follow (0: free)")
    args = ap.parse_args(argv)
    data_dir = Path(args.data)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    config = _parse_kv(args.config)
    state = DevState(supervisor_pid=os.getpid(), data_dir=str(data_dir), secure=args.secure, config=config)
    write_state(data_dir, state)
    ports = [args.port + i for i in range(args.brokers)] if args.port else None
    kafka_ports: list[int] | None = None
    if args.kafka_port is not None:
        kafka_ports = [args.kafka_port + i if args.kafka_port else 0 for i in range(args.brokers)]
    try:
        cluster = LocalCluster(
            brokers=args.brokers,
            data_dir=data_dir,
            config=config,
            ports=ports,
            startup_timeout=args.startup_timeout,
            python=args.python,
            secure=args.secure,
            kafka_ports=kafka_ports,
        )
        cluster.start()
        if kafka_ports is not None:
            state.kafka_bootstrap_servers = cluster.kafka_bootstrap_servers
        if args.secure:
            state.admin_config = str(write_client_properties(cluster.client_config("admin"), data_dir / ADMIN_CONFIG))
        if args.secure and kafka_ports is not None:
            state.admin_kafka_config = str(
                write_properties(cluster.kafka_client_properties("admin"), data_dir / ADMIN_KAFKA_CONFIG)
            )
            state.admin_librdkafka_config = str(
                write_properties(
                    librdkafka_properties(client_tls_dir(data_dir, "admin"), cluster.kafka_bootstrap_servers),
                    data_dir / ADMIN_LIBRDKAFKA_CONFIG,
                )
            )
    except Exception as exc:
        state.status, state.error = "failed", str(exc)
        write_state(data_dir, state)
        print(f"dev cluster failed to start: {exc}", file=sys.stderr, flush=True)
        return 1
    try:
        state.status = "running"
        while not stop.is_set():
            snapshot = cluster.describe()
            changed = snapshot["brokers"] != state.brokers or snapshot["controller"] != state.controller
            if changed or not state.bootstrap_servers:
                state.bootstrap_servers = snapshot["bootstrap_servers"]
                state.brokers = snapshot["brokers"]
                state.controller = snapshot["controller"]
                write_state(data_dir, state)
                print(f"state: {json.dumps(state.brokers)}", flush=True)
            stop.wait(1.0)
    finally:
        print("stopping the dev cluster", flush=True)
        cluster.close()
        (data_dir / STATE_FILE).unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(serve())
