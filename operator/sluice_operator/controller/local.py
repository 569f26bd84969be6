"""The embedded cluster's controller process: ``python -m sluice.operator.controller.local``.

One per local cluster (LocalCluster and ``sluice dev up`` start it), next to
the brokers, sharing their metadata file. It runs the
:class:`~sluice.operator.controller.loop.ControllerLoop` (what one round does is
described there) every ``--interval-ms``, with broker liveness from gRPC
health checks (:mod:`sluice.operator.liveness.brokers`): a broker failing its
checks for ``--failure-timeout-ms`` is dead.

SIGTERM or SIGINT ends the loop between rounds; the process exits 0.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence

import grpc

from sluice import tls
from sluice.metadata import MetadataStore, open_store
from sluice.metadata.faults import CuttableStore
from sluice.operator import metrics
from sluice.operator.controller.loop import (
    DEFAULT_INTERVAL_MS,
    DEFAULT_PREFERRED_LEADER_DELAY_MS,
    DEFAULT_PREFERRED_LEADER_HOLD_MS,
    ControllerLoop,
    log,
)
from sluice.operator.liveness.brokers import DEFAULT_TIMEOUT_MS, FailureDetector, GrpcHealthChecker


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m sluice.operator.controller.local",
        description="Run the embedded cluster's controller: failure detection and leader election.",
    )
    ap.add_argument("--metadata", required=True, help="the cluster's metadata store (a SQLite file path)")
    ap.add_argument(
        "--failure-timeout-ms",
        type=int,
        default=DEFAULT_TIMEOUT_MS,
        help=f"a broker is dead after failing health checks this long (default {DEFAULT_TIMEOUT_MS})",
    )
    ap.add_argument(
        "--interval-ms", type=int, default=DEFAULT_INTERVAL_MS, help="time between rounds (default %(default)s)"
    )
    ap.add_argument(
        "--check-timeout-ms",
        type=int,
        default=None,
        help="deadline of one health check (default: the failure timeout; checks never hold up a round)",
    )
    ap.add_argument(
        "--preferred-leaders",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="move leadership back to in-sync preferred replicas (Kafka's auto.leader.rebalance.enable)",
    )
    ap.add_argument(
        "--preferred-leader-delay-ms",
        type=int,
        default=DEFAULT_PREFERRED_LEADER_DELAY_MS,
        help="a returning broker takes its preferred leaderships back once alive this long (default %(default)s)",
    )
    ap.add_argument(
        "--preferred-leader-hold-ms",
        type=int,
        default=DEFAULT_PREFERRED_LEADER_HOLD_MS,
        help="a topic's preferred-leader moves wait at most this long for its replicas still catching up, "
        "to move in one write (0: no waiting; default %(default)s)",
    )
    ap.add_argument(
        "--unclean-leader-election",
        action="store_true",
        help="default of unclean.leader.election.enable for topics that do not set it",
    )
    ap.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        default=None,
        help="serve the controller's Prometheus metrics (sluice.operator.metrics) here (default: off)",
    )
    ap.add_argument(
        "--tls-dir",
        default=None,
        metavar="DIR",
        help="health-check brokers over TLS with DIR/{ca.crt,tls.crt,tls.key} (brokers whose client listener "
        "requires certificates; the local cluster's own, from its cluster CA)",
    )
    ap.add_argument(
        "--test-metadata-cut",
        metavar="FILE",
        default=None,
        help="test-only: every metadata store call fails, as with an unreachable store, while FILE exists",
    )
    ap.add_argument("--log-level", default="INFO")
    args = ap.parse_args(argv)
    if args.failure_timeout_ms <= 0 or args.interval_ms <= 0:
        ap.error("--failure-timeout-ms and --interval-ms must be positive")
    if args.preferred_leader_delay_ms < 0 or args.preferred_leader_hold_ms < 0:
        ap.error("--preferred-leader-delay-ms and --preferred-leader-hold-ms must not be negative")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s [controller] %(name)s: %(message)s",
        stream=sys.stderr,
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if args.metrics_listen:
        try:
            metrics.serve(args.metrics_listen)
        except (OSError, ValueError) as exc:
            log.error("%s", exc)
            return 1
    deadline_ms = args.check_timeout_ms or args.failure_timeout_ms
    credentials = None
    if args.tls_dir:
        m = tls.load_dir(args.tls_dir)
        credentials = grpc.ssl_channel_credentials(m.ca_pem, m.key_pem, m.cert_pem)
    checker = GrpcHealthChecker(deadline_ms, credentials=credentials)
    store: MetadataStore = open_store(args.metadata)
    if args.test_metadata_cut:
        store = CuttableStore(store, args.test_metadata_cut)
    controller = ControllerLoop(
        store,
        FailureDetector(checker, timeout_ms=args.failure_timeout_ms),
        preferred_leaders=args.preferred_leaders,
        preferred_leader_delay_ms=args.preferred_leader_delay_ms,
        preferred_leader_hold_ms=args.preferred_leader_hold_ms,
        default_unclean=args.unclean_leader_election,
    )
    log.info(
        "controller on %s: failure timeout %d ms, rounds every %d ms, checks with a %d ms deadline",
        args.metadata,
        args.failure_timeout_ms,
        args.interval_ms,
        deadline_ms,
    )
    try:
        controller.run(stop, args.interval_ms)
    finally:
        checker.close()
        store.close()
    log.info("controller stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
