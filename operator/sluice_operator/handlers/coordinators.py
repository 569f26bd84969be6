"""Coordinator handlers: a Coordinator resource -> the internal topic of its type.

``transaction`` declares ``__transaction_state``, ``group`` declares
``__consumer_offsets`` (the names are :mod:`sluice.metadata.documents`'). The
topic is created with the resource's partitions and replication factor if the
brokers have not created it yet; a mismatch with an existing internal topic is
NotSupported (the partition count maps every id to its coordinator and cannot
change). One per type: a second one is NotSupported. Status: coordinator
broker and epoch per partition.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Mapping
from typing import Any

import kopf

from sluice.metadata import documents, keys
from sluice.metadata.documents import INTERNAL_TOPIC_CONFIG, TopicDocument
from sluice.metadata.kubernetes import GROUP, VERSION
from sluice.metadata.store import VersionConflict
from sluice.metadata.topic_view import read_topic, records_enabled
from sluice.operator import metrics
from sluice.operator.controller.decisions import new_topic
from sluice.operator.controller.kubernetes import coordinator_status_patch
from sluice.operator.handlers.runtime import OperatorRuntime, register_kind, runtime_of
from sluice.operator.handlers.status import check_paused, conditions_of
from sluice.operator.resources import COORDINATOR_TOPICS, FALSE, TRUE, set_condition
from sluice.operator.settings import OperatorSettings

log = logging.getLogger("sluice.operator")

PLURAL = "coordinators"


def register(registry: kopf.OperatorRegistry, settings: OperatorSettings) -> None:
    """Register the Coordinator handlers; the drift timer runs every ``settings.reconcile_interval_s``."""
    register_kind(
        registry, PLURAL, changed=coordinator_changed, timer=coordinator_drift, interval_s=settings.reconcile_interval_s
    )


def coordinator_changed(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    reconcile_coordinator(body, patch, runtime_of(memo))


def coordinator_drift(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    reconcile_coordinator(body, patch, runtime_of(memo))


def reconcile_coordinator(body: Mapping[str, Any], patch: kopf.Patch, runtime: OperatorRuntime) -> None:
    meta, spec, status = body["metadata"], body.get("spec") or {}, body.get("status") or {}
    generation = meta.get("generation")
    if check_paused(meta, status, patch, generation):
        return
    conds = conditions_of(status)
    kind = str(spec["type"])
    topic = COORDINATOR_TOPICS[kind]
    partitions, rf = int(spec.get("partitions", 50)), int(spec.get("replicationFactor", 3))
    patch.status["observedGeneration"] = generation
    patch.status["topicName"] = topic

    def refuse(reason: str, message: str, ready: str = FALSE) -> None:
        c = set_condition(conds, "NotSupported", TRUE, reason, message, generation)
        patch.status["conditions"] = set_condition(c, "Ready", ready, reason, message, generation)

    items = runtime.custom().list_namespaced_custom_object(GROUP, VERSION, runtime.namespace, PLURAL)["items"]
    same = sorted(
        (i for i in items if (i.get("spec") or {}).get("type") == kind),
        key=lambda i: (i["metadata"].get("creationTimestamp", ""), i["metadata"]["name"]),
    )
    if same and same[0]["metadata"]["name"] != meta["name"]:
        refuse("Duplicate", f"Coordinator {same[0]['metadata']['name']} already declares the {kind} coordinator")
        return
    known = runtime.known_brokers()
    if known and rf > known:
        refuse("InvalidReplicationFactor", f"replicationFactor {rf} exceeds the {known} broker(s) of the cluster")
        return
    found = documents.read(runtime.meta, keys.topic(topic), TopicDocument)
    if found is None:
        brokers = runtime.brokers()
        if len(brokers) < rf:  # as the brokers do: never fewer replicas than asked (the drift timer retries)
            message = f"waiting for {rf} brokers to register ({len(brokers)} have) to create {topic}"
            patch.status["conditions"] = set_condition(
                conds, "Reconciling", TRUE, "NoBrokers" if not brokers else "WaitingForBrokers", message, generation
            )
            return
        created = new_topic(
            topic,
            uuid.uuid4().hex,
            partitions,
            rf,
            INTERNAL_TOPIC_CONFIG,
            [(b.broker_id, b.rack) for b in brokers],
            internal=True,
        )
        if records_enabled(runtime.meta):  # switched to records at once (else the controller switches it)
            created = dataclasses.replace(created, states_in_records=True)
        try:
            documents.create(runtime.meta, keys.topic(topic), created)
            log.info("created %s (%d partitions, replication factor %d)", topic, partitions, rf)
            metrics.drift_repaired("Coordinator", "created")
        except VersionConflict:
            pass  # a broker created it meanwhile
        found = documents.read(runtime.meta, keys.topic(topic), TopicDocument)
        if found is None:
            return
    value = found.value
    problems = []
    if len(value.partitions) != partitions:
        problems.append(f"{topic} has {len(value.partitions)} partitions (fixed when it was created), not {partitions}")
    if value.replication_factor != rf:
        problems.append(f"{topic} has replication factor {value.replication_factor}, not {rf}")
    conds = set_condition(
        conds,
        "NotSupported",
        TRUE if problems else FALSE,
        "Mismatch" if problems else "Supported",
        "; ".join(problems),
        generation,
    )
    projected = coordinator_status_patch(
        {"metadata": meta, "spec": spec, "status": {"conditions": conds, "observedGeneration": generation}},
        read_topic(runtime.meta, topic) or value,  # the partitions' states composed with their records
    )
    patch.status["partitions"] = projected["partitions"]
    patch.status["conditions"] = set_condition(projected["conditions"], "Reconciling", FALSE, "Done", "", generation)
