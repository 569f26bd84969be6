"""TransactionalId handlers: a resource -> a ``transactional_ids/<id>`` document, status from the coordinator.

Brokers with ``transactional.id.declaration.required=true`` refuse ids no
document declares (:class:`~sluice.metadata.documents.TransactionalIdDocument`).
``spec.operation`` (fence | abort, with a requestId) fences the id or aborts its
open transaction, once per requestId, through InitProducerId as Kafka's
``Admin.fenceProducers`` does.

The status follows the coordinator (DescribeTransactions), with the Hanging condition: written
by the change handler, then kept current for every id of the namespace at once by the status
rounds of :mod:`sluice.operator.transactional_id_statuses` (a thread, every
``status_interval_s``: one LIST, one DescribeTransactions per coordinator, a PATCH only where a
status changed), not by a Kopf timer per resource, which at 10,000 ids was 2,000 handler calls a
second. Every ``DECLARE_EVERY`` rounds the thread also declares again the ids whose document was
deleted or changed behind the operator's back (the drift repair, counted in
``sluice_operator_drift_repairs``).

``allowedUsers`` / ``allowedServiceAccounts`` go into the document as principals
(``allowed_principals``: ``User:<name>``, ``ServiceAccount:<ns>:<name>``); brokers with the
authorizer on let only them use the id (broker/sluice_broker/security/authorizer.py). A spec
change rewrites the list of the document this resource declares.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import kopf

from sluice import errors
from sluice.acls import transactional_id_principals
from sluice.metadata import documents, keys
from sluice.metadata.documents import TransactionalIdDocument
from sluice.metadata.store import VersionConflict
from sluice.operator import metrics
from sluice.operator.handlers.runtime import (
    ADMIN_TIMEOUT_S,
    OperatorRuntime,
    register_kind,
    runtime_of,
)
from sluice.operator.handlers.status import check_paused, conditions_of
from sluice.operator.resources import FALSE, TRUE, is_paused, set_condition, transaction_status
from sluice.operator.settings import OperatorSettings
from sluice.operator.transactional_id_statuses import TransactionalIdStatuses, description_fields

log = logging.getLogger("sluice.operator")

PLURAL = "transactionalids"


DECLARE_EVERY = 12  # status rounds between two drift checks of the documents (a minute at 5 s)


def register(registry: kopf.OperatorRegistry, settings: OperatorSettings) -> None:
    """Register the TransactionalId handlers, and the status rounds (every ``settings.status_interval_s``)
    started and stopped with the operator."""
    register_kind(
        registry,
        PLURAL,
        changed=transactional_id_changed,
        timer=None,
        interval_s=settings.status_interval_s,
        deleted=transactional_id_deleted,
    )

    def start(memo: kopf.Memo, **_: Any) -> None:
        runtime = runtime_of(memo)
        controller = runtime.controller
        if controller is None:
            raise kopf.TemporaryError("the controller is not running yet", delay=1)
        statuses = TransactionalIdStatuses(
            controller.custom,
            settings.namespace,
            runtime.admin,
            interval_s=settings.status_interval_s,
            may_act=controller.leading.is_set,
            redeclare=functools.partial(redeclare, runtime),
            declare_every=DECLARE_EVERY,
        )
        statuses.start()
        memo.transactional_id_statuses = statuses

    def stop(memo: kopf.Memo, **_: Any) -> None:
        statuses = getattr(memo, "transactional_id_statuses", None)
        if isinstance(statuses, TransactionalIdStatuses):
            statuses.stop()

    kopf.on.startup(registry=registry)(start)
    kopf.on.cleanup(registry=registry)(stop)


def transactional_id_changed(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    reconcile_transactional_id(body, patch, runtime_of(memo), describe=True)


def transactional_id_deleted(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    release_transactional_id(body, runtime_of(memo))


def _resource(meta: Mapping[str, Any], runtime: OperatorRuntime) -> str:
    return f"{meta.get('namespace', runtime.namespace)}/{meta['name']}"


def reconcile_transactional_id(
    body: Mapping[str, Any], patch: kopf.Patch, runtime: OperatorRuntime, *, describe: bool
) -> None:
    meta, spec, status = body["metadata"], body.get("spec") or {}, body.get("status") or {}
    generation = meta.get("generation")
    txn_id = str(spec["transactionalId"])
    resource = _resource(meta, runtime)
    paused = check_paused(meta, status, patch, generation)
    conds = list(patch.status.get("conditions") or conditions_of(status))
    patch.status["observedGeneration"] = generation
    if not paused:
        owner = declare(runtime, txn_id, resource, _principals(spec))
        if owner != resource:
            conds = set_condition(
                conds, "Ready", FALSE, "AlreadyDeclared", f"{owner} already declares {txn_id!r}", generation
            )
        else:
            conds = set_condition(
                conds, "Ready", TRUE, "Declared", f"{txn_id!r} is declared to the brokers", generation
            )
        # allowedServiceAccounts are principals a token listener authenticates (TokenReview): supported
        conds = set_condition(conds, "NotSupported", FALSE, "Supported", "", generation)
    known, described = _describe(runtime, txn_id) if describe else (False, None)
    if not paused:
        operation = spec.get("operation") or {}
        last = status.get("lastOperation") or {}
        if operation and operation.get("requestId") != last.get("requestId"):
            patch.status["lastOperation"] = run_operation(runtime, txn_id, operation, described)
            known, described = _describe(runtime, txn_id)
    if not known:  # the coordinator did not answer (moving, loading): keep the status as it is
        patch.status["conditions"] = conds
        return
    new = transaction_status(described, conds, spec.get("transactionTimeoutMs"), int(time.time() * 1000), generation)
    for k, v in new.items():
        patch.status[k] = v


def _principals(spec: Mapping[str, Any]) -> list[str]:
    return transactional_id_principals(spec.get("allowedUsers") or [], spec.get("allowedServiceAccounts") or [])


def _declaration(
    current: TransactionalIdDocument | None, txn_id: str, resource: str, allowed: list[str]
) -> TransactionalIdDocument | None:
    """The document ``resource`` declaring ``txn_id`` with ``allowed`` needs in place of ``current``;
    None when ``current`` is already so, or is another resource's (left as it is)."""
    if current is None:
        return TransactionalIdDocument(txn_id, resource, allowed_principals=allowed)
    if current.resource == resource and current.allowed_principals != allowed:
        return dataclasses.replace(current, allowed_principals=allowed)
    return None


def declare(runtime: OperatorRuntime, txn_id: str, resource: str, allowed: list[str]) -> str:
    """Make the id's document say that ``resource`` declares it with ``allowed``; the resource that
    declares it (another one's document is left as it is)."""
    declared = documents.update_document(
        runtime.meta,
        keys.transactional_id(txn_id),
        TransactionalIdDocument,
        lambda current: _declaration(current, txn_id, resource, allowed),
    )
    return resource if declared is None else declared.resource


def redeclare(runtime: OperatorRuntime, items: Sequence[Mapping[str, Any]]) -> int:
    """The drift repair of the status rounds: declare again each id (of resources not paused) whose
    document is gone, or is this resource's with other principals. One LIST of the documents;
    how many were repaired."""
    docs = {
        d.value.transactional_id: d.value
        for d in documents.list_documents(runtime.meta, keys.TRANSACTIONAL_IDS, TransactionalIdDocument)
    }
    repaired = 0
    for item in items:
        meta, spec = item["metadata"], item.get("spec") or {}
        if is_paused(meta):
            continue
        txn_id, resource, allowed = str(spec["transactionalId"]), _resource(meta, runtime), _principals(spec)
        doc = docs.get(txn_id)
        if _declaration(doc, txn_id, resource, allowed) is not None:
            declare(runtime, txn_id, resource, allowed)  # read again: the write is a compare-and-set
            metrics.DRIFT_REPAIRS.labels("TransactionalId", "declared").inc()
            log.info(
                "TransactionalId %s: its document was %s; declared again",
                resource,
                "gone" if doc is None else "changed",
            )
            repaired += 1
    return repaired


def _describe(runtime: OperatorRuntime, txn_id: str) -> tuple[bool, dict[str, Any] | None]:
    """(answered, description): (True, None) for an id never used, (False, None) when nobody answered."""
    try:
        found = runtime.admin().describe_transactions([txn_id], timeout=ADMIN_TIMEOUT_S / 3)
    except errors.TransactionalIdNotFoundError:
        return True, None
    except errors.SluiceError as exc:
        log.info("describing %s failed: %s", txn_id, exc)
        return False, None
    return True, description_fields(found[0])


def run_operation(
    runtime: OperatorRuntime, txn_id: str, operation: Mapping[str, Any], described: Mapping[str, Any] | None
) -> dict[str, Any]:
    """Fence the id, or abort its open transaction (which fences its producer too)."""
    kind, request_id = str(operation["type"]), str(operation["requestId"])
    result: dict[str, Any] = {
        "type": kind,
        "requestId": request_id,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    timeout_ms = int((described or {}).get("transaction_timeout_ms") or 60_000)
    try:
        if kind == "abort" and (described is None or described["state"] != "Ongoing"):
            state = "never used" if described is None else f"state {described['state']}"
            result.update(result="Succeeded", message=f"no open transaction to abort ({state})")
            return result
        fenced = runtime.admin().fence_producers([txn_id], transaction_timeout_ms=timeout_ms, timeout=ADMIN_TIMEOUT_S)
        pid, epoch = fenced[txn_id]
        if kind == "abort":
            parts = ", ".join((described or {}).get("partitions", []))
            message = f"aborted the open transaction (partitions {parts}); producer {pid} fenced, epoch now {epoch}"
        else:
            message = f"producer {pid} fenced: epoch now {epoch}"
        result.update(result="Succeeded", message=message)
        log.info("TransactionalId %s: %s", txn_id, message)
    except errors.SluiceError as exc:
        result.update(result="Failed", message=str(exc))
        log.warning("TransactionalId %s: %s failed: %s", txn_id, kind, exc)
    return result


def release_transactional_id(body: Mapping[str, Any], runtime: OperatorRuntime) -> None:
    """Delete the id's document, if this resource is the one declaring it."""
    txn_id = str(body["spec"]["transactionalId"])
    resource = _resource(body["metadata"], runtime)
    key = keys.transactional_id(txn_id)
    for _attempt in range(20):
        found = documents.read(runtime.meta, key, TransactionalIdDocument)
        if found is None or found.value.resource != resource:
            return
        try:
            runtime.meta.delete(key, found.version)
            return
        except VersionConflict:
            continue
