"""Topic handlers: a Topic resource -> a real topic, through the brokers' admin API.

Created with CreateTopics (the broker validates the config and places
replicas, as for any client), grown with CreatePartitions, its config kept
equal to spec.config; deleted with the resource. Status: topic id, one row
per partition (leader, replicas, ISR, leader epoch), conditions. A
replication factor above the brokers the operator knows (registered brokers,
or the expected count when larger) is refused with Ready=False, reason
InvalidReplicationFactor; changing the replication factor, or declaring fewer
partitions than an existing topic has, is NotSupported.

The handlers are thin: they find the runtime in Kopf's memo and call
:func:`reconcile_topic`, which tests call directly.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from sluice import errors
from sluice.metadata import documents, keys
from sluice.metadata.documents import TopicDocument
from sluice.metadata.topic_view import read_topic
from sluice.operator import metrics
from sluice.operator.controller.kubernetes import topic_status_patch
from sluice.operator.handlers.runtime import (
    ADMIN_TIMEOUT_S,
    OperatorRuntime,
    register_kind,
    runtime_of,
)
from sluice.operator.handlers.status import check_paused, conditions_of, reason_of
from sluice.operator.resources import FALSE, TRUE, get_condition, is_paused, set_condition, topic_name
from sluice.operator.settings import OperatorSettings

log = logging.getLogger("sluice.operator")

PLURAL = "topics"


def register(registry: kopf.OperatorRegistry, settings: OperatorSettings) -> None:
    """Register the Topic handlers; the drift timer runs every ``settings.reconcile_interval_s``."""
    register_kind(
        registry,
        PLURAL,
        changed=topic_changed,
        timer=topic_drift,
        interval_s=settings.reconcile_interval_s,
        deleted=topic_deleted,
    )


def topic_changed(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    reconcile_topic(body, patch, runtime_of(memo))


def topic_drift(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    reconcile_topic(body, patch, runtime_of(memo))


def topic_deleted(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    delete_topic(body, runtime_of(memo))


def reconcile_topic(body: Mapping[str, Any], patch: kopf.Patch, runtime: OperatorRuntime) -> None:
    meta, spec, status = body["metadata"], body.get("spec") or {}, body.get("status") or {}
    generation = meta.get("generation")
    name = topic_name(body)
    if check_paused(meta, status, patch, generation):
        return
    conds = list(patch.status.get("conditions") or conditions_of(status))
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
        patch.status["brokers"] = runtime.known_brokers()

    known = runtime.known_brokers()
    if rf > known and known > 0:
        finish(
            FALSE, "InvalidReplicationFactor", f"replicationFactor {rf} exceeds the {known} broker(s) of the cluster"
        )
        return
    found = documents.read(runtime.meta, keys.topic(name), TopicDocument)
    if found is None:
        if not runtime.brokers():
            finish(FALSE, "NoBrokers", "no broker has registered yet; the topic is created when one does", True)
            return
        try:
            runtime.admin().create_topic(name, partitions, rf, config, timeout=ADMIN_TIMEOUT_S)
            log.info("created topic %s (%d partitions, replication factor %d)", name, partitions, rf)
            metrics.drift_repaired("Topic", "created")
        except errors.TopicAlreadyExistsError:
            pass
        except errors.SluiceError as exc:
            retriable = exc.retriable
            finish(FALSE, reason_of(exc), str(exc), retriable)
            return
        found = documents.read(runtime.meta, keys.topic(name), TopicDocument)
        if found is None:
            finish(FALSE, "Creating", "the topic was created; waiting for its metadata", True)
            return
    topic = found.value
    not_supported: list[str] = []
    if topic.internal:
        not_supported.append(f"{name} is an internal topic: declare it with a Coordinator")
    current = len(topic.partitions)
    if partitions > current and not topic.internal:
        try:
            runtime.admin().create_partitions(name, partitions, timeout=ADMIN_TIMEOUT_S)
            log.info("topic %s grown from %d to %d partitions", name, current, partitions)
            metrics.drift_repaired("Topic", "partitions")
        except errors.SluiceError as exc:
            finish(FALSE, reason_of(exc), f"adding partitions failed: {exc}", exc.retriable)
            return
    elif partitions < current:
        not_supported.append(f"the topic has {current} partitions; partitions never decrease (spec says {partitions})")
    if rf != topic.replication_factor:
        not_supported.append(
            f"changing the replication factor is not supported: the topic keeps {topic.replication_factor}"
        )
    if config != topic.config and not topic.internal:
        problem = _apply_topic_config(runtime, name, config)
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
    composed = read_topic(runtime.meta, name)  # the partitions' states composed with their records
    if composed is None:
        finish(FALSE, "Deleted", "the topic's metadata vanished; recreating it on the next reconcile", True)
        return
    projected = topic_status_patch(
        {"metadata": meta, "spec": spec, "status": {"conditions": conds, "observedGeneration": generation}},
        composed,
    )
    patch.status["topicId"] = projected["topicId"]
    patch.status["partitions"] = projected["partitions"]
    ready = get_condition(projected["conditions"], "Ready") or {}
    conds = projected["conditions"]
    finish(str(ready.get("status", FALSE)), str(ready.get("reason", "")), str(ready.get("message", "")))


def _apply_topic_config(runtime: OperatorRuntime, name: str, config: dict[str, str]) -> str:
    """Validate the config with a broker (CreateTopics, validate only) and write it to the topic document."""
    try:
        runtime.admin().create_topic(f"{name}", 1, 1, config, validate_only=True, timeout=ADMIN_TIMEOUT_S)
    except errors.TopicAlreadyExistsError:
        pass  # valid: only the name clashes, as it must
    except errors.SluiceError as exc:
        if not isinstance(exc, errors.InvalidReplicationFactorError):
            return f"spec.config refused by the brokers: {exc}"

    def change(topic: TopicDocument | None) -> TopicDocument | None:
        if topic is None or topic.config == config:
            return None
        return dataclasses.replace(topic, config=dict(config))

    documents.update_document(runtime.meta, keys.topic(name), TopicDocument, change)
    log.info("topic %s config set to %s", name, config)
    metrics.drift_repaired("Topic", "config")
    return ""


def delete_topic(body: Mapping[str, Any], runtime: OperatorRuntime) -> None:
    """Delete the topic with its resource (not an internal one; not while paused: then it is only released)."""
    name = topic_name(body)
    if is_paused(body["metadata"]):
        log.info("Topic %s is paused: released without deleting topic %s", body["metadata"]["name"], name)
        return
    found = documents.read(runtime.meta, keys.topic(name), TopicDocument)
    if found is None or found.value.internal:
        return
    try:
        runtime.admin().delete_topic(name, timeout=ADMIN_TIMEOUT_S)
        log.info("deleted topic %s", name)
    except errors.UnknownTopicOrPartitionError:
        pass
