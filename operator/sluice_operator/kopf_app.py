"""The Kopf operator: ``kopf run -m sluice.operator.kopf_app`` or ``sluice operator``.

Handlers for the three kinds of manifests/crds/ (create, update, resume,
delete with the ``sluice.dev/finalizer`` finalizer) and timers that repair
drift, plus the controller threads of :mod:`sluice.operator.controller.kubernetes`
(broker Pod watch, leader election, status projection, Events), started with
the operator and stopped with it.

* **Topic** -> a real topic: created through the brokers' admin API
  (CreateTopics: the broker validates the config and places replicas, as for
  any client), grown with CreatePartitions, its config kept equal to
  spec.config; deleted with the resource. Status: topic id, one row per
  partition (leader, replicas, ISR, leader epoch), conditions. A replication
  factor above the brokers the operator knows (registered brokers, or the
  expected count when larger) is refused with Ready=False, reason
  InvalidReplicationFactor; changing the replication factor, or declaring
  fewer partitions than an existing topic has, is NotSupported.
* **Coordinator** -> the internal topic of its type (``__transaction_state``,
  ``__consumer_offsets``), created with the resource's partitions and
  replication factor if the brokers have not created it yet; a mismatch with
  an existing internal topic is NotSupported (the partition count maps every
  id to its coordinator and cannot change). One per type: a second one is
  NotSupported. Status: coordinator broker and epoch per partition.
* **TransactionalId** -> a ``transactional_ids/<id>`` document (brokers with
  ``transactional.id.declaration.required=true`` refuse undeclared ids); the
  status follows the coordinator (DescribeTransactions) every
  SLUICE_STATUS_INTERVAL_S, with the Hanging condition; ``spec.operation``
  (fence | abort, with a requestId) fences the id or aborts its open
  transaction, once per requestId, through InitProducerId as Kafka's
  ``Admin.fenceProducers`` does.

Every handler is idempotent and re-reads what it needs, so the timers
(SLUICE_RECONCILE_INTERVAL_S) are also the retry: a topic that could not be
created because no broker was up yet is created on the next tick. The
annotation ``sluice.dev/paused: "true"`` stops all changes to a resource
(Paused=True); statuses are still kept up to date, and deleting a paused
resource releases it without touching the brokers.

Settings come from the environment (``sluice operator`` sets them from its
flags): SLUICE_NAMESPACE (else the pod's namespace), SLUICE_METADATA
(default ``kubernetes://<namespace>``), SLUICE_BROKER_SELECTOR,
SLUICE_FAILOVER_GRACE_SECONDS, SLUICE_EXPECTED_BROKERS (else the replicas of the StatefulSet
SLUICE_BROKER_STATEFULSET), SLUICE_PREFERRED_LEADER_DELAY_S (a returning broker takes its
leaderships back once it has been Ready this long, default 10), SLUICE_PEERING (the KopfPeering
name, default ``sluice``), SLUICE_RECONCILE_INTERVAL_S, SLUICE_STATUS_INTERVAL_S.
Each replica takes a random peering priority, because Kopf freezes every
operator when two share the highest one.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import kopf

from sluice import errors
from sluice.client.admin import Admin
from sluice.metadata import keys
from sluice.metadata.kubernetes import GROUP, VERSION, api_client, parse_url
from sluice.metadata.store import MetadataStore, VersionConflict, open_store, update
from sluice.operator.controller.decisions import new_topic
from sluice.operator.controller.kubernetes import (
    DEFAULT_BROKER_SELECTOR,
    KubernetesController,
    coordinator_status_patch,
    topic_status_patch,
)
from sluice.operator.resources import (
    COORDINATOR_TOPICS,
    FALSE,
    TRUE,
    get_condition,
    is_paused,
    set_condition,
    topic_name,
    transaction_status,
)

log = logging.getLogger("sluice.operator")

FINALIZER = "sluice.dev/finalizer"
RECONCILE_INTERVAL_S = float(os.environ.get("SLUICE_RECONCILE_INTERVAL_S", "30"))
STATUS_INTERVAL_S = float(os.environ.get("SLUICE_STATUS_INTERVAL_S", "5"))
ADMIN_TIMEOUT_S = 15.0
HANDLER_BACKOFF_S = 3.0  # a failed handler is retried this soon (Kopf's default is 60 s)
INTERNAL_TOPIC_CONFIG = {"cleanup.policy": "compact", "retention.ms": "-1"}


def _namespace() -> str:
    ns = os.environ.get("SLUICE_NAMESPACE") or os.environ.get("POD_NAMESPACE", "")
    if not ns:
        ns, _ = parse_url("kubernetes://")
    return ns


class OperatorState:
    """What the handlers share: the store, an admin client to the brokers, the controller."""

    def __init__(self) -> None:
        self.namespace = ""
        self.store: MetadataStore | None = None
        self.controller: KubernetesController | None = None
        self.expected_brokers = 0
        self._admin: tuple[tuple[str, ...], Admin] | None = None
        self._lock = threading.Lock()

    def open(self) -> None:
        self.namespace = _namespace()
        url = os.environ.get("SLUICE_METADATA") or f"kubernetes://{self.namespace}"
        self.store = open_store(url)
        self.expected_brokers = int(os.environ.get("SLUICE_EXPECTED_BROKERS", "0"))
        kubeconfig = os.environ.get("SLUICE_KUBECONFIG") or None
        self.controller = KubernetesController(
            self.store,
            api_client(kubeconfig),
            self.namespace,
            broker_selector=os.environ.get("SLUICE_BROKER_SELECTOR", DEFAULT_BROKER_SELECTOR),
            grace_s=float(os.environ.get("SLUICE_FAILOVER_GRACE_SECONDS", "10")),
            expected_brokers=self.expected_brokers,
            statefulset=os.environ.get("SLUICE_BROKER_STATEFULSET") or None,
            preferred_leader_delay_s=float(os.environ.get("SLUICE_PREFERRED_LEADER_DELAY_S", "10")),
            identity=os.environ.get("HOSTNAME"),
        )
        self.controller.start()
        log.info("operator for namespace %s, metadata %s", self.namespace, url)

    def close(self) -> None:
        if self.controller is not None:
            self.controller.stop()
        with self._lock:
            if self._admin is not None:
                self._admin[1].close()
                self._admin = None
        if self.store is not None:
            self.store.close()

    @property
    def meta(self) -> MetadataStore:
        if self.store is None:
            raise kopf.TemporaryError("the operator is starting", delay=1)
        return self.store

    def brokers(self) -> list[tuple[int, str, str]]:
        """Registered brokers: (id, address, rack)."""
        out = []
        for doc in self.meta.list(keys.BROKERS):
            v = doc.value or {}
            host, port = str(v.get("host", "")), int(v.get("port", 0))
            out.append(
                (int(v["broker_id"]), f"[{host}]:{port}" if ":" in host else f"{host}:{port}", v.get("rack", ""))
            )
        return sorted(out)

    def custom(self) -> Any:
        if self.controller is None:
            raise kopf.TemporaryError("the operator is starting", delay=1)
        return self.controller.custom

    def known_brokers(self) -> int:
        expected = self.controller.expected() if self.controller is not None else self.expected_brokers
        return max(len(self.brokers()), expected)

    def admin(self) -> Admin:
        addresses = tuple(a for _, a, _ in self.brokers())
        if not addresses:
            raise kopf.TemporaryError("no broker has registered yet", delay=5)
        with self._lock:
            if self._admin is None or self._admin[0] != addresses:
                if self._admin is not None:
                    self._admin[1].close()
                self._admin = (
                    addresses,
                    Admin(list(addresses), request_timeout_ms=10_000, client_id="sluice-operator"),
                )
            return self._admin[1]


STATE = OperatorState()


# -- life cycle ----------------------------------------------------------------------------------


@kopf.on.startup()
def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="sluice.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="sluice.dev")
    settings.peering.name = os.environ.get("SLUICE_PEERING", "sluice")
    settings.peering.priority = int(os.environ.get("SLUICE_PEERING_PRIORITY") or random.randint(1, 2**31 - 1))
    settings.posting.level = logging.WARNING  # our own Events say what happened; Kopf's only for failures
    settings.execution.max_workers = 8
    STATE.open()


@kopf.on.cleanup()
def cleanup(**_: Any) -> None:
    STATE.close()


@kopf.on.probe(id="controller")
def probe_controller(**_: Any) -> dict[str, Any]:
    c = STATE.controller
    if c is None:
        return {"running": False}
    return {"running": True, "leading": c.leading.is_set(), "epoch": c.controller.epoch}


def _conditions(status: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [dict(c) for c in status.get("conditions") or []]


def _paused(meta: Mapping[str, Any], status: Mapping[str, Any], patch: kopf.Patch, generation: int | None) -> bool:
    """Sets the Paused condition; True when the resource is paused (the handler then changes nothing)."""
    conds = _conditions(status)
    if is_paused(meta):
        patch.status["conditions"] = set_condition(
            conds,
            "Paused",
            TRUE,
            "PausedByAnnotation",
            "sluice.dev/paused is true: the operator changes nothing",
            generation,
        )
        return True
    if get_condition(conds, "Paused") is not None:
        patch.status["conditions"] = set_condition(conds, "Paused", FALSE, "NotPaused", "", generation)
    return False


# -- Topic ---------------------------------------------------------------------------------------


@kopf.on.resume(GROUP, VERSION, "topics", backoff=HANDLER_BACKOFF_S)
@kopf.on.create(GROUP, VERSION, "topics", backoff=HANDLER_BACKOFF_S)
@kopf.on.update(GROUP, VERSION, "topics", backoff=HANDLER_BACKOFF_S)
def topic_changed(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    reconcile_topic(body, patch)


@kopf.timer(GROUP, VERSION, "topics", interval=RECONCILE_INTERVAL_S, initial_delay=RECONCILE_INTERVAL_S)
def topic_drift(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    reconcile_topic(body, patch)


def reconcile_topic(body: Mapping[str, Any], patch: kopf.Patch) -> None:
    meta, spec, status = body["metadata"], body.get("spec") or {}, body.get("status") or {}
    generation = meta.get("generation")
    name = topic_name(body)
    if _paused(meta, status, patch, generation):
        return
    conds = list(patch.status.get("conditions") or _conditions(status))
    partitions, rf = int(spec.get("partitions", 1)), int(spec.get("replicationFactor", 3))
    config = {str(k): str(v) for k, v in (spec.get("config") or {}).items()}

    def finish(ready: str, reason: str, message: str, reconciling: bool = False) -> None:
        c = set_condition(conds, "Ready", ready, reason, message, generation)
        c = set_condition(
            c,
            "Reconciling",
            TRUE if reconciling else FALSE,
            reason if reconciling else "Done",
            message if reconciling else "",
            generation,
        )
        patch.status["conditions"] = c
        patch.status["observedGeneration"] = generation
        patch.status["topicName"] = name
        patch.status["brokers"] = STATE.known_brokers()

    known = STATE.known_brokers()
    if rf > known and known > 0:
        finish(
            FALSE, "InvalidReplicationFactor", f"replicationFactor {rf} exceeds the {known} broker(s) of the cluster"
        )
        return
    doc = STATE.meta.get(keys.topic(name))
    if doc is None:
        if not STATE.brokers():
            finish(FALSE, "NoBrokers", "no broker has registered yet; the topic is created when one does", True)
            return
        try:
            STATE.admin().create_topic(name, partitions, rf, config, timeout=ADMIN_TIMEOUT_S)
            log.info("created topic %s (%d partitions, replication factor %d)", name, partitions, rf)
        except errors.TopicAlreadyExistsError:
            pass
        except errors.SluiceError as exc:
            retriable = exc.retriable
            finish(FALSE, _reason(exc), str(exc), retriable)
            return
        doc = STATE.meta.get(keys.topic(name))
        if doc is None:
            finish(FALSE, "Creating", "the topic was created; waiting for its metadata", True)
            return
    value = doc.value or {}
    not_supported: list[str] = []
    if value.get("internal"):
        not_supported.append(f"{name} is an internal topic: declare it with a Coordinator")
    current = len(value.get("partitions", []))
    if partitions > current and not value.get("internal"):
        try:
            STATE.admin().create_partitions(name, partitions, timeout=ADMIN_TIMEOUT_S)
            log.info("topic %s grown from %d to %d partitions", name, current, partitions)
        except errors.SluiceError as exc:
            finish(FALSE, _reason(exc), f"adding partitions failed: {exc}", exc.retriable)
            return
    elif partitions < current:
        not_supported.append(f"the topic has {current} partitions; partitions never decrease (spec says {partitions})")
    if rf != int(value.get("replication_factor", rf)):
        not_supported.append(
            f"changing the replication factor is not supported: the topic keeps {value.get('replication_factor')}"
        )
    if config != dict(value.get("config") or {}) and not value.get("internal"):
        problem = _apply_topic_config(name, config)
        if problem:
            finish(FALSE, "InvalidConfig", problem)
            return
    conds = set_condition(
        conds,
        "NotSupported",
        TRUE if not_supported else FALSE,
        "NotSupported" if not_supported else "Supported",
        "; ".join(not_supported),
        generation,
    )
    doc = STATE.meta.get(keys.topic(name))
    if doc is None or doc.value is None:
        finish(FALSE, "Deleted", "the topic's metadata vanished; recreating it on the next reconcile", True)
        return
    projected = topic_status_patch(
        {"metadata": meta, "spec": spec, "status": {"conditions": conds, "observedGeneration": generation}}, doc.value
    )
    patch.status["topicId"] = projected["topicId"]
    patch.status["partitions"] = projected["partitions"]
    ready = get_condition(projected["conditions"], "Ready") or {}
    conds = projected["conditions"]
    finish(str(ready.get("status", FALSE)), str(ready.get("reason", "")), str(ready.get("message", "")))


def _apply_topic_config(name: str, config: dict[str, str]) -> str:
    """Validate the config with a broker (CreateTopics, validate only) and write it to the topic document."""
    try:
        STATE.admin().create_topic(f"{name}", 1, 1, config, validate_only=True, timeout=ADMIN_TIMEOUT_S)
    except errors.TopicAlreadyExistsError:
        pass  # valid: only the name clashes, as it must
    except errors.SluiceError as exc:
        if not isinstance(exc, errors.InvalidReplicationFactorError):
            return f"spec.config refused by the brokers: {exc}"

    def change(value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None or value.get("config") == config:
            return None
        value["config"] = dict(config)
        return value

    update(STATE.meta, keys.topic(name), change)
    log.info("topic %s config set to %s", name, config)
    return ""


@kopf.on.delete(GROUP, VERSION, "topics", backoff=HANDLER_BACKOFF_S)
def topic_deleted(body: kopf.Body, **_: Any) -> None:
    name = topic_name(body)
    if is_paused(body["metadata"]):
        log.info("Topic %s is paused: released without deleting topic %s", body["metadata"]["name"], name)
        return
    doc = STATE.meta.get(keys.topic(name))
    if doc is None or (doc.value or {}).get("internal"):
        return
    try:
        STATE.admin().delete_topic(name, timeout=ADMIN_TIMEOUT_S)
        log.info("deleted topic %s", name)
    except errors.UnknownTopicOrPartitionError:
        pass


def _reason(exc: errors.SluiceError) -> str:
    return "".join(part.capitalize() for part in str(getattr(exc, "code_name", "Error")).lower().split("_"))


# -- Coordinator ---------------------------------------------------------------------------------


@kopf.on.resume(GROUP, VERSION, "coordinators", backoff=HANDLER_BACKOFF_S)
@kopf.on.create(GROUP, VERSION, "coordinators", backoff=HANDLER_BACKOFF_S)
@kopf.on.update(GROUP, VERSION, "coordinators", backoff=HANDLER_BACKOFF_S)
def coordinator_changed(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    reconcile_coordinator(body, patch)


@kopf.timer(GROUP, VERSION, "coordinators", interval=RECONCILE_INTERVAL_S, initial_delay=RECONCILE_INTERVAL_S)
def coordinator_drift(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    reconcile_coordinator(body, patch)


def reconcile_coordinator(body: Mapping[str, Any], patch: kopf.Patch) -> None:
    meta, spec, status = body["metadata"], body.get("spec") or {}, body.get("status") or {}
    generation = meta.get("generation")
    if _paused(meta, status, patch, generation):
        return
    conds = _conditions(status)
    kind = str(spec["type"])
    topic = COORDINATOR_TOPICS[kind]
    partitions, rf = int(spec.get("partitions", 50)), int(spec.get("replicationFactor", 3))
    patch.status["observedGeneration"] = generation
    patch.status["topicName"] = topic

    def refuse(reason: str, message: str, ready: str = FALSE) -> None:
        c = set_condition(conds, "NotSupported", TRUE, reason, message, generation)
        patch.status["conditions"] = set_condition(c, "Ready", ready, reason, message, generation)

    items = STATE.custom().list_namespaced_custom_object(GROUP, VERSION, STATE.namespace, "coordinators")["items"]
    same = sorted(
        (i for i in items if (i.get("spec") or {}).get("type") == kind),
        key=lambda i: (i["metadata"].get("creationTimestamp", ""), i["metadata"]["name"]),
    )
    if same and same[0]["metadata"]["name"] != meta["name"]:
        refuse("Duplicate", f"Coordinator {same[0]['metadata']['name']} already declares the {kind} coordinator")
        return
    known = STATE.known_brokers()
    if known and rf > known:
        refuse("InvalidReplicationFactor", f"replicationFactor {rf} exceeds the {known} broker(s) of the cluster")
        return
    doc = STATE.meta.get(keys.topic(topic))
    if doc is None:
        brokers = STATE.brokers()
        if not brokers:
            patch.status["conditions"] = set_condition(
                conds, "Reconciling", TRUE, "NoBrokers", "waiting for a broker to register", generation
            )
            return
        value = new_topic(
            topic,
            uuid.uuid4().hex,
            partitions,
            rf,
            INTERNAL_TOPIC_CONFIG,
            [(b, r) for b, _, r in brokers],
            internal=True,
        )
        try:
            STATE.meta.compare_and_set(keys.topic(topic), value, None)
            log.info("created %s (%d partitions, replication factor %d)", topic, partitions, rf)
        except VersionConflict:
            pass  # a broker created it meanwhile
        doc = STATE.meta.get(keys.topic(topic))
        if doc is None:
            return
    value = doc.value or {}
    problems = []
    if len(value.get("partitions", [])) != partitions:
        problems.append(
            f"{topic} has {len(value.get('partitions', []))} partitions (fixed when it was created), not {partitions}"
        )
    if int(value.get("replication_factor", rf)) != rf:
        problems.append(f"{topic} has replication factor {value.get('replication_factor')}, not {rf}")
    conds = set_condition(
        conds,
        "NotSupported",
        TRUE if problems else FALSE,
        "Mismatch" if problems else "Supported",
        "; ".join(problems),
        generation,
    )
    projected = coordinator_status_patch(
        {"metadata": meta, "spec": spec, "status": {"conditions": conds, "observedGeneration": generation}}, value
    )
    patch.status["partitions"] = projected["partitions"]
    patch.status["conditions"] = set_condition(projected["conditions"], "Reconciling", FALSE, "Done", "", generation)


# -- TransactionalId -----------------------------------------------------------------------------


@kopf.on.resume(GROUP, VERSION, "transactionalids", backoff=HANDLER_BACKOFF_S)
@kopf.on.create(GROUP, VERSION, "transactionalids", backoff=HANDLER_BACKOFF_S)
@kopf.on.update(GROUP, VERSION, "transactionalids", backoff=HANDLER_BACKOFF_S)
def transactional_id_changed(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    reconcile_transactional_id(body, patch, describe=True)


@kopf.timer(GROUP, VERSION, "transactionalids", interval=STATUS_INTERVAL_S, initial_delay=STATUS_INTERVAL_S)
def transactional_id_status(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    reconcile_transactional_id(body, patch, describe=True)


def reconcile_transactional_id(body: Mapping[str, Any], patch: kopf.Patch, *, describe: bool) -> None:
    meta, spec, status = body["metadata"], body.get("spec") or {}, body.get("status") or {}
    generation = meta.get("generation")
    txn_id = str(spec["transactionalId"])
    resource = f"{meta.get('namespace', STATE.namespace)}/{meta['name']}"
    paused = _paused(meta, status, patch, generation)
    conds = list(patch.status.get("conditions") or _conditions(status))
    patch.status["observedGeneration"] = generation
    if not paused:
        owner: dict[str, str] = {}

        def declare(value: dict[str, Any] | None) -> dict[str, Any] | None:
            if value is not None:
                owner["resource"] = str(value.get("resource", ""))
                return None
            owner["resource"] = resource
            return {"transactional_id": txn_id, "resource": resource}

        update(STATE.meta, keys.transactional_id(txn_id), declare)
        if owner["resource"] != resource:
            conds = set_condition(
                conds, "Ready", FALSE, "AlreadyDeclared", f"{owner['resource']} already declares {txn_id!r}", generation
            )
        else:
            conds = set_condition(
                conds, "Ready", TRUE, "Declared", f"{txn_id!r} is declared to the brokers", generation
            )
        principals = list(spec.get("allowedServiceAccounts") or []) + list(spec.get("allowedUsers") or [])
        conds = set_condition(
            conds,
            "NotSupported",
            TRUE if principals else FALSE,
            "NoClientAuthentication" if principals else "Supported",
            "allowedServiceAccounts/allowedUsers are recorded but not enforced: Sluice has no client authentication"
            if principals
            else "",
            generation,
        )
    known, described = _describe(txn_id) if describe else (False, None)
    if not paused:
        operation = spec.get("operation") or {}
        last = status.get("lastOperation") or {}
        if operation and operation.get("requestId") != last.get("requestId"):
            patch.status["lastOperation"] = run_operation(txn_id, operation, described)
            known, described = _describe(txn_id)
    if not known:  # the coordinator did not answer (moving, loading): keep the status as it is
        patch.status["conditions"] = conds
        return
    new = transaction_status(described, conds, spec.get("transactionTimeoutMs"), int(time.time() * 1000), generation)
    for k, v in new.items():
        patch.status[k] = v


def _describe(txn_id: str) -> tuple[bool, dict[str, Any] | None]:
    """(answered, description): (True, None) for an id never used, (False, None) when nobody answered."""
    try:
        found = STATE.admin().describe_transactions([txn_id], timeout=ADMIN_TIMEOUT_S / 3)
    except errors.TransactionalIdNotFoundError:
        return True, None
    except errors.SluiceError as exc:
        log.info("describing %s failed: %s", txn_id, exc)
        return False, None
    described = asdict(found[0])
    described["partitions"] = [f"{tp.topic}-{tp.partition}" for tp in found[0].partitions]
    return True, described


def run_operation(txn_id: str, operation: Mapping[str, Any], described: Mapping[str, Any] | None) -> dict[str, Any]:
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
        fenced = STATE.admin().fence_producers([txn_id], transaction_timeout_ms=timeout_ms, timeout=ADMIN_TIMEOUT_S)
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


@kopf.on.delete(GROUP, VERSION, "transactionalids", backoff=HANDLER_BACKOFF_S)
def transactional_id_deleted(body: kopf.Body, **_: Any) -> None:
    txn_id = str(body["spec"]["transactionalId"])
    resource = f"{body['metadata'].get('namespace', STATE.namespace)}/{body['metadata']['name']}"
    for _attempt in range(20):
        doc = STATE.meta.get(keys.transactional_id(txn_id))
        if doc is None or (doc.value or {}).get("resource") != resource:
            return
        try:
            STATE.meta.delete(doc.key, doc.version)
            return
        except VersionConflict:
            continue
