"""The client certificate of a SluiceUser of type ``tls``: a Secret named after the user.

What Strimzi's User Operator does for a KafkaUser of type tls. The Secret holds:

=============  ==========================================================================
``user.crt``   the user's certificate, CN = the SluiceUser's name (principal ``User:<name>``),
               signed by the clients CA
``user.key``   its private key (EC P-256, PKCS#8 PEM)
``ca.crt``     the cluster CA's trust bundle, to verify the brokers with (old and new CA
               during a cluster CA rotation)
=============  ==========================================================================

so a pod mounts one Secret and connects with ``security_protocol="SSL"``,
``ssl_cafile=ca.crt``, ``ssl_certfile=user.crt``, ``ssl_keyfile=user.key``.

The clients CA is the Secret ``SLUICE_CLIENTS_CA_SECRET`` names: the operator's own
(:mod:`sluice.operator.certificates`: ``ca.crt``, ``ca.key``, the rotation phase in annotations)
or one made elsewhere (a ``kubernetes.io/tls`` Secret: ``tls.crt``, ``tls.key``). A certificate is
(re-)issued when it is missing, not signed by the clients CA that signs now (a rotated clients CA;
during the rotation's TrustNewCa phase, before every broker trusts the new CA, a certificate of
the old one is kept: :func:`sluice.cert_rotation.client_cert_current`), within the renewal window
of its expiry (``SLUICE_CERT_RENEWAL_DAYS``), for another name, or when the Secret carries
``sluice.dev/force-renew: "true"``; ``ca.crt`` follows the cluster CA's bundle. A renewal replaces
the files in place: a pod mounting the Secret sees the new ones within about a minute, and a
client made from them after that connects with the new certificate, while the old one stays valid
until it expires.

The Secret carries the label ``sluice.dev/user=<name>`` and an owner reference to the SluiceUser,
so Kubernetes' garbage collector deletes it with the user; the operator also deletes it itself
when it sees the deletion (and sweeps Secrets of users that no longer exist), so it goes even
where no garbage collector runs. A Secret of that name which is not one of these (no label) is
never overwritten: the condition says so.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sluice import cert_rotation, tls
from sluice.metadata.kubernetes import api_status
from sluice.operator import certificates

log = logging.getLogger("sluice.operator")

USER_CERT = "user.crt"
USER_KEY = "user.key"
USER_LABEL = "sluice.dev/user"
MAX_CN_LENGTH = 64  # X.509's upper bound for a CN


class NotIssued(Exception):
    """No certificate can be issued now: ``reason`` and the message are the condition's."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Issued:
    secret: str
    renewed: bool  # a certificate was written by this call (first or renewed)
    why: str = ""


def _data(secret: Any) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}


def _read(core: Any, name: str, namespace: str) -> Any:
    try:
        return core.read_namespaced_secret(name, namespace)
    except Exception as exc:
        if api_status(exc) == 404:
            return None
        raise


def read_clients_ca(core: Any, name: str, namespace: str) -> cert_rotation.ClusterCa:
    """The clients CA from its Secret (the operator's layout, or a ``kubernetes.io/tls`` one); NotIssued."""
    try:
        secret = _read(core, name, namespace)
    except Exception as exc:
        raise NotIssued("ClientsCAUnreadable", f"Secret {name}: {exc}") from None
    if secret is None:
        raise NotIssued("ClientsCAMissing", f"the clients CA Secret {name} does not exist (yet)")
    data = _data(secret)
    if data.get(tls.CA_FILE) and data.get(certificates.CA_KEY):
        return certificates.ca_of(secret)
    if data.get(tls.CERT_FILE) and data.get(tls.KEY_FILE):
        return cert_rotation.ClusterCa(tls.KeyPair(data[tls.CERT_FILE], data[tls.KEY_FILE]))
    raise NotIssued("ClientsCAUnreadable", f"Secret {name} has neither ca.crt and ca.key nor tls.crt and tls.key")


def cluster_ca_bundle(core: Any, namespace: str, secret_names: list[str], ca_file: str | None) -> bytes:
    """The cluster CA's trust bundle: ``ca.crt`` of the first of ``secret_names`` that has it, else the
    operator's own mounted file; b"" when there is none (brokers in plaintext)."""
    for name in secret_names:
        secret = _read(core, name, namespace)
        bundle = _data(secret).get(tls.CA_FILE) if secret is not None else None
        if bundle:
            return bundle
    if ca_file:
        try:
            with open(ca_file, "rb") as f:
                return f.read()
        except OSError:
            return b""
    return b""


def _why_renew(
    data: Mapping[str, bytes], annotations: Mapping[str, str], name: str, ca: cert_rotation.ClusterCa, policy: Any
) -> str:
    """Why the user's certificate must be issued again ("" if it may stay)."""
    if annotations.get(certificates.ANNOTATION_FORCE_RENEW, "").lower() == "true":
        return "forced"
    try:
        pair = tls.KeyPair(data[USER_CERT], data[USER_KEY])
        if pair.common_name != name or not tls.key_matches(pair.cert_pem, pair.key_pem):
            return "it is not this user's"
    except Exception:
        return "there is none"
    if not cert_rotation.client_cert_current(pair.cert_pem, ca, policy):
        return "it is due (expiry, or a new clients CA)"
    return ""


def ensure(
    core: Any,
    namespace: str,
    user: Mapping[str, Any],
    ca: cert_rotation.ClusterCa,
    bundle: bytes,
    policy: cert_rotation.Policy,
) -> Issued:
    """Make the user's Secret hold a current certificate and ``bundle`` (see the module docstring)."""
    from kubernetes import client

    meta = user["metadata"]
    name = meta["name"]
    existing = _read(core, name, namespace)
    if existing is not None and (existing.metadata.labels or {}).get(USER_LABEL) != name:
        mine = f"label {USER_LABEL}={name}"
        raise NotIssued("SecretConflict", f"a Secret {name} exists that is not this user's (no {mine}): not touched")
    data = _data(existing) if existing is not None else {}
    annotations = dict(existing.metadata.annotations or {}) if existing is not None else {}
    why = _why_renew(data, annotations, name, ca, policy)
    if existing is not None and not why and data.get(tls.CA_FILE, b"") == bundle and existing.type == "Opaque":
        return Issued(name, renewed=False)
    if why:
        pair = tls.issue(ca.current, name, validity_days=policy.validity_days)
        data = {USER_CERT: pair.cert_pem, USER_KEY: pair.key_pem}
    data = {USER_CERT: data[USER_CERT], USER_KEY: data[USER_KEY], **({tls.CA_FILE: bundle} if bundle else {})}
    annotations.pop(certificates.ANNOTATION_FORCE_RENEW, None)
    secret_meta = client.V1ObjectMeta(
        name=name,
        namespace=namespace,
        labels={"app.kubernetes.io/part-of": "sluice", USER_LABEL: name},
        annotations=annotations or None,
        owner_references=[
            client.V1OwnerReference(
                api_version=f"{user.get('apiVersion') or 'sluice.dev/v1alpha1'}",
                kind="SluiceUser",
                name=name,
                uid=meta["uid"],
                block_owner_deletion=False,
            )
        ],
        resource_version=existing.metadata.resource_version if existing is not None else None,
    )
    body = client.V1Secret(
        metadata=secret_meta,
        type="Opaque",
        data={k: base64.b64encode(v).decode() for k, v in data.items()},
    )
    if existing is None:
        core.create_namespaced_secret(namespace, body)
    elif existing.type != "Opaque":  # the type is immutable: an older layout (kubernetes.io/tls) is replaced
        core.delete_namespaced_secret(name, namespace)
        secret_meta.resource_version = None
        core.create_namespaced_secret(namespace, body)
    else:
        core.replace_namespaced_secret(name, namespace, body)  # a compare-and-set on resourceVersion
    if why:
        log.info("SluiceUser %s: client certificate issued into Secret %s (%s)", name, name, why)
    return Issued(name, renewed=bool(why), why=why)


def delete(core: Any, namespace: str, name: str, uid: str | None) -> bool:
    """Delete the Secret of user ``name`` (only if it is one of ours, of that uid when given)."""
    secret = _read(core, name, namespace)
    if secret is None or (secret.metadata.labels or {}).get(USER_LABEL) != name:
        return False
    owners = {o.uid for o in secret.metadata.owner_references or [] if o.kind == "SluiceUser"}
    if uid and owners and uid not in owners:
        return False  # a newer SluiceUser of the same name owns it
    try:
        core.delete_namespaced_secret(name, namespace)
    except Exception as exc:
        if api_status(exc) != 404:
            raise
        return False
    return True


def sweep(core: Any, namespace: str, list_live: Callable[[], Mapping[str, str]]) -> int:
    """Delete user Secrets whose SluiceUser no longer exists (``list_live()``: name -> uid); how many.

    The Secrets are listed before the users, so a user created in between is never taken for gone.
    """
    found = core.list_namespaced_secret(namespace, label_selector=USER_LABEL)
    live = list_live()
    deleted = 0
    for secret in found.items:
        name = secret.metadata.name
        owners = {o.uid for o in secret.metadata.owner_references or [] if o.kind == "SluiceUser"}
        if name in live and (not owners or live[name] in owners):
            continue
        if delete(core, namespace, name, None):
            log.info("deleted Secret %s of a SluiceUser that no longer exists", name)
            deleted += 1
    return deleted
