"""``sluice operator``: run the Kopf operator (the same as ``kopf run -m sluice.operator.kopf_app``).

Each flag stands for one SLUICE_* variable and wins over it: the flags and
the environment are read once, together, into an
:class:`~sluice.operator.settings.OperatorSettings` (a bad value exits with an
error naming the variable). The handlers of :mod:`sluice.operator.handlers`
are registered with those settings into Kopf's default registry (where Kopf's
own login handlers are), and Kopf runs in this process: namespace-scoped, with peering (unless
``--standalone``) and a liveness endpoint for the Deployment's probe. The
process environment is not changed.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping, Sequence

from sluice.operator.settings import DEFAULT_BROKER_SELECTOR, OperatorSettings, SettingsError


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="sluice operator", description="Run the Sluice Kubernetes operator (Kopf).")
    ap.add_argument("--namespace", default=None, help="the namespace of the Sluice cluster (default: the pod's own)")
    ap.add_argument("--metadata", default=None, help="metadata store (default: kubernetes://NAMESPACE)")
    ap.add_argument(
        "--broker-selector",
        default=None,
        help=f"label selector of the broker pods ($SLUICE_BROKER_SELECTOR, else {DEFAULT_BROKER_SELECTOR})",
    )
    ap.add_argument(
        "--pod-grace-s",
        type=float,
        default=None,
        help="a broker pod NotReady this long is dead and loses its leaderships "
        "($SLUICE_FAILOVER_GRACE_SECONDS, else 10)",
    )
    ap.add_argument(
        "--broker-session-timeout-s",
        type=float,
        default=None,
        help="a broker without a SERVING answer to the operator's own health checks this long is dead, "
        "its Pod Ready or not ($SLUICE_BROKER_SESSION_TIMEOUT_S, else 9; 0: Pods only)",
    )
    ap.add_argument(
        "--brokers",
        type=int,
        default=None,
        help="the broker count the cluster is meant to have, for replicationFactor checks "
        "(default: the replicas of the StatefulSet $SLUICE_BROKER_STATEFULSET, if set)",
    )
    ap.add_argument(
        "--preferred-leader-delay-s",
        type=float,
        default=None,
        help="a broker Ready again takes its preferred leaderships back after this long (default 10)",
    )
    ap.add_argument("--reconcile-interval-s", type=float, default=None, help="drift repair period (default 30)")
    ap.add_argument("--status-interval-s", type=float, default=None, help="TransactionalId status period (default 5)")
    ap.add_argument("--liveness", default="http://0.0.0.0:8080/healthz", help="liveness endpoint ('' for none)")
    ap.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        default=None,
        help="serve the operator's Prometheus metrics (docs/metrics.md) here (default: off)",
    )
    ap.add_argument("--peering", default="sluice", help="the KopfPeering object's name (%(default)s)")
    ap.add_argument("--standalone", action="store_true", help="no peering (one replica only)")
    ap.add_argument("--log-level", default=os.environ.get("SLUICE_LOG_LEVEL", "INFO"))
    args = ap.parse_args(argv)
    for name in ("pod_grace_s", "brokers", "preferred_leader_delay_s", "broker_session_timeout_s"):
        if getattr(args, name) is not None and getattr(args, name) < 0:
            ap.error(f"--{name.replace('_', '-')} must be >= 0")
    for name in ("reconcile_interval_s", "status_interval_s"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            ap.error(f"--{name.replace('_', '-')} must be > 0")
    return args


def settings_from(args: argparse.Namespace, environ: Mapping[str, str]) -> OperatorSettings:
    """The operator's settings: each flag given wins over its SLUICE_* variable in ``environ``."""
    flags = {
        "SLUICE_NAMESPACE": args.namespace,
        "SLUICE_METADATA": args.metadata,
        "SLUICE_BROKER_SELECTOR": args.broker_selector,
        "SLUICE_FAILOVER_GRACE_SECONDS": args.pod_grace_s,
        "SLUICE_BROKER_SESSION_TIMEOUT_S": args.broker_session_timeout_s,
        "SLUICE_EXPECTED_BROKERS": args.brokers,
        "SLUICE_PREFERRED_LEADER_DELAY_S": args.preferred_leader_delay_s,
        "SLUICE_RECONCILE_INTERVAL_S": args.reconcile_interval_s,
        "SLUICE_STATUS_INTERVAL_S": args.status_interval_s,
        "SLUICE_PEERING": args.peering,
    }
    merged = dict(environ)
    merged.update({name: str(value) for name, value in flags.items() if value is not None})
    return OperatorSettings.from_environment(merged)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s [operator] %(name)s: %(message)s"
    )
    try:
        settings = settings_from(args, os.environ)
    except SettingsError as exc:
        print(f"sluice operator: {exc}", file=sys.stderr)
        return 2
    import kopf

    from sluice.operator import metrics
    from sluice.operator.handlers import register

    if args.metrics_listen:
        try:
            metrics.serve(args.metrics_listen)
        except (OSError, ValueError) as exc:
            print(f"sluice operator: {exc}", file=sys.stderr)
            return 2

    # Kopf's default registry: it also holds Kopf's own login handlers (kubeconfig, service account).
    registry = kopf.get_default_registry()
    register(registry, settings)
    kopf.run(
        registry=registry,
        namespaces=[settings.namespace],
        standalone=args.standalone,
        peering_name=None if args.standalone else settings.peering_name,
        liveness_endpoint=args.liveness or None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
