"""``--command-config FILE``: the client security settings every client command connects with.

Kafka's tools take a properties file (``--command-config``) with the client's security settings;
Sluice's commands do the same, with Kafka's key names where they exist. Sluice reads PEM files,
not Java key stores, so the locations take librdkafka's names (``ssl.ca.location``,
``ssl.certificate.location``, ``ssl.key.location``, what confluent-kafka users already write) or
kafka-python's (``ssl.cafile``, ``ssl.certfile``, ``ssl.keyfile``: what ``sluice dev up --secure``
writes to ``DATA/admin.properties``). A Java store key (``ssl.truststore.location`` ...) is a
one-line error that names the PEM key to use instead, not a silently plaintext connection.

Without ``--command-config`` a command connecting to the running dev cluster (the bootstrap
address was discovered from its state file, not given) uses the dev cluster's
``admin.properties`` when it runs ``--secure``: ``sluice dev up --secure`` followed by ``sluice
topics list`` works, as ``sluice dev up`` followed by it does. An explicit ``--bootstrap-server``
or ``$SLUICE_BOOTSTRAP_SERVERS`` never picks the dev cluster's credentials: they may name another
cluster, and the super user's certificate is not sent to one the user did not choose.

The health check that :mod:`sluice.cli.bootstrap` makes before a command starts uses the same
settings, so a secure cluster is checked over TLS with the client's own certificate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sluice.cli.exits import USAGE, CliError

if TYPE_CHECKING:  # grpc is imported when a health check needs it, not by `sluice --help`
    import grpc

# property key -> client keyword argument; both PEM spellings are accepted.
_KEYS = {
    "security.protocol": "security_protocol",
    "ssl.ca.location": "ssl_cafile",
    "ssl.cafile": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.certfile": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile",
    "ssl.keyfile": "ssl_keyfile",
    # SASL_SSL: TLS and a Kubernetes ServiceAccount token (docs/security.md)
    "sasl.mechanism": "sasl_mechanism",
    "sasl.oauthbearer.token.file": "sasl_oauthbearer_token_file",
}
# Java key stores: named so the error can say what to write instead.
_JAVA_STORES = {
    "ssl.truststore.location": "ssl.ca.location",
    "ssl.truststore.password": "ssl.ca.location",
    "ssl.truststore.type": "ssl.ca.location",
    "ssl.keystore.location": "ssl.certificate.location and ssl.key.location",
    "ssl.keystore.password": "ssl.certificate.location and ssl.key.location",
    "ssl.keystore.type": "ssl.certificate.location and ssl.key.location",
    "ssl.key.password": "an unencrypted ssl.key.location",
}
_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_SSL")


@dataclass(frozen=True)
class ClientSecurity:
    """The security keyword arguments of Producer, Consumer and Admin (their own names)."""

    security_protocol: str = "PLAINTEXT"
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    source: str = ""  # where the settings came from, for error messages
    sasl_mechanism: str | None = None
    sasl_oauthbearer_token_file: str | None = None

    @property
    def tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for the client classes (none for plaintext: the clients' default)."""
        if not self.tls:
            return {}
        out: dict[str, Any] = {
            "security_protocol": self.security_protocol,
            "ssl_cafile": self.ssl_cafile,
            "ssl_certfile": self.ssl_certfile,
            "ssl_keyfile": self.ssl_keyfile,
        }
        if self.security_protocol == "SASL_SSL":
            out["sasl_mechanism"] = self.sasl_mechanism
            out["sasl_oauthbearer_token_file"] = self.sasl_oauthbearer_token_file
        return out


PLAINTEXT = ClientSecurity()


def read_command_config(path: str) -> ClientSecurity:
    """The settings of a properties file; a one-line :class:`CliError` (usage, exit 2) for bad ones."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise CliError(f"--command-config {path}: {exc.strerror or exc}", USAGE) from None
    found: dict[str, str] = {}
    for n, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        key = key.strip()
        if sep and key in _JAVA_STORES:
            raise CliError(
                f"--command-config {path}:{n}: {key}: Sluice reads PEM files, not Java key stores; "
                f"use {_JAVA_STORES[key]}",
                USAGE,
            )
        if not sep or key not in _KEYS:
            known = ", ".join(_KEYS)
            raise CliError(f"--command-config {path}:{n}: expected one of {known} as KEY=VALUE, not {line!r}", USAGE)
        found[_KEYS[key]] = value.strip()
    protocol = found.get("security_protocol", "PLAINTEXT").upper()
    if protocol not in _PROTOCOLS:
        raise CliError(
            f"--command-config {path}: security.protocol={protocol} is not supported (use PLAINTEXT, SSL or SASL_SSL)",
            USAGE,
        )
    if protocol != "PLAINTEXT" and not found.get("ssl_cafile"):
        raise CliError(
            f"--command-config {path}: security.protocol={protocol} needs ssl.ca.location (the cluster CA)", USAGE
        )
    mechanism = found.get("sasl_mechanism")
    if mechanism is not None and mechanism.upper() != "OAUTHBEARER":
        raise CliError(
            f"--command-config {path}: sasl.mechanism={mechanism} is not supported (OAUTHBEARER: a ServiceAccount "
            "token)",
            USAGE,
        )
    if (protocol == "SASL_SSL") != bool(found.get("sasl_oauthbearer_token_file")):
        raise CliError(
            f"--command-config {path}: sasl.oauthbearer.token.file goes with security.protocol=SASL_SSL, and only",
            USAGE,
        )
    if bool(found.get("ssl_certfile")) != bool(found.get("ssl_keyfile")):
        raise CliError(f"--command-config {path}: ssl.certificate.location and ssl.key.location go together", USAGE)
    return ClientSecurity(
        security_protocol=protocol,
        ssl_cafile=found.get("ssl_cafile"),
        ssl_certfile=found.get("ssl_certfile"),
        ssl_keyfile=found.get("ssl_keyfile"),
        source=f"--command-config {path}",
        sasl_mechanism=found.get("sasl_mechanism"),
        sasl_oauthbearer_token_file=found.get("sasl_oauthbearer_token_file"),
    )


def resolve_security(explicit: str | None, dev_admin_config: str | None) -> ClientSecurity:
    """``--command-config`` if given, else the secure dev cluster's admin settings when the bootstrap
    address came from that dev cluster (``dev_admin_config``), else plaintext."""
    if explicit:
        return read_command_config(explicit)
    if dev_admin_config:
        found = read_command_config(dev_admin_config)
        return ClientSecurity(
            found.security_protocol, found.ssl_cafile, found.ssl_certfile, found.ssl_keyfile,
            source=f"the dev cluster's {dev_admin_config}",
            sasl_mechanism=found.sasl_mechanism, sasl_oauthbearer_token_file=found.sasl_oauthbearer_token_file,
        )  # fmt: skip
    return PLAINTEXT


def channel_credentials(security: ClientSecurity) -> grpc.ChannelCredentials | None:
    """gRPC channel credentials for the health check (None: plaintext)."""
    if not security.tls:
        return None
    import grpc

    def read(path: str | None, what: str) -> bytes | None:
        if path is None:
            return None
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as exc:
            raise CliError(f"{security.source}: {what} {path}: {exc.strerror or exc}", USAGE) from None

    return grpc.ssl_channel_credentials(
        read(security.ssl_cafile, "ssl.ca.location"),
        read(security.ssl_keyfile, "ssl.key.location"),
        read(security.ssl_certfile, "ssl.certificate.location"),
    )
