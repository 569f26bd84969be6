"""The broker process: ``python -m sluice.broker`` / ``sluice broker``.

Start-up order matters: the coordinators subscribe to leadership before the
first metadata refresh, so loading their internal partitions is the first
thing that happens when this broker learns it leads them; the health service
says SERVING only once they are loaded, which is what LocalCluster (and a
Kubernetes readiness probe) waits for.

Metrics (``--metrics-listen HOST:PORT``, off unless given): Prometheus
``GET /metrics`` on its own port, served on this loop (:mod:`sluice.broker.metrics`).
Off by default because it is an unauthenticated port that names every topic
and consumer group: it should be opened on purpose, on an address chosen for
it (the chart opens it on the pod's port 9404, LocalCluster on loopback).
It starts with the gRPC server, before the broker is ready, so a broker stuck
loading its coordinator partitions can still be looked at.

Inter-broker listener (``--inter-broker-listen HOST:PORT`` with ``--broker-tls-dir DIR``):
the only place where other brokers replicate from this one and send it transaction markers,
mutual TLS with the cluster CA (:mod:`sluice.broker.server`). Without it the broker runs
alone: it serves no inter-broker RPC, on any port. The TLS files are checked every second and
reloaded when they change (renewed certificates, a CA rotation: :mod:`sluice.broker.security.reload`);
what was loaded is reported in the broker's ``brokers/<id>`` document.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence

from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer

from sluice.broker import tracing
from sluice.broker.cluster import ClusterView
from sluice.broker.config import BrokerConfig, ConfigError
from sluice.broker.core import build_core
from sluice.broker.kafka.options import KafkaOptions, start_kafka_listener
from sluice.broker.log.storage import RocksStorage
from sluice.broker.metrics.exporter import BrokerMetrics
from sluice.broker.security import reload, tokens
from sluice.broker.server import BrokerServicer, open_listeners
from sluice.errors import KafkaStorageError
from sluice.metadata import open_store
from sluice.metadata.faults import CuttableStore
from sluice.metadata.kubernetes import KubernetesStoreError
from sluice.metadata.store import StoreUnavailable
from sluice.tls import TlsError, load_dir

log = logging.getLogger("sluice.broker")

METADATA_POLL_S = 0.1
LIVENESS_SERVICE = "sluice.liveness"
ISR_CHECK_S = 0.5
HW_CHECKPOINT_S = 1.0
BROKERS_WAIT_S = 30.0
METADATA_CUT_FILE = "metadata-cut"  # the metadata.cut test hook's file, in the data directory


async def wait_for_brokers(cluster: ClusterView, config: BrokerConfig) -> None:
    """Before creating the internal topics, give the other brokers of the cluster time to register.

    The internal topics are created once, by the first broker that sees as many live brokers as
    their configured replication factor (ClusterView.ensure_internal_topics). Waiting here only
    makes a cluster whose brokers start together have them at once; after BROKERS_WAIT_S the
    broker goes on starting and creates them from its metadata watch when the brokers come.
    """
    from sluice.broker.cluster import INTERNAL_TOPICS

    cluster.refresh()
    if all(name in cluster.topics for name in INTERNAL_TOPICS):
        return
    wanted = max(config.int("transaction.state.log.replication.factor"), config.int("offsets.topic.replication.factor"))
    deadline = time.monotonic() + BROKERS_WAIT_S
    while len(cluster.brokers) < wanted and time.monotonic() < deadline:
        await asyncio.sleep(METADATA_POLL_S)
        cluster.refresh()


async def controlled_shutdown(cluster: ClusterView, config: BrokerConfig, hurry: asyncio.Event) -> None:
    """Wait (metadata keeps being refreshed meanwhile) until the controller moved this broker's
    leaderships and fenced it out of the other leaders' ISRs (ClusterView.isrs_to_leave): a broker
    that leads nothing but stopped at once left acks=all writes waiting for it until its failure
    timeout, since the controller may not have seen its NOT_SERVING before it was gone."""
    started = time.monotonic()
    limit_s = config.int("controlled.shutdown.timeout.ms") / 1000
    last_report = 0.0
    while not hurry.is_set():
        held = cluster.leaderships_to_hand_over(config.broker_id)
        isrs = cluster.isrs_to_leave(config.broker_id)
        waited = time.monotonic() - started
        if not held and not isrs:
            log.info("controlled shutdown: leaderships handed over and ISRs left after %.1f s", waited)
            return
        if waited >= limit_s:
            log.warning(
                "controlled shutdown: still leading %d partition(s) and in %d other leader(s)' ISRs after %.1f s "
                "(%s); stopping anyway",
                len(held), len(isrs), waited, ", ".join((held + isrs)[:5]),
            )  # fmt: skip
            return
        if waited - last_report >= 5.0:
            log.info(
                "controlled shutdown: waiting for the controller to move %d leadership(s) and to fence %d ISR "
                "membership(s)",
                len(held), len(isrs),
            )  # fmt: skip
            last_report = waited
        await asyncio.sleep(METADATA_POLL_S)
    log.warning("controlled shutdown: cut short by a second signal")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sluice broker", description="Run a Sluice broker.")
    parser.add_argument(
        "--id",
        type=int,
        default=None,
        help="broker id (>= 0), unique in the cluster (default: the StatefulSet pod ordinal, the -N ending $HOSTNAME)",
    )
    parser.add_argument("--listen", required=True, help="HOST:PORT to serve gRPC on")
    parser.add_argument("--data", required=True, help="data directory (RocksDB lives in DATA/rocksdb)")
    parser.add_argument(
        "--metadata",
        default=None,
        help="metadata store: a SQLite file path (default: DATA/metadata.sqlite), or kubernetes://NAMESPACE "
        "(custom resources through the API server; in a pod, kubernetes:// is the pod's namespace)",
    )
    parser.add_argument(
        "--config", action="append", default=[], metavar="KEY=VALUE", help="a broker setting (Kafka's names)"
    )
    parser.add_argument(
        "--metrics-listen",
        default=None,
        metavar="HOST:PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (default: off; see docs/metrics.md)",
    )
    parser.add_argument(
        "--tracing",
        default=os.environ.get("SLUICE_TRACING") or None,
        metavar="EXPORTER",
        help="OpenTelemetry spans of Produce, Fetch and EndTxn to otlp, console or file:PATH "
        "(default: $SLUICE_TRACING, else off; needs the otel extra)",
    )
    parser.add_argument(
        "--inter-broker-listen",
        default=None,
        metavar="HOST:PORT",
        help="serve the inter-broker RPCs (replication, transaction markers) here, mutual TLS with the cluster "
        "CA; HOST must be the --listen host (default: none, the broker runs alone)",
    )
    parser.add_argument(
        "--broker-tls-dir",
        default=None,
        metavar="DIR",
        help="this broker's TLS material for the inter-broker listener: DIR/ca.crt (the cluster CA), "
        "DIR/tls.crt and DIR/tls.key (this broker's certificate; a Kubernetes TLS Secret's layout)",
    )
    parser.add_argument(
        "--client-listener",
        default="plaintext",
        choices=("plaintext", "tls", "mtls", "token"),
        help="security of the --listen port: plaintext (default: a local cluster on loopback), tls (this "
        "broker's certificate from --broker-tls-dir), mtls (tls, and clients must present a certificate from "
        "--clients-ca; their principal is User:<CN>), token (tls, and every call carries a Kubernetes "
        "ServiceAccount token, checked with a TokenReview; the principal is ServiceAccount:<namespace>:<name>)",
    )
    parser.add_argument(
        "--token-audience",
        default=None,
        metavar="AUDIENCE",
        help="the audience ServiceAccount tokens must be issued for (with --client-listener token; default: sluice)",
    )
    parser.add_argument(
        "--health-listen",
        default=None,
        metavar="HOST:PORT",
        help="also serve the gRPC health service alone, in plaintext, here (for kubelet gRPC probes, which "
        "cannot speak TLS; default: off, health is served on --listen)",
    )
    parser.add_argument(
        "--clients-ca",
        default=None,
        metavar="FILE",
        help="PEM file of the CA(s) client certificates are verified against (with --client-listener mtls)",
    )
    parser.add_argument(
        "--kafka-listen",
        default=None,
        metavar="HOST:PORT",
        help="also serve the Kafka protocol on HOST:PORT, secured as --client-listener says (default: off; "
        "see docs/kafka-compatibility.md)",
    )
    parser.add_argument(
        "--kafka-advertise",
        default=None,
        metavar="HOST:PORT",
        help="the Kafka address clients are told to use for this broker (default: the --kafka-listen address)",
    )
    parser.add_argument("--log-level", default="INFO")
    return parser.parse_args(argv)


def parse_metrics_listen(value: str | None, flag: str = "--metrics-listen") -> tuple[str, int] | None:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) of --metrics-listen (or ``flag``), or None when it is not given."""
    if value is None:
        return None
    host, sep, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{flag} must be HOST:PORT with a port in 1..65535, not {value!r}")
    return host, int(port)


def pod_ordinal_id(hostname: str) -> int:
    """The broker id of a StatefulSet pod: the ordinal its name ends with (``sluice-broker-2`` -> 2)."""
    name = hostname.split(".", 1)[0]
    _, sep, ordinal = name.rpartition("-")
    if not sep or not ordinal.isdigit():
        raise ConfigError(
            f"no --id given, and the host name {hostname!r} does not end with a StatefulSet ordinal (NAME-N)"
        )
    return int(ordinal)


def build_config(args: argparse.Namespace) -> BrokerConfig:
    host, sep, port = args.listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"--listen must be HOST:PORT, not {args.listen!r}")
    if args.id is None:
        args.id = pod_ordinal_id(os.environ.get("HOSTNAME", ""))
    if args.id < 0:
        raise ConfigError(f"--id must be >= 0, not {args.id}")
    overrides: dict[str, str] = {}
    for item in args.config:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--config takes KEY=VALUE, not {item!r}")
        overrides[key.strip()] = value
    metadata = args.metadata or os.path.join(args.data, "metadata.sqlite")
    inter_broker_port = 0
    if args.inter_broker_listen is not None:
        ib_host, sep, ib_port = args.inter_broker_listen.rpartition(":")
        if not sep or not ib_port.isdigit() or not 0 < int(ib_port) < 65536:
            raise ConfigError(f"--inter-broker-listen must be HOST:PORT, not {args.inter_broker_listen!r}")
        if ib_host != host:
            raise ConfigError(
                f"--inter-broker-listen must be on the --listen host {host!r} (a broker registers one host), "
                f"not {ib_host!r}"
            )
        if int(ib_port) == int(port):
            raise ConfigError("--inter-broker-listen needs a port of its own, not the --listen port")
        inter_broker_port = int(ib_port)
    return BrokerConfig.build(
        args.id,
        host,
        int(port),
        args.data,
        metadata,
        overrides,
        inter_broker_port=inter_broker_port,
        tls_dir=args.broker_tls_dir or "",
        client_listener=args.client_listener,
        clients_ca=args.clients_ca or "",
        token_audience=args.token_audience or "",
    )


async def serve(
    config: BrokerConfig,
    metrics_listen: tuple[str, int] | None = None,
    kafka: KafkaOptions | None = None,
    health_listen: tuple[str, int] | None = None,
    reviewer: tokens.Reviewer | None = None,
) -> None:
    os.makedirs(config.data_dir, exist_ok=True)
    store = open_store(config.metadata_url)
    if config.hook("metadata.cut"):  # test-only: cut off from the store while DATA/metadata-cut exists
        store = CuttableStore(store, os.path.join(config.data_dir, METADATA_CUT_FILE))
    storage = RocksStorage(
        os.path.join(config.data_dir, "rocksdb"), config.int("log.background.write.max.bytes.per.second")
    )
    core = build_core(config, store, storage)
    cluster, logs, replicas, txn, groups, gate = (
        core.cluster,
        core.logs,
        core.replicas,
        core.txn,
        core.groups,
        core.gate,
    )
    cluster.register()
    await core.start()

    servicer = BrokerServicer(config, cluster, replicas, txn, groups, gate)
    health = HealthServicer()
    # one token authenticator (one cache of reviews) for both client ports of a token listener
    authenticator = None
    if config.client_listener == "token":
        reviewer = reviewer if reviewer is not None else tokens.reviewer_for(config.metadata_url)
        authenticator = tokens.TokenAuthenticator(reviewer, config.token_audience)
    server = open_listeners(config, servicer, health, health_listen, reviewer, authenticator)
    if server.interbroker is None:
        log.warning("no --inter-broker-listen: this broker serves no inter-broker RPC and cannot be replicated from")
    metrics: BrokerMetrics | None = None
    if metrics_listen is not None:
        metrics = BrokerMetrics(config, storage, cluster, replicas, txn, groups)
        try:
            await metrics.start(*metrics_listen)
        except OSError as exc:  # before the gRPC port opens: a broker that cannot serve what was asked stops
            host, port = metrics_listen
            raise SystemExit(f"sluice broker: cannot serve metrics on {host}:{port}: {exc}") from None
        log.info("broker %d serves metrics at http://%s:%d/metrics", config.broker_id, *metrics_listen)
    kafka_listener = await start_kafka_listener(kafka, config, cluster, replicas, txn, groups, gate, authenticator)
    await server.start()
    # Liveness (the process answers) is separate from readiness (""): the controller's failure
    # detector checks liveness, since a broker only becomes ready once it was elected leader of
    # the coordinator partitions it loads.
    await health.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
    log.info(
        "broker %d listening on %s:%d (clients), inter-broker port %s",
        config.broker_id, config.host, config.port, config.inter_broker_port or "none",
    )  # fmt: skip
    # Alive (for the failure detector) while waiting for the other brokers; ready only later.
    await wait_for_brokers(cluster, config)
    for waiting in cluster.ensure_internal_topics():  # else from watch_metadata, when brokers come
        log.warning("%s; coordinators answer COORDINATOR_NOT_AVAILABLE meanwhile", waiting)
    cluster.refresh()
    logs.delete_stray_partitions()  # the whole metadata is read now: what it does not assign goes
    replicas.fetchers.start()

    stopping = asyncio.Event()
    hurry = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        (hurry if stopping.is_set() else stopping).set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)

    # Readiness waits for the coordinator partitions this broker leads when it starts to be loaded,
    # once. Leaderships gained later (a failover, or the election of partitions that were waiting
    # for this broker as their last in-sync replica) load while it stays ready: those partitions
    # answer COORDINATOR_LOAD_IN_PROGRESS (retriable) meanwhile, and readiness never depends on
    # an election. It must not: on Kubernetes the operator counts only Ready pods as live, so a
    # broker that waited to be elected before turning Ready would never be elected, and a long
    # load after a failover would make a healthy broker look dead (docs/architecture.md).
    started_up = False

    internal_topics_missing = True

    unreachable_since: float | None = None

    async def watch_metadata() -> None:
        nonlocal started_up, internal_topics_missing, unreachable_since
        while True:
            try:
                cluster.refresh()
                if internal_topics_missing:
                    internal_topics_missing = bool(cluster.ensure_internal_topics())
                gate.refresh()  # ACLs and client quotas: the acls/ and quotas/ documents, watched with the rest
                if unreachable_since is not None:
                    log.warning("metadata store reachable again after %.1f s", time.monotonic() - unreachable_since)
                    unreachable_since = None
            except StoreUnavailable as exc:
                # The broker goes on with the metadata it has (docs/faults.md): said once, not every poll.
                if unreachable_since is None:
                    unreachable_since = time.monotonic()
                    log.warning("metadata store unreachable, serving with the metadata last read: %s", exc)
            except Exception:
                log.exception("metadata refresh failed")
            # a broker whose log directory is offline is alive but not ready (sluice.broker.log.storage)
            started_up = started_up or (txn.is_ready() and groups.is_ready())
            serving = started_up and not stopping.is_set() and not logs.storage_failure
            status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
            await health.set("", status)
            await health.set("sluice.v1.Broker", status)
            await asyncio.sleep(METADATA_POLL_S)

    async def retention() -> None:
        interval = config.int("log.retention.check.interval.ms") / 1000
        while True:
            await asyncio.sleep(interval)
            await logs.apply_retention()

    async def producer_expiry() -> None:
        interval = config.int("producer.id.expiration.check.interval.ms") / 1000
        while True:
            await asyncio.sleep(interval)
            await logs.expire_producers()

    async def replication_housekeeping() -> None:
        interval = min(config.int("replica.lag.time.max.ms") / 4000, ISR_CHECK_S)
        last_checkpoint = 0.0
        while True:
            await asyncio.sleep(interval)
            try:
                await replicas.maintain_isr()
                logs.delete_stray_partitions_if_due()
                # both write this broker's document when something changed: a store call may block
                await asyncio.to_thread(logs.report_storage_failure)
                await asyncio.to_thread(logs.check_log_dir_space)
                if time.monotonic() - last_checkpoint >= HW_CHECKPOINT_S:
                    logs.checkpoint_high_watermarks()
                    last_checkpoint = time.monotonic()
            except Exception:
                log.exception("replication housekeeping failed")

    async def follow_tls_files() -> None:
        files = reload.files_for(config)
        reported = 0
        while True:
            try:
                files.check()
                if files.loaded.version != reported:  # also the first report, after register()
                    await asyncio.to_thread(files.report, store)  # a store write may block
                    reported = files.loaded.version
            except Exception:
                log.exception("checking the TLS files failed")
            await asyncio.sleep(reload.CHECK_INTERVAL_S)

    tasks = [
        asyncio.create_task(watch_metadata()),
        asyncio.create_task(retention()),
        asyncio.create_task(producer_expiry()),
        asyncio.create_task(replication_housekeeping()),
    ]
    if config.tls_dir:
        tasks.append(asyncio.create_task(follow_tls_files()))
    await stopping.wait()
    log.info("broker %d shutting down", config.broker_id)
    if config.get("controlled.shutdown.enable"):
        await health.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.NOT_SERVING)
        await controlled_shutdown(cluster, config, hurry)
    await health.enter_graceful_shutdown()
    for task in tasks:
        task.cancel()
    servicer.interbroker.end_streams()  # followers' streams would hold the graceful stop for its grace
    await server.stop(grace=2.0)
    if kafka_listener is not None:
        await kafka_listener.stop()
    if metrics is not None:
        await metrics.stop()
    await core.stop()
    store.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s [broker] %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        config = build_config(args)
        metrics_listen = parse_metrics_listen(args.metrics_listen)
        health_listen = parse_metrics_listen(args.health_listen, "--health-listen")
        kafka = KafkaOptions.parse(args.kafka_listen, args.kafka_advertise)
        # the API server client of the token listener's TokenReviews: missing credentials stop the start here
        reviewer = tokens.reviewer_for(config.metadata_url) if config.client_listener == "token" else None
        if args.tracing:
            tracing.configure(args.tracing, config.broker_id)
        if config.tls_dir:
            load_dir(config.tls_dir, config.broker_id)  # unreadable material stops the broker here, with its name
    except (ConfigError, TlsError, KubernetesStoreError) as exc:
        print(f"sluice broker: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(config, metrics_listen, kafka, health_listen, reviewer))
    except KafkaStorageError as exc:  # the log directory cannot be opened (a full disk at start)
        print(f"sluice broker: {exc}; free space on the data volume and start again", file=sys.stderr)
        return 1
    finally:
        tracing.shutdown()  # flushes the last spans
    return 0
