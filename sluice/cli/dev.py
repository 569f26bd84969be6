"""``sluice dev up|down|status``: a local cluster running in the background.

The work (the detached supervisor process, its state file, finding a running cluster) is the
engine :mod:`sluice.cli.engines.dev_cluster`; this module parses the options and says what
happened: progress and outcome on stderr, the bootstrap servers (``up``) or the status table on
stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from sluice.cli.argtypes import key_value, non_negative_int, positive_float, positive_int
from sluice.cli.exits import USAGE, CliError
from sluice.cli.output import err, print_json, table

if TYPE_CHECKING:
    from sluice.cli.engines.dev_cluster import DevState
    from sluice.cli.parser import Subcommands


def register(sub: Subcommands) -> None:
    dev = sub.add_parser("dev", help="a local cluster running in the background")
    dev_sub = dev.add_subparsers(dest="dev_command", metavar="ACTION", required=True)
    up = dev_sub.add_parser("up", help="start the dev cluster (prints its bootstrap servers)")
    # None defaults: `up` against a running cluster compares only the options given (a plain `up` finds it)
    up.add_argument("--brokers", type=positive_int, help="number of brokers (default 1)")
    up.add_argument("--data", metavar="DIR", help="data directory (default: ~/.sluice/dev, or $SLUICE_HOME/dev)")
    up.add_argument(
        "--port",
        type=non_negative_int,
        help="port of broker 0; broker N gets PORT+N (default 9092; 0: any free ports)",
    )
    up.add_argument(
        "--config",
        type=key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a broker setting for every broker (num.partitions=3, auto.create.topics.enable=true ...); repeatable",
    )
    up.add_argument("--timeout", type=positive_float, default=90.0, help="seconds to wait for the brokers")
    up.add_argument(
        "--secure",
        action="store_true",
        help="clients need a certificate (mutual TLS) and ACLs (the authorizer is on); User:admin's "
        "settings are written to DATA/admin.properties for `sluice acls --command-config` (docs/security.md)",
    )
    up.add_argument(
        "--kafka-listener",
        action=argparse.BooleanOptionalAction,
        help="open a Kafka-protocol listener on every broker, for Kafka's own clients (kcat, confluent-kafka, "
        "Java): on by default, --no-kafka-listener for gRPC only (with --secure: TLS with client certificates "
        "and ACLs, the super user's settings for Kafka's tools in DATA/admin-kafka.properties; "
        "docs/kafka-compatibility.md)",
    )
    up.add_argument(
        "--kafka-port",
        type=non_negative_int,
        help="Kafka port of broker 0; broker N gets KAFKA_PORT+N (default PORT+10000: 19092 beside 9092; "
        "0: any free ports)",
    )
    user = dev_sub.add_parser(
        "user",
        help="a client certificate for User:NAME on a --secure dev cluster, and settings files for the sluice CLI, "
        "Kafka's Java tools and librdkafka (kcat -F, confluent-kafka) that use it",
    )
    user.add_argument("name", help="the principal's name (the certificate's CN): User:NAME")
    user.add_argument("--data", metavar="DIR", help="the dev cluster's data directory (default: the last up's)")
    down = dev_sub.add_parser("down", help="stop the dev cluster (its data is kept)")
    down.add_argument("--data", metavar="DIR", help="the dev cluster's data directory (default: the last up's)")
    status = dev_sub.add_parser("status", help="show the dev cluster's processes and health")
    status.add_argument("--data", metavar="DIR", help="the dev cluster's data directory (default: the last up's)")
    status.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    from sluice.cli.engines import dev_cluster

    if args.dev_command == "up":
        data_dir = Path(args.data).expanduser().resolve() if args.data else dev_cluster.default_data_dir()
        return _up(args, data_dir)
    data_dir = dev_cluster.resolve_data_dir(args.data)
    if args.dev_command == "user":
        return _user(args, data_dir)
    if args.dev_command == "down":
        stopped = dev_cluster.down(data_dir)
        if stopped is None:
            err(f"no dev cluster is running (data directory {data_dir})")
        else:
            err(f"dev cluster stopped (data kept in {stopped.data_dir})")
        return 0
    return _status(args, data_dir)


def _up(args: argparse.Namespace, data_dir: Path) -> int:
    from sluice.cli.engines import dev_cluster

    last = [0.0]

    def waiting(elapsed: float) -> None:
        if elapsed - last[0] >= 5.0:
            last[0] = elapsed
            err(f"waiting for {args.brokers or 1} broker(s) to be ready... {elapsed:.0f}s")

    if args.kafka_port is not None and args.kafka_listener is False:
        raise CliError("--kafka-port is the Kafka listener's port: do not combine it with --no-kafka-listener", USAGE)
    config = dict(args.config)
    _check_config(config)
    running = dev_cluster.running_state(data_dir)
    if running is not None:
        differences = _differences(args, config, running)
        if differences:
            raise CliError(
                f"a dev cluster with other options is already running in {data_dir}: {'; '.join(differences)}. "
                "Stop it first (`sluice dev down`; its data is kept) or give another --data directory"
            )
    brokers = args.brokers or 1
    port = 9092 if args.port is None else args.port
    kafka_port: int | None = None
    if args.kafka_listener is not False:  # on unless --no-kafka-listener
        kafka_port = args.kafka_port if args.kafka_port is not None else dev_cluster.default_kafka_port(port)
    if running is None:
        err(f"starting a dev cluster of {brokers} broker(s) in {data_dir} ...")
    try:
        state, started = dev_cluster.up(
            data_dir, brokers, port, config, timeout=args.timeout, on_wait=waiting,
            secure=args.secure, kafka_port=kafka_port,
        )  # fmt: skip
    except dev_cluster.DevClusterError as exc:
        hint = " (use --port/--kafka-port to pick other ports, or 0 for any free ones)" if "in use" in str(exc) else ""
        raise CliError(f"the dev cluster failed to start{hint}: {exc}") from None
    if not started:
        err(f"a dev cluster is already running (supervisor pid {state.supervisor_pid}, data {state.data_dir})")
    else:
        err(f"dev cluster up: {len(state.brokers)} broker(s), logs in {state.data_dir}")
        if state.secure:
            err(f"secure: mutual TLS and ACLs; the super user's settings are in {state.admin_config} "
                "(sluice acls ... --command-config FILE; docs/security.md)")  # fmt: skip
    err(f"Sluice clients: {state.bootstrap_servers}  (the sluice CLI's --bootstrap-server, sluice.client)")
    if state.kafka_bootstrap_servers:
        err(f"Kafka clients:  {state.kafka_bootstrap_servers}  (bootstrap.servers of kcat, confluent-kafka, Java)")
        if state.admin_kafka_config:
            err(f"secure Kafka listeners (TLS, ACLs): the super user's settings for Kafka's tools are in "
                f"{state.admin_kafka_config} (--command-config FILE), for librdkafka in "
                f"{state.admin_librdkafka_config} (kcat -F FILE); other principals: "
                "`sluice dev user NAME`")  # fmt: skip
    if started:
        err("stop it with `sluice dev down`")
    print(state.bootstrap_servers)
    return 0


def _user(args: argparse.Namespace, data_dir: Path) -> int:
    from sluice.cli.engines import dev_cluster

    state = dev_cluster.running_state(data_dir)
    if state is None:
        raise CliError(f"no dev cluster is running (data directory {data_dir}): `sluice dev up --secure` first")
    try:
        files = dev_cluster.add_user(state, args.name)
    except dev_cluster.DevClusterError as exc:
        raise CliError(str(exc)) from None
    print(f"sluice CLI (--command-config):                 {files.sluice}")
    if files.kafka_java is not None:
        print(f"Kafka's Java tools and clients (--command-config): {files.kafka_java}")
    if files.librdkafka is not None:
        print(f"librdkafka (kcat -F, confluent-kafka):         {files.librdkafka}")
    err(
        f"User:{args.name} can do nothing until ACLs allow it, e.g. `sluice acls add --allow-principal "
        f"User:{args.name} --operation write --topic orders --command-config {state.admin_config}`"
    )
    return 0


def _check_config(config: dict[str, str]) -> None:
    """The brokers' own validation of --config, before any process starts: one line, exit 2.

    Otherwise a bad key surfaced as "broker-0 exited with code 2" and 80 lines of logs.
    """
    from sluice.broker.config import BrokerConfig, ConfigError

    try:
        BrokerConfig.build(0, "127.0.0.1", 9092, "/nonexistent", "unused://", config)
    except ConfigError as exc:
        raise CliError(f"--config: {exc}", USAGE) from None


def _differences(args: argparse.Namespace, config: dict[str, str], running: DevState) -> list[str]:
    """How the options given differ from the running cluster's (options not given never differ)."""
    out: list[str] = []
    if args.brokers is not None and args.brokers != len(running.brokers):
        out.append(f"--brokers {args.brokers}, it has {len(running.brokers)}")
    if args.secure and not running.secure:
        out.append("--secure, it is plaintext")
    has_kafka = bool(running.kafka_bootstrap_servers)
    if args.kafka_listener is not None and args.kafka_listener != has_kafka:
        out.append("--kafka-listener, it has none" if args.kafka_listener else "--no-kafka-listener, it has one")
    ports = [int(b["address"].rsplit(":", 1)[1]) for b in running.brokers if b.get("address")]
    if args.port and ports and args.port != min(ports):
        out.append(f"--port {args.port}, it listens on {min(ports)}")
    kafka_ports = [int(a.rsplit(":", 1)[1]) for a in running.kafka_bootstrap_servers.split(",") if a]
    if args.kafka_port and kafka_ports and args.kafka_port != min(kafka_ports):
        out.append(f"--kafka-port {args.kafka_port}, its Kafka port is {min(kafka_ports)}")
    changed = {k: v for k, v in config.items() if running.config.get(k) != v}
    if changed:
        given = " ".join(f"{k}={v}" for k, v in changed.items())
        out.append(f"--config {given}, it runs with {running.config or 'no --config'}")
    return out


def _status(args: argparse.Namespace, data_dir: Path) -> int:
    from sluice.cli.engines import dev_cluster
    from sluice.testing import check_health

    current = dev_cluster.running_state(data_dir)
    if current is None:
        if args.json:
            print_json({"running": False, "data_dir": str(data_dir)})
        else:
            err(f"no dev cluster is running (data directory {data_dir}); start one with `sluice dev up`")
        return 1
    credentials = None
    if current.secure:  # mTLS client listeners: check with the cluster's own (controller) certificate
        import grpc

        from sluice import tls
        from sluice.testing.certs import controller_tls_dir

        m = tls.load_dir(controller_tls_dir(Path(current.data_dir)))
        credentials = grpc.ssl_channel_credentials(m.ca_pem, m.key_pem, m.cert_pem)
    brokers = []
    for b in current.brokers:
        alive = dev_cluster.pid_alive(int(b.get("pid") or 0))
        health = check_health(b["address"], timeout=2.0, credentials=credentials) if alive else "DOWN"
        brokers.append({**b, "alive": alive, "health": health})
    healthy = all(b["health"] == "SERVING" for b in brokers)
    if args.json:
        print_json({"running": True, "healthy": healthy, **dataclasses.asdict(current), "brokers": brokers})
    else:
        print(f"dev cluster: supervisor pid {current.supervisor_pid}, data {current.data_dir}")
        print(f"bootstrap servers: {current.bootstrap_servers}")
        if current.kafka_bootstrap_servers:
            print(f"Kafka bootstrap servers: {current.kafka_bootstrap_servers}")
        rows = [
            [b["id"], b["address"], b.get("kafka_address") or "-", b.get("pid"), b["health"],
             b.get("metrics_url") or "-", b.get("log", "")]
            for b in brokers
        ]  # fmt: skip
        print(table(rows, ["BROKER", "ADDRESS", "KAFKA", "PID", "HEALTH", "METRICS", "LOG"]))
    return 0 if healthy else 1
