"""``sluice operator``: run the Kopf operator (the same as ``kopf run -m sluice.operator.kopf_app``).

Flags become the SLUICE_* environment settings :mod:`sluice.operator.kopf_app`
reads (set before it is imported, since its timers' intervals are fixed at
import), then Kopf runs in this process: namespace-scoped, with peering
(unless ``--standalone``) and a liveness endpoint for the Deployment's probe.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from sluice.operator.k8s_controller import DEFAULT_BROKER_SELECTOR


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="sluice operator", description="Run the Sluice Kubernetes operator (Kopf).")
    ap.add_argument("--namespace", default=None, help="the namespace of the Sluice cluster (default: the pod's own)")
    ap.add_argument("--metadata", default=None, help="metadata store (default: kubernetes://NAMESPACE)")
    ap.add_argument(
        "--broker-selector", default=DEFAULT_BROKER_SELECTOR, help="label selector of the broker pods (%(default)s)"
    )
    ap.add_argument(
        "--pod-grace-s",
        type=float,
        default=10.0,
        help="a broker pod NotReady this long is dead and loses its leaderships (default %(default)s)",
    )
    ap.add_argument(
        "--brokers",
        type=int,
        default=0,
        help="the broker count the cluster is meant to have (the StatefulSet's replicas), for replicationFactor checks",
    )
    ap.add_argument("--reconcile-interval-s", type=float, default=30.0, help="drift repair period (%(default)s)")
    ap.add_argument("--status-interval-s", type=float, default=5.0, help="TransactionalId status period (%(default)s)")
    ap.add_argument("--liveness", default="http://0.0.0.0:8080/healthz", help="liveness endpoint ('' for none)")
    ap.add_argument("--peering", default="sluice", help="the KopfPeering object's name (%(default)s)")
    ap.add_argument("--standalone", action="store_true", help="no peering (one replica only)")
    ap.add_argument("--log-level", default="INFO")
    args = ap.parse_args(argv)
    if args.pod_grace_s < 0 or args.brokers < 0 or args.reconcile_interval_s <= 0 or args.status_interval_s <= 0:
        ap.error("--pod-grace-s and --brokers must be >= 0, the intervals > 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s [operator] %(name)s: %(message)s"
    )
    settings = {
        "SLUICE_NAMESPACE": args.namespace,
        "SLUICE_METADATA": args.metadata,
        "SLUICE_BROKER_SELECTOR": args.broker_selector,
        "SLUICE_POD_GRACE_S": str(args.pod_grace_s),
        "SLUICE_EXPECTED_BROKERS": str(args.brokers),
        "SLUICE_RECONCILE_INTERVAL_S": str(args.reconcile_interval_s),
        "SLUICE_STATUS_INTERVAL_S": str(args.status_interval_s),
        "SLUICE_PEERING": args.peering,
    }
    for key, value in settings.items():
        if value is not None:
            os.environ[key] = value
    import kopf

    from sluice.metadata.kubernetes import parse_url

    namespace = args.namespace or parse_url("kubernetes://")[0]
    importlib.import_module("sluice.operator.kopf_app")
    kopf.run(
        namespaces=[namespace],
        standalone=args.standalone,
        peering_name=None if args.standalone else args.peering,
        liveness_endpoint=args.liveness or None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
