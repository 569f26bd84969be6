"""Where the client commands connect, and the check that something answers there.

In order: ``--bootstrap-server``, the environment variable ``SLUICE_BOOTSTRAP_SERVERS``, the
running dev cluster (``sluice dev up`` records its address in its state file), then
``127.0.0.1:9092`` (Kafka's port, which is also where ``sluice dev up`` puts broker 0).

Before a command talks to a cluster, :func:`require_cluster` checks that one of its brokers
answers the gRPC health check: "nothing is running" is then a one-line error that says how to
start a cluster, not a client timeout half a minute later.

:func:`connection` adds the client security settings (:mod:`sluice.cli.security`): the
command's ``--command-config``, else the secure dev cluster's ``admin.properties`` when the
address came from that dev cluster; the health check then speaks TLS with them.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any

from sluice.cli.exits import USAGE, CliError
from sluice.cli.security import ClientSecurity, channel_credentials, resolve_security

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
ENV_BOOTSTRAP = "SLUICE_BOOTSTRAP_SERVERS"


@dataclass(frozen=True)
class Connection:
    """Where a command connects and with which security settings."""

    servers: str
    security: ClientSecurity

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for Producer, Consumer and Admin."""
        return {"bootstrap_servers": self.servers, **self.security.kwargs()}


def resolve_bootstrap(explicit: str | None) -> tuple[str, str]:
    """(bootstrap servers, where they came from), in the order the module docstring gives."""
    servers, source, _admin_config = _resolve(explicit)
    return servers, source


def _resolve(explicit: str | None) -> tuple[str, str, str | None]:
    """(servers, source, the secure dev cluster's admin.properties when the servers are its)."""
    if explicit:
        return explicit, "--bootstrap-server", None
    env = os.environ.get(ENV_BOOTSTRAP, "").strip()
    if env:
        return env, f"${ENV_BOOTSTRAP}", None
    from sluice.cli.engines import dev_cluster

    state = dev_cluster.running_state(dev_cluster.resolve_data_dir(None))
    if state is not None and state.bootstrap_servers:
        admin_config = state.admin_config if state.secure and state.admin_config else None
        return state.bootstrap_servers, f"the dev cluster in {state.data_dir}", admin_config
    return DEFAULT_BOOTSTRAP, "the default", None


def require_cluster(servers: str, source: str, security: ClientSecurity | None = None) -> None:
    """Fail in one line unless some broker of ``servers`` answers its health check."""
    from sluice.testing import check_health

    addresses = [a.strip() for a in servers.split(",") if a.strip()]
    if not addresses:
        raise CliError("empty --bootstrap-server", USAGE)
    credentials = channel_credentials(security) if security is not None else None
    statuses = {a: check_health(a, timeout=2.0, credentials=credentials) for a in addresses}
    if any(s == "SERVING" for s in statuses.values()):
        return
    from sluice.client._network.probe import Listener, probe

    kafka = [a for a, s in statuses.items() if s == "UNREACHABLE" and probe(a, 1.0)[0] == Listener.KAFKA]
    if kafka:  # the likeliest mistake: a Kafka port (the dev cluster's 19092) given to the sluice CLI
        from sluice.cli.engines import dev_cluster

        dev = dev_cluster.running_state(dev_cluster.resolve_data_dir(None))
        if dev is not None and set(kafka) & set(dev.kafka_bootstrap_servers.split(",")):
            use = f"the dev cluster's is {dev.bootstrap_servers}"
        else:
            use = "`sluice dev up` prints both: 127.0.0.1:9092 for Sluice clients, 127.0.0.1:19092 for Kafka clients"
        raise CliError(
            f"{', '.join(kafka)} speaks Kafka's protocol ({source}): the sluice CLI needs a Sluice broker's gRPC "
            f"address ({use}; `sluice dev status` lists both)."
        )
    detail = ", ".join(f"{a} {s.lower()}" for a, s in statuses.items())
    over = f" over TLS ({security.source})" if security is not None and security.tls else ""
    hint = (
        "; a secure cluster needs --command-config FILE (security.protocol=SSL, ssl.*)"
        if security is None or not security.tls
        else ""
    )
    raise CliError(
        f"no Sluice broker is ready at {servers}{over} ({source}: {detail}). "
        f"Start a local cluster with `sluice dev up`, or pass --bootstrap-server HOST:PORT{hint}."
    )


def connection(args: argparse.Namespace) -> Connection:
    """Where a client command connects and how (``--bootstrap-server``, ``--command-config``), checked."""
    servers, source, dev_admin_config = _resolve(getattr(args, "bootstrap_server", None))
    security = resolve_security(getattr(args, "command_config", None), dev_admin_config)
    require_cluster(servers, source, security)
    return Connection(servers, security)
