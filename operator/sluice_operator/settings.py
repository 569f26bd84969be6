"""Every setting of the operator, in one typed place, read once at start-up.

The operator is configured through environment variables (what the Helm
chart's Deployment sets) and ``sluice operator``'s flags, which win over the
environment. Both end up here: :meth:`OperatorSettings.from_environment`
reads a mapping of ``SLUICE_*`` variables once, checks every value and
returns a frozen :class:`OperatorSettings`. Nothing else in the operator
reads the environment: the handlers get the settings through Kopf's ``memo``
(:mod:`sluice.operator.handlers.lifecycle` puts them there at start-up), and
the timers' intervals are taken from them when the handlers are registered
(:func:`sluice.operator.handlers.register`).

Why not module-level globals read at import, as before: importing a module
then depended on the environment of whoever imported it first (tests, the
``sluice operator`` entry point that had to set variables before importing),
and a bad value surfaced as a bare ``ValueError: could not convert string to
float`` somewhere in Kopf's start-up. Here a bad value is a
:class:`SettingsError` at start that names the variable.

==================================  ====================================================  =========
variable                            meaning                                               default
==================================  ====================================================  =========
SLUICE_NAMESPACE (POD_NAMESPACE)    the namespace of the Sluice cluster                   the pod's
SLUICE_METADATA                     the metadata store                                    kubernetes://NAMESPACE
SLUICE_KUBECONFIG                   kubeconfig for the API server (none in a pod)         in-cluster
SLUICE_BROKER_SELECTOR              label selector of the broker Pods                     see below
SLUICE_FAILOVER_GRACE_SECONDS       a broker Pod NotReady this long is dead               10
SLUICE_BROKER_SESSION_TIMEOUT_S     a broker without a SERVING health check from the      9
                                    operator this long is dead, Ready or not (0: off)
SLUICE_BROKER_HEALTH_PORT           the brokers' plaintext health port for those checks   the gRPC port
                                    (TLS brokers: without it, no checks)                  (plaintext)
SLUICE_EXPECTED_BROKERS             broker count for replicationFactor checks (0: none)   0
SLUICE_BROKER_STATEFULSET           the broker StatefulSet (its replicas: the count)      none
SLUICE_PREFERRED_LEADER_DELAY_S     a Ready broker takes its leaderships back after this  10
SLUICE_PREFERRED_LEADER_HOLD_S      a topic's leadership moves wait at most this long for  30
                                    its catching-up preferred replicas (0: no waiting)
SLUICE_RECONCILE_INTERVAL_S         drift repair period of Topics and Coordinators        30
SLUICE_STATUS_INTERVAL_S            TransactionalId status period                         5
SLUICE_PEERING                      the KopfPeering object's name                         sluice
SLUICE_AUTO_REBALANCE_ON_SCALE_UP   true: a broker that joins empty gets an approved      false
                                    add-brokers SluiceRebalance (handlers.rebalance)
SLUICE_PEERING_PRIORITY             this replica's peering priority                       random
SLUICE_BROKER_CA_FILE               the cluster CA: TLS to the brokers' client listener   plaintext
SLUICE_BROKER_TOKEN_FILE            a ServiceAccount token for a token listener           none
SLUICE_CLIENTS_CA_SECRET            Secret of the clients CA (SluiceUser tls certificates) none
SLUICE_CLIENTS_CA_CERT_SECRET       the operator owns the clients CA (with the above and    none
                                    SLUICE_BROKER_CERTS_SECRET): the brokers' --clients-ca
SLUICE_OPERATOR_CLIENT_SECRET       the operator's own client certificate, issued there     none
SLUICE_BROKER_CERT_FILE, _KEY_FILE  that certificate, mounted: TLS to an mtls listener      none
HOSTNAME                            this replica's identity (controller Lease holder)     host name
SLUICE_BROKER_CERTS_SECRET          the operator owns the certificates: the brokers'      none (off)
                                    Secret (sluice.operator.certificates)
SLUICE_CA_SECRET                    the cluster CA's Secret (with its key)                sluice-cluster-ca
SLUICE_CA_CERT_SECRET               the trust bundle for clients ('' for none)            none
SLUICE_CERT_VALIDITY_DAYS           broker certificates' validity                         365
SLUICE_CERT_RENEWAL_DAYS            renewed this many days before they expire             30
SLUICE_CA_VALIDITY_DAYS             the cluster CA's validity                             1825
SLUICE_CA_RENEWAL_DAYS              the CA rotated this many days before it expires       30
SLUICE_CERT_INTERVAL_S              how often the certificates are checked                30
==================================  ====================================================  =========

Each replica takes a random peering priority unless one is set, because Kopf
freezes every operator when two share the highest one.

The operator is a client of the brokers (Topics, TransactionalIds): with
``SLUICE_BROKER_CA_FILE`` it connects over TLS, and with ``SLUICE_BROKER_TOKEN_FILE`` too it
sends that ServiceAccount token (``SASL_SSL``), re-read as the kubelet rotates it. The chart
gives it a projected token for the brokers' audience and makes its principal a super user.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from sluice import cert_rotation
from sluice.metadata.kubernetes import KubernetesStoreError, parse_url

__all__ = ["DEFAULT_BROKER_SELECTOR", "OperatorSettings", "SettingsError"]

DEFAULT_BROKER_SELECTOR = "app.kubernetes.io/name=sluice,app.kubernetes.io/component=broker"


class SettingsError(ValueError):
    """A setting has a value the operator cannot use; the message names the variable."""


@dataclass(frozen=True)
class OperatorSettings:
    """The operator's settings (see the module docstring for each one's variable and default)."""

    namespace: str
    metadata_url: str
    kubeconfig: str | None = None
    broker_selector: str = DEFAULT_BROKER_SELECTOR
    failover_grace_s: float = 10.0
    expected_brokers: int = 0
    broker_statefulset: str | None = None
    preferred_leader_delay_s: float = 10.0
    preferred_leader_hold_s: float = 30.0
    reconcile_interval_s: float = 30.0
    status_interval_s: float = 5.0
    peering_name: str = "sluice"
    peering_priority: int | None = None
    identity: str | None = None
    broker_certs_secret: str | None = None
    ca_secret: str = "sluice-cluster-ca"
    ca_cert_secret: str | None = None
    cert_policy: cert_rotation.Policy = field(default_factory=cert_rotation.Policy)
    cert_interval_s: float = 30.0
    broker_ca_file: str | None = None
    broker_token_file: str | None = None
    clients_ca_secret: str | None = None
    clients_ca_cert_secret: str | None = None
    operator_client_secret: str | None = None
    broker_cert_file: str | None = None
    broker_key_file: str | None = None
    auto_rebalance_on_scale_up: bool = False
    broker_session_timeout_s: float = 9.0
    broker_health_port: int | None = None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> OperatorSettings:
        """The settings from ``environ`` (default: this process's environment); SettingsError on a bad value."""
        env = os.environ if environ is None else environ
        namespace = _text(env, "SLUICE_NAMESPACE") or _text(env, "POD_NAMESPACE")
        if namespace is None:
            try:
                namespace, _ = parse_url("kubernetes://")
            except KubernetesStoreError as exc:
                raise SettingsError(f"SLUICE_NAMESPACE is not set and this is not a pod: {exc}") from None
        return cls(
            namespace=namespace,
            metadata_url=_text(env, "SLUICE_METADATA") or f"kubernetes://{namespace}",
            kubeconfig=_text(env, "SLUICE_KUBECONFIG"),
            broker_selector=_text(env, "SLUICE_BROKER_SELECTOR") or DEFAULT_BROKER_SELECTOR,
            failover_grace_s=_number(env, "SLUICE_FAILOVER_GRACE_SECONDS", 10.0, minimum=0.0),
            expected_brokers=_integer(env, "SLUICE_EXPECTED_BROKERS", 0, minimum=0),
            broker_statefulset=_text(env, "SLUICE_BROKER_STATEFULSET"),
            preferred_leader_delay_s=_number(env, "SLUICE_PREFERRED_LEADER_DELAY_S", 10.0, minimum=0.0),
            preferred_leader_hold_s=_number(env, "SLUICE_PREFERRED_LEADER_HOLD_S", 30.0, minimum=0.0),
            reconcile_interval_s=_number(env, "SLUICE_RECONCILE_INTERVAL_S", 30.0, positive=True),
            status_interval_s=_number(env, "SLUICE_STATUS_INTERVAL_S", 5.0, positive=True),
            peering_name=_text(env, "SLUICE_PEERING") or "sluice",
            peering_priority=_optional_integer(env, "SLUICE_PEERING_PRIORITY"),
            identity=_text(env, "HOSTNAME"),
            broker_certs_secret=_text(env, "SLUICE_BROKER_CERTS_SECRET"),
            ca_secret=_text(env, "SLUICE_CA_SECRET") or "sluice-cluster-ca",
            ca_cert_secret=_text(env, "SLUICE_CA_CERT_SECRET"),
            cert_policy=_cert_policy(env),
            cert_interval_s=_number(env, "SLUICE_CERT_INTERVAL_S", 30.0, positive=True),
            broker_ca_file=_text(env, "SLUICE_BROKER_CA_FILE"),
            broker_token_file=_text(env, "SLUICE_BROKER_TOKEN_FILE"),
            clients_ca_secret=_text(env, "SLUICE_CLIENTS_CA_SECRET"),
            clients_ca_cert_secret=_text(env, "SLUICE_CLIENTS_CA_CERT_SECRET"),
            operator_client_secret=_text(env, "SLUICE_OPERATOR_CLIENT_SECRET"),
            broker_cert_file=_text(env, "SLUICE_BROKER_CERT_FILE"),
            broker_key_file=_text(env, "SLUICE_BROKER_KEY_FILE"),
            auto_rebalance_on_scale_up=_boolean(env, "SLUICE_AUTO_REBALANCE_ON_SCALE_UP"),
            broker_session_timeout_s=_number(env, "SLUICE_BROKER_SESSION_TIMEOUT_S", 9.0, minimum=0.0),
            broker_health_port=_port(env, "SLUICE_BROKER_HEALTH_PORT"),
        )

    def health_checks(self) -> tuple[float, int | None]:
        """(session timeout s, port) of the controller's own health checks of the brokers; (0, None): off.

        The checks are plaintext: on ``SLUICE_BROKER_HEALTH_PORT`` (the brokers' plaintext health
        listener, which TLS brokers serve for the kubelet's probes), else on the brokers' registered
        address when they are plaintext. TLS brokers without a health port are judged by their Pods."""
        if self.broker_session_timeout_s <= 0 or (self.broker_health_port is None and self.broker_ca_file):
            return 0.0, None
        return self.broker_session_timeout_s, self.broker_health_port

    def broker_security(self) -> dict[str, str]:
        """The Admin client's security keyword arguments (plaintext without a CA file)."""
        if self.broker_token_file and not self.broker_ca_file:
            raise SettingsError("SLUICE_BROKER_TOKEN_FILE needs SLUICE_BROKER_CA_FILE: tokens are sent over TLS only")
        if bool(self.broker_cert_file) != bool(self.broker_key_file):
            raise SettingsError("SLUICE_BROKER_CERT_FILE and SLUICE_BROKER_KEY_FILE go together")
        if self.broker_cert_file and (self.broker_token_file or not self.broker_ca_file):
            raise SettingsError("SLUICE_BROKER_CERT_FILE needs SLUICE_BROKER_CA_FILE, and no SLUICE_BROKER_TOKEN_FILE")
        if not self.broker_ca_file:
            return {}
        if self.broker_cert_file and self.broker_key_file:
            return {
                "security_protocol": "SSL",
                "ssl_cafile": self.broker_ca_file,
                "ssl_certfile": self.broker_cert_file,
                "ssl_keyfile": self.broker_key_file,
            }
        if not self.broker_token_file:
            return {"security_protocol": "SSL", "ssl_cafile": self.broker_ca_file}
        return {
            "security_protocol": "SASL_SSL",
            "ssl_cafile": self.broker_ca_file,
            "sasl_oauthbearer_token_file": self.broker_token_file,
        }


def _cert_policy(env: Mapping[str, str]) -> cert_rotation.Policy:
    policy = cert_rotation.Policy(
        validity_days=_number(env, "SLUICE_CERT_VALIDITY_DAYS", 365.0, positive=True),
        renewal_days=_number(env, "SLUICE_CERT_RENEWAL_DAYS", 30.0, positive=True),
        ca_validity_days=_number(env, "SLUICE_CA_VALIDITY_DAYS", 1825.0, positive=True),
        ca_renewal_days=_number(env, "SLUICE_CA_RENEWAL_DAYS", 30.0, positive=True),
    )
    try:
        policy.check()
    except ValueError as exc:
        raise SettingsError(f"SLUICE_CERT_*/SLUICE_CA_* days: {exc}") from None
    return policy


def _text(env: Mapping[str, str], name: str) -> str | None:
    """The variable's value, None when it is unset or empty (an empty value means the default)."""
    value = env.get(name, "").strip()
    return value or None


def _boolean(env: Mapping[str, str], name: str) -> bool:
    raw = (_text(env, name) or "false").lower()
    if raw not in ("true", "false"):
        raise SettingsError(f"{name}={raw!r} is not true or false")
    return raw == "true"


def _number(
    env: Mapping[str, str], name: str, default: float, *, minimum: float = 0.0, positive: bool = False
) -> float:
    raw = _text(env, name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number (seconds)") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise SettingsError(f"{name}={raw!r} is not a finite number")
    if positive and value <= 0:
        raise SettingsError(f"{name}={raw!r} must be greater than 0")
    if value < minimum:
        raise SettingsError(f"{name}={raw!r} must be at least {minimum:g}")
    return value


def _integer(env: Mapping[str, str], name: str, default: int, *, minimum: int) -> int:
    value = _optional_integer(env, name)
    if value is None:
        return default
    if value < minimum:
        raise SettingsError(f"{name}={value} must be at least {minimum}")
    return value


def _port(env: Mapping[str, str], name: str) -> int | None:
    value = _optional_integer(env, name)
    if value is not None and not 1 <= value <= 65535:
        raise SettingsError(f"{name}={value} is not a port (1 to 65535)")
    return value


def _optional_integer(env: Mapping[str, str], name: str) -> int | None:
    raw = _text(env, name)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a whole number") from None
