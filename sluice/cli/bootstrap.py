"""Where the client commands connect, and the check that something answers there.

In order: ``--bootstrap-server``, the environment variable ``SLUICE_BOOTSTRAP_SERVERS``, the
running dev cluster (``sluice dev up`` records its address in its state file), then
``127.0.0.1:9092`` (Kafka's port, which is also where ``sluice dev up`` puts broker 0).

Before a command talks to a cluster, :func:`require_cluster` checks that one of its brokers
answers the gRPC health check: "nothing is running" is then a one-line error that says how to
start a cluster, not a client timeout half a minute later.
"""

from __future__ import annotations

import argparse
import os

from sluice.cli.exits import USAGE, CliError

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
ENV_BOOTSTRAP = "SLUICE_BOOTSTRAP_SERVERS"


def resolve_bootstrap(explicit: str | None) -> tuple[str, str]:
    """(bootstrap servers, where they came from), in the order the module docstring gives."""
    if explicit:
        return explicit, "--bootstrap-server"
    env = os.environ.get(ENV_BOOTSTRAP, "").strip()
    if env:
        return env, f"${ENV_BOOTSTRAP}"
    from sluice.cli.engines import dev_cluster

    state = dev_cluster.running_state(dev_cluster.resolve_data_dir(None))
    if state is not None and state.bootstrap_servers:
        return state.bootstrap_servers, f"the dev cluster in {state.data_dir}"
    return DEFAULT_BOOTSTRAP, "the default"


def require_cluster(servers: str, source: str) -> None:
    """Fail in one line unless some broker of ``servers`` answers its health check."""
    from sluice.testing import check_health

    addresses = [a.strip() for a in servers.split(",") if a.strip()]
    if not addresses:
        raise CliError("empty --bootstrap-server", USAGE)
    statuses = {a: check_health(a, timeout=2.0) for a in addresses}
    if any(s == "SERVING" for s in statuses.values()):
        return
    detail = ", ".join(f"{a} {s.lower()}" for a, s in statuses.items())
    raise CliError(
        f"no Sluice broker is ready at {servers} ({source}: {detail}). "
        "Start a local cluster with `sluice dev up`, or pass --bootstrap-server HOST:PORT."
    )


def bootstrap_servers(args: argparse.Namespace) -> str:
    """The servers a client command connects to (its ``--bootstrap-server``, else discovered), checked."""
    servers, source = resolve_bootstrap(getattr(args, "bootstrap_server", None))
    require_cluster(servers, source)
    return servers
