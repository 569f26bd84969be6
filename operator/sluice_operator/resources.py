"""What the custom resources say, as pure functions: names, statuses, conditions (no I/O).

The Kopf handlers (:mod:`sluice.operator.handlers`) and the status projector
(:mod:`sluice.operator.controller.kubernetes`) both build statuses here, so a Topic's
status reads the same whoever wrote it last, and unit tests state exact
expectations.

Conditions follow the Kubernetes convention (``type``, ``status``,
``reason``, ``message``, ``lastTransitionTime``, ``observedGeneration``);
``lastTransitionTime`` changes only when ``status`` does. The types used:

* ``Ready``: the resource is in effect (a Topic: the topic exists and every
  partition has a leader; a TransactionalId: declared to the brokers).
* ``Reconciling``: the operator is still working towards the spec.
* ``NotSupported``: the spec asks for something Sluice cannot do (changing
  a topic's replication factor, fewer partitions than the topic already
  has, principals on a TransactionalId while there is no authentication).
* ``Paused``: the ``sluice.dev/paused: "true"`` annotation stops the
  operator from changing anything for this resource (status is still kept).
* ``Hanging`` (TransactionalId): a transaction has been open for longer than
  its timeout.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sluice.metadata.documents import CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC, TopicDocument

PAUSE_ANNOTATION = "sluice.dev/paused"
TRUE, FALSE = "True", "False"
# A Coordinator's spec.type -> the internal topic it declares (the names are sluice.metadata's).
COORDINATOR_TOPICS: Mapping[str, str] = {"transaction": TRANSACTION_STATE_TOPIC, "group": CONSUMER_OFFSETS_TOPIC}
_ORDINAL = re.compile(r"-(\d+)$")


def now_iso(ms: int | None = None) -> str:
    """RFC 3339 in UTC, seconds precision (what Kubernetes timestamps look like)."""
    moment = datetime.now(UTC) if ms is None else datetime.fromtimestamp(ms / 1000, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_ordinal(name: str) -> int | None:
    """The StatefulSet ordinal at the end of a pod name (``sluice-broker-2`` -> 2), None without one."""
    m = _ORDINAL.search(name)
    return int(m.group(1)) if m else None


def is_paused(meta: Mapping[str, Any]) -> bool:
    value = (meta.get("annotations") or {}).get(PAUSE_ANNOTATION, "")
    return str(value).strip().lower() in ("true", "1", "yes")


def topic_name(body: Mapping[str, Any]) -> str:
    """A Topic's Kafka topic name: spec.topicName, else metadata.name."""
    return str((body.get("spec") or {}).get("topicName") or body["metadata"]["name"])


def set_condition(
    conditions: Sequence[Mapping[str, Any]] | None,
    type_: str,
    status: str,
    reason: str,
    message: str = "",
    generation: int | None = None,
    now: str | None = None,
) -> list[dict[str, Any]]:
    """``conditions`` with ``type_`` set; lastTransitionTime kept unless the status changes."""
    stamp = now or now_iso()
    out: list[dict[str, Any]] = []
    found = False
    for c in conditions or ():
        if c.get("type") != type_:
            out.append(dict(c))
            continue
        found = True
        same = c.get("status") == status
        new = {
            "type": type_,
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": c["lastTransitionTime"] if same and c.get("lastTransitionTime") else stamp,
        }
        if generation is not None:
            new["observedGeneration"] = generation
        out.append(new)
    if not found:
        new = {"type": type_, "status": status, "reason": reason, "message": message}
        new["lastTransitionTime"] = stamp
        if generation is not None:
            new["observedGeneration"] = generation
        out.append(new)
    return out


def get_condition(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions or () if c.get("type") == type_), None)


def partition_rows(doc: TopicDocument) -> list[dict[str, Any]]:
    """``status.partitions`` of a Topic from its ``topics/<name>`` document."""
    return [
        {
            "partition": i,
            "leader": p.leader,
            "leaderEpoch": p.leader_epoch,
            "replicas": list(p.replicas),
            "isr": list(p.isr),
        }
        for i, p in enumerate(doc.partitions)
    ]


def coordinator_rows(doc: TopicDocument) -> list[dict[str, Any]]:
    """``status.partitions`` of a Coordinator: the leader of each partition coordinates, at its epoch."""
    return [
        {
            "partition": row["partition"],
            "coordinator": row["leader"],
            "coordinatorEpoch": row["leaderEpoch"],
            "replicas": row["replicas"],
            "isr": row["isr"],
        }
        for row in partition_rows(doc)
    ]


def leadership_condition(
    conditions: Sequence[Mapping[str, Any]] | None, doc: TopicDocument, generation: int | None, what: str
) -> list[dict[str, Any]]:
    """Ready from the document: True when every partition has a leader."""
    leaderless = [i for i, p in enumerate(doc.partitions) if p.leader < 0]
    if leaderless:
        return set_condition(
            conditions,
            "Ready",
            FALSE,
            "LeaderNotAvailable",
            f"{len(leaderless)} partition(s) of {what} have no leader (no live in-sync replica): {leaderless[:20]}",
            generation,
        )
    count = len(doc.partitions)
    return set_condition(conditions, "Ready", TRUE, "Ready", f"{what}: {count} partition(s), each led", generation)


def transaction_status(
    described: Mapping[str, Any] | None,
    conditions: Sequence[Mapping[str, Any]] | None,
    declared_timeout_ms: int | None,
    now_ms: int,
    generation: int | None,
) -> dict[str, Any]:
    """A TransactionalId's status from its coordinator's description (None: the id was never used).

    ``described`` has the fields of :class:`sluice.client.admin.TransactionDescription`
    (state, producer_id, producer_epoch, transaction_timeout_ms,
    transaction_start_time_ms, partitions as "topic-partition",
    coordinator_id, last_update_time_ms). Hanging: Ongoing for longer than the
    declared timeout, else the producer's own.
    """
    if described is None:
        status: dict[str, Any] = {
            "state": "Unknown",
            "coordinator": -1,
            "producerId": -1,
            "producerEpoch": -1,
            "partitions": [],
        }
        status["conditions"] = set_condition(
            conditions, "Hanging", FALSE, "NoTransaction", "no producer has used this id yet", generation
        )
        return status
    state = str(described["state"])
    started = int(described.get("transaction_start_time_ms", -1))
    timeout = declared_timeout_ms or int(described.get("transaction_timeout_ms", 0))
    status = {
        "state": state,
        "coordinator": int(described.get("coordinator_id", -1)),
        "producerId": int(described["producer_id"]),
        "producerEpoch": int(described["producer_epoch"]),
        "transactionTimeoutMs": int(described.get("transaction_timeout_ms", 0)),
        "partitions": sorted(described.get("partitions", [])),
    }
    if started >= 0:
        status["transactionStartTime"] = now_iso(started)
    if int(described.get("last_update_time_ms", -1)) > 0:
        status["lastUpdateTime"] = now_iso(int(described["last_update_time_ms"]))
    open_ms = now_ms - started if state == "Ongoing" and started >= 0 else -1
    if timeout and open_ms > timeout:
        status["conditions"] = set_condition(
            conditions,
            "Hanging",
            TRUE,
            "TransactionTimedOut",
            f"transaction open for {open_ms // 1000} s, past its {timeout} ms timeout, on "
            f"{len(status['partitions'])} partition(s): abort it with spec.operation (type abort)",
            generation,
        )
    else:
        status["conditions"] = set_condition(
            conditions,
            "Hanging",
            FALSE,
            "WithinTimeout" if state == "Ongoing" else "NoOpenTransaction",
            # no running count of seconds: a message that changed every round would be a PATCH every round
            f"open since {status.get('transactionStartTime', '?')}, within its {timeout} ms timeout"
            if state == "Ongoing"
            else f"state {state}",
            generation,
        )
    return status
