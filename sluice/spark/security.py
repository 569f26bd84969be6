"""The TLS options of the "sluice" source and sink: the settings the client takes.

Spark's Kafka connector passes ``kafka.``-prefixed options to the Kafka client
(``kafka.security.protocol``, ``kafka.ssl.truststore.location`` ...). Sluice's source and sink
take the same ``security.protocol`` (with or without the ``kafka.`` prefix) and the certificate
locations as PEM files, with librdkafka's names (``ssl.ca.location``,
``ssl.certificate.location``, ``ssl.key.location``; ``ssl.cafile``/``ssl.certfile``/``ssl.keyfile``
too, as :mod:`sluice.cli.security` accepts): they become the client's ``security_protocol``,
``ssl_cafile``, ``ssl_certfile`` and ``ssl_keyfile``. A Java key store option is an error that
names the PEM option to use instead, never a silently plaintext job.

The files are read on the driver when the options are parsed (a missing or unreadable file is
an option error before any data is read) and again by each executor's clients: like Spark's
Kafka connector, the paths must exist on every executor (a mounted Secret on Kubernetes).

``security.protocol`` ``SASL_SSL`` with ``sasl.oauthbearer.token.file`` (and optionally
``sasl.mechanism`` ``OAUTHBEARER``) authenticates with a Kubernetes ServiceAccount token instead
of a client certificate: on Kubernetes, the executors' own projected token (docs/security.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sluice.client._network.security import ClientSecurity

# option (lower case, without "kafka.") -> the client's keyword argument
_OPTIONS = {
    "security.protocol": "security_protocol",
    "ssl.ca.location": "ssl_cafile",
    "ssl.cafile": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.certfile": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile",
    "ssl.keyfile": "ssl_keyfile",
    # SASL_SSL with a Kubernetes ServiceAccount token (docs/security.md): Kafka's names
    "sasl.mechanism": "sasl_mechanism",
    "sasl.oauthbearer.token.file": "sasl_oauthbearer_token_file",
}
_JAVA_STORES = {
    "ssl.truststore.location": "ssl.ca.location",
    "ssl.truststore.password": "ssl.ca.location",
    "ssl.truststore.type": "ssl.ca.location",
    "ssl.keystore.location": "ssl.certificate.location and ssl.key.location",
    "ssl.keystore.password": "ssl.certificate.location and ssl.key.location",
    "ssl.keystore.type": "ssl.certificate.location and ssl.key.location",
    "ssl.key.password": "an unencrypted ssl.key.location",
}
# The documented spellings, for the sources' lists of known options.
SECURITY_OPTIONS = (
    "security.protocol", "ssl.ca.location", "ssl.certificate.location", "ssl.key.location",
    "sasl.mechanism", "sasl.oauthbearer.token.file",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class SecurityOptions:
    """The client security settings of a job (plaintext by default)."""

    security_protocol: str = "PLAINTEXT"
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    sasl_mechanism: str | None = None
    sasl_oauthbearer_token_file: str | None = None

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for Producer, Consumer and Admin."""
        if self.security_protocol == "PLAINTEXT":
            return {}
        kwargs: dict[str, Any] = {
            "security_protocol": self.security_protocol,
            "ssl_cafile": self.ssl_cafile,
            "ssl_certfile": self.ssl_certfile,
            "ssl_keyfile": self.ssl_keyfile,
        }
        if self.security_protocol == "SASL_SSL":
            kwargs["sasl_mechanism"] = self.sasl_mechanism
            kwargs["sasl_oauthbearer_token_file"] = self.sasl_oauthbearer_token_file
        return kwargs


PLAINTEXT = SecurityOptions()


def is_security_option(key: str) -> bool:
    """Whether ``key`` (lower case, any ``kafka.`` prefix) is one this module reads."""
    k = key.removeprefix("kafka.")
    return k in _OPTIONS or k in _JAVA_STORES


def parse_security_options(options: Mapping[str, str], error: Callable[[str], Exception]) -> SecurityOptions:
    """The settings among ``options`` (lower-cased keys); ``error(message)`` is raised for a bad one."""
    found: dict[str, str] = {}
    for key, value in options.items():
        k = key.removeprefix("kafka.")
        if k in _JAVA_STORES:
            raise error(f"option {key!r}: Sluice reads PEM files, not Java key stores; use {_JAVA_STORES[k]}")
        if k in _OPTIONS:
            found[_OPTIONS[k]] = str(value).strip()
    protocol = found.pop("security_protocol", "PLAINTEXT").upper()
    if protocol not in ("PLAINTEXT", "SSL", "SASL_SSL"):
        raise error(f"option 'security.protocol' must be PLAINTEXT, SSL or SASL_SSL, not {protocol!r}")
    if protocol != "PLAINTEXT" and not found.get("ssl_cafile"):
        raise error(f"option 'security.protocol' {protocol} needs 'ssl.ca.location' (the cluster CA, a PEM file)")
    sasl = [k for k in ("sasl_mechanism", "sasl_oauthbearer_token_file") if found.get(k)]
    if sasl and protocol != "SASL_SSL":
        raise error(f"option(s) {', '.join(k.replace('_', '.') for k in sasl)} need 'security.protocol' SASL_SSL")
    settings = SecurityOptions(
        protocol, found.get("ssl_cafile"), found.get("ssl_certfile"), found.get("ssl_keyfile"),
        found.get("sasl_mechanism"), found.get("sasl_oauthbearer_token_file"),
    )  # fmt: skip
    try:  # the client's own checks, and the files read once on the driver
        ClientSecurity.build(**settings.client_kwargs())
    except ValueError as exc:
        raise error(f"TLS options: {exc}") from None
    return settings


def client_security(settings: SecurityOptions) -> ClientSecurity:
    """The client's transport security, for the readers' own :class:`~sluice.client._network.Cluster`."""
    return ClientSecurity.build(**settings.client_kwargs())
