"""SluiceUser handlers: one principal's ACLs into the brokers' ACL store, and its client certificate.

A SluiceUser (manifests/crds/sluiceusers.sluice.dev.yaml) names a principal
(``spec.authentication``: a ServiceAccount, ``ServiceAccount:<ns>:<name>``, or a client
certificate, ``User:<resource name>``) and its ACLs (``spec.authorization.acls``). The operator
writes exactly those ACLs into the ``acls/`` documents the brokers follow, owning them
(:mod:`sluice.operator.user_acls`): a spec change is a diff, ACLs made by hand are left alone.

No finalizer: deleting a SluiceUser must never wait for the operator (a ``helm uninstall`` that
removes the operator with the users would hang, as it did with Coordinators, docs/kubernetes.md).
Its ACLs are deleted when the operator sees the deletion (a watch event, :func:`user_event`), and
any the operator missed while it was not running are swept at start-up and on every timer tick
(:func:`sweep_orphans`). The ACLs of a deleted user thus outlive it at most as long as the
operator is away, which a finalizer would not change either: only the object would stay.

With ``type: tls`` the operator issues a client certificate (CN = the resource's name) from the
clients CA (the Secret ``SLUICE_CLIENTS_CA_SECRET`` names, ``tls.crt`` and ``tls.key``) into the
Secret named after the resource (``tls.crt``, ``tls.key``), renewed when it is within
:data:`RENEW_BEFORE_DAYS` of expiry or was not signed by the current CA. Without a clients CA the
ACLs are still written (a certificate made elsewhere may carry the name) and the condition
``CertificateIssued`` says why there is no Secret. Names that would pose as the cluster's own
components (``sluice-broker*``, ``sluice-controller``, ``ANONYMOUS``) are refused.

Status: ``principal``, ``acls`` (how many the spec asks for), ``secret``, and conditions
``Ready`` (True: every ACL is in the store; False with InvalidSpec and a message naming the
entry when the spec cannot be applied; the schema refuses most such specs before that).
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from sluice import tls
from sluice.metadata.kubernetes import GROUP, VERSION, api_status
from sluice.operator import user_acls
from sluice.operator.handlers.runtime import OperatorRuntime, register_kind, runtime_of
from sluice.operator.handlers.status import check_paused, conditions_of
from sluice.operator.resources import FALSE, TRUE, set_condition
from sluice.operator.settings import OperatorSettings

log = logging.getLogger("sluice.operator")

PLURAL = "sluiceusers"
RENEW_BEFORE_DAYS = 30
CERT_VALIDITY_DAYS = 365
RESERVED_NAMES = ("ANONYMOUS", "sluice-controller")


def register(registry: kopf.OperatorRegistry, settings: OperatorSettings) -> None:
    """Register the SluiceUser handlers (no finalizer: see the module docstring)."""
    register_kind(
        registry, PLURAL, changed=user_changed, timer=user_drift, interval_s=settings.reconcile_interval_s
    )
    kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)(user_event)
    kopf.on.startup(registry=registry)(startup_sweep)


def user_changed(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    reconcile_user(body, patch, runtime_of(memo))


def user_drift(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    runtime = runtime_of(memo)
    reconcile_user(body, patch, runtime)
    sweep_orphans(runtime)


def user_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    if event.get("type") != "DELETED":
        return
    runtime = getattr(memo, "runtime", None)
    if isinstance(runtime, OperatorRuntime):
        delete_user(event["object"], runtime)
    # not started yet: the start-up sweep finds the documents


def startup_sweep(memo: kopf.Memo, **_: Any) -> None:
    try:
        sweep_orphans(runtime_of(memo))
    except Exception as exc:  # never hold the operator's start: the timers sweep again
        log.warning("could not sweep the ACLs of deleted SluiceUsers at start-up: %s", exc)


def owner_of(meta: Mapping[str, Any], runtime: OperatorRuntime) -> str:
    return f"{meta.get('namespace') or runtime.namespace}/{meta['name']}"


def reconcile_user(body: Mapping[str, Any], patch: kopf.Patch, runtime: OperatorRuntime) -> None:
    meta, spec, status = body["metadata"], body.get("spec") or {}, body.get("status") or {}
    generation = meta.get("generation")
    namespace = meta.get("namespace") or runtime.namespace
    if check_paused(meta, status, patch, generation):
        return
    conds = list(patch.status.get("conditions") or conditions_of(status))
    patch.status["observedGeneration"] = generation
    try:
        principal = user_acls.principal_of(spec, namespace, meta["name"])
        if principal.startswith("User:"):
            _check_name(meta["name"])
        wanted = user_acls.bindings_of(spec, principal)
    except user_acls.InvalidUserSpec as exc:
        # nothing of this spec is applied; ACLs an earlier valid spec wrote stay until it is fixed
        patch.status["conditions"] = set_condition(conds, "Ready", FALSE, "InvalidSpec", str(exc), generation)
        return
    patch.status["principal"] = principal
    done = user_acls.sync_user(runtime.meta, owner_of(meta, runtime), str(meta.get("uid") or ""), wanted)
    if done.created or done.deleted:
        name = meta["name"]
        log.info("SluiceUser %s (%s): %d ACL(s) created, %d deleted", name, principal, done.created, done.deleted)
    patch.status["acls"] = len(wanted)
    message = f"{len(wanted)} ACL(s) for {principal} are in the brokers' store"
    if done.shared:
        message += f" ({done.shared} of them also made by hand or by another SluiceUser, which keep them)"
    conds = set_condition(conds, "Ready", TRUE, "AclsApplied", message, generation)
    if (spec.get("authentication") or {}).get("type") == "tls":
        conds = _certificate(body, patch, runtime, conds, generation)
    patch.status["conditions"] = conds


def _check_name(name: str) -> None:
    if name in RESERVED_NAMES or name == tls.BROKER_CN_PREFIX or name.startswith(tls.BROKER_CN_PREFIX + "-"):
        raise user_acls.InvalidUserSpec(
            f"a tls user may not be named {name!r}: the name is the certificate's CN, and that one is the "
            "cluster's own (brokers, the controller, the anonymous principal)"
        )


def delete_user(body: Mapping[str, Any], runtime: OperatorRuntime) -> None:
    meta = body["metadata"]
    deleted = user_acls.delete_user(runtime.meta, owner_of(meta, runtime), str(meta.get("uid") or "") or None)
    log.info("SluiceUser %s deleted: %d ACL(s) removed", meta["name"], deleted)


def sweep_orphans(runtime: OperatorRuntime) -> int:
    """Delete the ACLs of SluiceUsers that no longer exist (deleted while the operator was away)."""

    def live() -> dict[str, str]:
        found = runtime.custom().list_namespaced_custom_object(GROUP, VERSION, runtime.namespace, PLURAL)
        return {owner_of(item["metadata"], runtime): str(item["metadata"].get("uid") or "") for item in found["items"]}

    return user_acls.sweep(runtime.meta, live)


# -- the client certificate of a tls user --------------------------------------------------------


def _certificate(
    body: Mapping[str, Any], patch: kopf.Patch, runtime: OperatorRuntime, conds: list[dict[str, Any]], generation: Any
) -> list[dict[str, Any]]:
    meta = body["metadata"]
    secret_name = runtime.settings.clients_ca_secret
    if not secret_name:
        return set_condition(
            conds, "CertificateIssued", FALSE, "NoClientsCA",
            "the operator has no clients CA (SLUICE_CLIENTS_CA_SECRET): no certificate is issued; a certificate "
            f"with CN {meta['name']} from the brokers' clients CA authenticates as this user",
            generation,
        )  # fmt: skip
    core = runtime.core()
    try:
        ca_secret = core.read_namespaced_secret(secret_name, runtime.namespace)
        ca = tls.KeyPair(_b64(ca_secret.data["tls.crt"]), _b64(ca_secret.data["tls.key"]))
    except Exception as exc:
        reason = "ClientsCAMissing" if api_status(exc) == 404 else "ClientsCAUnreadable"
        return set_condition(conds, "CertificateIssued", FALSE, reason, f"Secret {secret_name}: {exc}", generation)
    name = meta["name"]
    existing = None
    try:
        existing = core.read_namespaced_secret(name, runtime.namespace)
    except Exception as exc:
        if api_status(exc) != 404:
            raise kopf.TemporaryError(f"cannot read Secret {name}: {exc}", delay=5) from None
    if existing is not None and not _needs_renewal(existing, ca, name):
        patch.status["secret"] = name
        return set_condition(conds, "CertificateIssued", TRUE, "Issued", f"Secret {name}", generation)
    pair = tls.issue(ca, name, validity_days=CERT_VALIDITY_DAYS)
    body_secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/part-of": "sluice", "sluice.dev/user": name},
            "ownerReferences": [
                {"apiVersion": f"{GROUP}/{VERSION}", "kind": "SluiceUser", "name": name, "uid": meta["uid"]}
            ],
        },
        "stringData": {"tls.crt": pair.cert_pem.decode(), "tls.key": pair.key_pem.decode()},
    }
    if existing is None:
        core.create_namespaced_secret(runtime.namespace, body_secret)
    else:
        core.replace_namespaced_secret(name, runtime.namespace, body_secret)
    log.info("SluiceUser %s: client certificate issued into Secret %s", name, name)
    patch.status["secret"] = name
    return set_condition(conds, "CertificateIssued", TRUE, "Issued", f"Secret {name}", generation)


def _b64(value: str) -> bytes:
    import base64

    return base64.b64decode(value)


def _needs_renewal(secret: Any, ca: tls.KeyPair, name: str) -> bool:
    try:
        pair = tls.KeyPair(_b64(secret.data["tls.crt"]), _b64(secret.data["tls.key"]))
        cert = pair.certificate
    except Exception:
        return True
    if pair.common_name != name or cert.issuer != ca.certificate.subject:
        return True
    try:
        cert.verify_directly_issued_by(ca.certificate)
    except Exception:
        return True  # another CA of the same name (a rotated clients CA)
    left = cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    return left < datetime.timedelta(days=RENEW_BEFORE_DAYS)
