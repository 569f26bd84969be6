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
clients CA (the Secret ``SLUICE_CLIENTS_CA_SECRET`` names) into the Secret named after the
resource (``user.crt``, ``user.key``, ``ca.crt``: :mod:`sluice.operator.user_certificates`, which
says when it is renewed), deleted with the resource. Without a clients CA the ACLs are still
written (a certificate made elsewhere may carry the name) and the condition ``CertificateIssued``
says why there is no Secret. Names that would pose as the cluster's own components
(``sluice-broker*``, ``sluice-controller``, ``sluice-operator``, ``ANONYMOUS``) are refused, and
names longer than a CN may be.

Status: ``principal``, ``acls`` (how many the spec asks for), ``secret`` (tls: the Secret's
name), and conditions ``Ready`` (True: every ACL is in the store; False with InvalidSpec and a
message naming the entry when the spec cannot be applied; the schema refuses most such specs
before that) and, with tls, ``CertificateIssued``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import kopf

from sluice import tls
from sluice.metadata.kubernetes import GROUP, VERSION, api_status
from sluice.operator import user_acls, user_certificates
from sluice.operator.handlers.runtime import OperatorRuntime, register_kind, runtime_of
from sluice.operator.handlers.status import check_paused, conditions_of
from sluice.operator.resources import FALSE, TRUE, set_condition
from sluice.operator.settings import OperatorSettings

log = logging.getLogger("sluice.operator")

PLURAL = "sluiceusers"
RESERVED_NAMES = ("ANONYMOUS", "sluice-controller", "sluice-operator")


def register(registry: kopf.OperatorRegistry, settings: OperatorSettings) -> None:
    """Register the SluiceUser handlers (no finalizer: see the module docstring)."""
    register_kind(registry, PLURAL, changed=user_changed, timer=user_drift, interval_s=settings.reconcile_interval_s)
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
            "cluster's own (brokers, the controller, the operator, the anonymous principal)"
        )
    if len(name) > user_certificates.MAX_CN_LENGTH:
        raise user_acls.InvalidUserSpec(
            f"a tls user's name is its certificate's CN, at most {user_certificates.MAX_CN_LENGTH} characters "
            f"(this one has {len(name)})"
        )


def delete_user(body: Mapping[str, Any], runtime: OperatorRuntime) -> None:
    meta = body["metadata"]
    uid = str(meta.get("uid") or "") or None
    deleted = user_acls.delete_user(runtime.meta, owner_of(meta, runtime), uid)
    log.info("SluiceUser %s deleted: %d ACL(s) removed", meta["name"], deleted)
    if not runtime.settings.clients_ca_secret:
        return  # no certificates issued: no Secret
    namespace = meta.get("namespace") or runtime.namespace
    try:
        if user_certificates.delete(runtime.core(), namespace, meta["name"], uid):
            log.info("SluiceUser %s deleted: its Secret %s deleted", meta["name"], meta["name"])
    except Exception as exc:  # the timers' sweep deletes it later
        log.warning("SluiceUser %s deleted: could not delete its Secret yet: %s", meta["name"], exc)


def sweep_orphans(runtime: OperatorRuntime) -> int:
    """Delete the ACLs of SluiceUsers that no longer exist (deleted while the operator was away)."""

    def users() -> list[dict[str, Any]]:
        found = runtime.custom().list_namespaced_custom_object(GROUP, VERSION, runtime.namespace, PLURAL)
        return list(found["items"])

    def live() -> dict[str, str]:
        return {owner_of(u["metadata"], runtime): str(u["metadata"].get("uid") or "") for u in users()}

    def live_names() -> dict[str, str]:
        return {u["metadata"]["name"]: str(u["metadata"].get("uid") or "") for u in users()}

    deleted = user_acls.sweep(runtime.meta, live)
    if runtime.settings.clients_ca_secret:
        deleted += user_certificates.sweep(runtime.core(), runtime.namespace, live_names)
    return deleted


# -- the client certificate of a tls user (sluice.operator.user_certificates) --------------------


def _certificate(
    body: Mapping[str, Any], patch: kopf.Patch, runtime: OperatorRuntime, conds: list[dict[str, Any]], generation: Any
) -> list[dict[str, Any]]:
    name = body["metadata"]["name"]
    settings = runtime.settings
    if not settings.clients_ca_secret:
        return set_condition(
            conds, "CertificateIssued", FALSE, "NoClientsCA",
            "the operator has no clients CA (SLUICE_CLIENTS_CA_SECRET): no certificate is issued; a certificate "
            f"with CN {name} from the brokers' clients CA authenticates as this user",
            generation,
        )  # fmt: skip
    core = runtime.core()
    try:
        ca = user_certificates.read_clients_ca(core, settings.clients_ca_secret, runtime.namespace)
        secrets = [n for n in (settings.ca_cert_secret, settings.broker_certs_secret) if n]
        bundle = user_certificates.cluster_ca_bundle(core, runtime.namespace, secrets, settings.broker_ca_file)
        issued = user_certificates.ensure(core, runtime.namespace, body, ca, bundle, settings.cert_policy)
    except user_certificates.NotIssued as exc:
        return set_condition(conds, "CertificateIssued", FALSE, exc.reason, str(exc), generation)
    except Exception as exc:
        if api_status(exc) == 409:  # the Secret changed meanwhile: read it again
            raise kopf.TemporaryError(f"Secret {name} changed meanwhile", delay=1) from None
        raise kopf.TemporaryError(f"cannot write Secret {name}: {exc}", delay=5) from None
    patch.status["secret"] = issued.secret
    keys = f"{user_certificates.USER_CERT}, {user_certificates.USER_KEY}" + (", ca.crt" if bundle else "")
    return set_condition(
        conds, "CertificateIssued", TRUE, "Issued", f"Secret {issued.secret} ({keys}), CN {name}", generation
    )
