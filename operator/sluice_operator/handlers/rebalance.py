"""SluiceRebalance handlers: a proposal the user approves, then partition reassignments in batches.

A SluiceRebalance (manifests/crds/sluicerebalances.sluice.dev.yaml) plays the part of Strimzi's
KafkaRebalance. Its life, kept in ``status.state`` so that any operator replica (or a restarted
one) carries on where the last left off:

``ProposalReady``  the plan (:func:`sluice.metadata.rebalance.plan`) is in status: per broker the
                   replica and preferred-leader counts and bytes before and after, the partitions
                   to move, the replicas and bytes to copy, and ``status.plan`` the target of
                   each partition.
                   Nothing moves until the annotation ``sluice.dev/rebalance: approve`` (or
                   ``spec.autoApprove: true``).
``Rebalancing``    each round starts reassignments (:func:`sluice.metadata.reassignment.start`,
                   the same change AlterPartitionReassignments makes) until
                   ``spec.maxPartitionsInFlight`` partitions are moving, and counts the ones done;
                   the controller completes each move when its new replicas are in sync.
``Ready``          every partition of the plan is where the plan put it.
``Stopped``        ``sluice.dev/rebalance: stop`` cancelled the moves in flight (their partitions
                   go back to their original replicas); finished moves stay. ``approve`` resumes.
``NotReady``       the spec cannot be planned (unknown broker ids, a mode without brokers, a
                   drain the remaining brokers cannot hold ...): Ready=False, reason InvalidSpec,
                   and nothing moves.

``sluice.dev/rebalance: refresh`` (or a changed spec) computes a new proposal, except while
Rebalancing, where a new plan would fight the one running (stop first). The operator removes
the annotation once it has acted on it, as Strimzi does. Annotations are acted on by the timer
(every ``status_interval_s``), which is also what moves a running rebalance on: the tests saw
Kopf's update handler not called for an annotation change. A timer and an update handler may
overlap in Kopf; every step is idempotent (a move started twice is one move), with one known
window: a round that read the state before a ``stop`` may start moves after it (stop again).

A ``remove-brokers`` rebalance also says whether the brokers it drains may go: condition
``BrokersHoldReplicas`` (True while any topic, filtered or not, still has a replica on one of
them, with the counts) and ``ReadyToScaleDown`` (True once Ready and they hold nothing). It is
checked on every round, also after Ready: the drained brokers are still registered, so a topic
created later may land on them again. Scaling the StatefulSet down is left to the user (see
docs/kubernetes.md), who then loses no partition.

**Automatic rebalance on scale-up** (``SLUICE_AUTO_REBALANCE_ON_SCALE_UP=true``, the chart's
``rebalance.autoOnScaleUp``): on every event of a broker Pod, a registered broker that holds no
replica while others do, is not dead and is not being drained by a remove-brokers rebalance gets
a SluiceRebalance ``auto-add-brokers-<ids>`` (mode add-brokers, autoApprove), which then runs as
any other. Its name makes it once per set of brokers: a second event finds it exists. One runs at
a time, as Strimzi queues brokers added during an auto-rebalance: while any rebalance is about to
run or running (no state yet, Rebalancing, or ProposalReady with autoApprove), a broker that joins
waits, and the round in which that rebalance ends creates the next one for every broker still
empty. Two plans made at once would each count the other's targets as they were, and fight over
the same partitions. A StatefulSet with ``podManagementPolicy: Parallel`` starts its new brokers
together, so one may register before and one after the first auto rebalance is planned.

**Bytes.** The metadata holds no partition sizes, so each proposal asks every broker for its
log directory (DescribeLogDirs over gRPC, with the operator's admin client and credentials, the
ones its Coordinator and TransactionalId handlers use) and passes the planner each partition's
size as its leader reports it: the plan then states bytes per broker before and after and
``bytesToMove``, and weighs its moves by bytes (:mod:`sluice.metadata.rebalance`, "Bytes"). A
broker that does not answer within a few seconds, or refuses, is named in
``proposal.brokersWithoutSizes``; the partitions it leads have no size, the plan is then by
counts, and ``bytesToMove`` says why it is unknown. No byte is guessed.

Moves are written to the topic documents directly, not through a broker's admin API: the
operator already owns the store (its controller writes leadership there), the change is the
one :mod:`sluice.metadata.reassignment` defines for the brokers, and a rebalance then does not
depend on an admin connection being up. Throughput is bounded by the batch size and by the
brokers' reassignment throttles: their ``leader/follower.replication.throttled.rate``, or
**the rebalance's own** ``spec.throttleBytesPerSecond``, as ``kafka-reassign-partitions
--throttle`` sets a dynamic broker rate for the time of a reassignment: while the rebalance is
Rebalancing the operator keeps the ``replication_throttle`` document
(:class:`sluice.metadata.documents.ReplicationThrottleDocument`) at that rate, which every broker
applies to both its leader and follower buckets in place of its configured rates, and it removes
the document once the rebalance is Ready, Stopped, NotReady or deleted (as ``--verify`` removes
the throttle). The document names its rebalance: one cluster has one such rate, so a second
rebalance running at the same time leaves the first one's in force (its Rebalancing condition
says so) rather than fighting over it. The rate may be changed while the rebalance runs (the
plan stays; the AnnotationIgnored condition says the spec changed).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from sluice.client.types import TopicPartition
from sluice.metadata import documents, keys, topic_view
from sluice.metadata.documents import ReplicationThrottleDocument, TopicDocument
from sluice.metadata.kubernetes import GROUP, VERSION
from sluice.metadata.reassignment import ReassignmentRefused, cancel, check_target, start, target_replicas
from sluice.metadata.rebalance import MODES, REMOVE_BROKERS, Goal, Plan, PlanRefused, plan
from sluice.metadata.store import VersionConflict
from sluice.metadata.topic_view import TopicView
from sluice.operator import metrics
from sluice.operator.handlers.runtime import OperatorRuntime, register_kind, runtime_of
from sluice.operator.handlers.status import check_paused, conditions_of
from sluice.operator.resources import FALSE, TRUE, get_condition, set_condition
from sluice.operator.settings import OperatorSettings
from sluice.records import now_ms

log = logging.getLogger("sluice.operator")

PLURAL = "sluicerebalances"
ANNOTATION = "sluice.dev/rebalance"
APPROVE, STOP, REFRESH = "approve", "stop", "refresh"
PROPOSAL_READY, REBALANCING, READY, STOPPED, NOT_READY = "ProposalReady", "Rebalancing", "Ready", "Stopped", "NotReady"
DEFAULT_IN_FLIGHT = 10
SIZES_TIMEOUT_S = 5.0  # how long a proposal waits for the brokers' DescribeLogDirs answers
# A rebalance writes its throttle document during its round, and its status says Rebalancing only
# once Kopf patches it after the round: another rebalance's sweep in between saw a fresh document
# of a rebalance "not running" and removed it while its first move started (the throttle was then
# off for a whole status interval). A document this young is only swept when its rebalance is gone.
SWEEP_GRACE_MS = 60_000


def register(registry: kopf.OperatorRegistry, settings: OperatorSettings) -> None:
    """Register the handlers; the timer (progress, the drain check) runs every ``status_interval_s``."""
    register_kind(
        registry, PLURAL, changed=rebalance_changed, timer=rebalance_tick, interval_s=settings.status_interval_s
    )
    kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)(rebalance_event)
    if settings.auto_rebalance_on_scale_up:
        labels = dict(kv.split("=", 1) for kv in settings.broker_selector.split(",") if "=" in kv)
        kopf.on.event("", "v1", "pods", labels=labels, registry=registry)(broker_pod_event)


def rebalance_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    """A deleted rebalance leaves the progress metrics and takes its throttle away (no finalizer:
    its moves in flight finish under the controller, the others are simply not started)."""
    if event.get("type") == "DELETED":
        meta = (event.get("object") or {}).get("metadata") or {}
        resource = f"{meta.get('namespace')}/{meta.get('name')}"
        metrics.rebalance_progress(resource, {}, active=False)
        runtime = getattr(memo, "runtime", None)
        if isinstance(runtime, OperatorRuntime) and runtime.store is not None:
            try:
                release_throttle(runtime, resource)
            except Exception as exc:  # any other rebalance's next round, or the operator's start, sweeps it (gone)
                log.warning("SluiceRebalance %s deleted: its throttle could not be removed: %s", resource, exc)


def broker_pod_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    runtime = getattr(memo, "runtime", None)
    if not isinstance(runtime, OperatorRuntime) or event.get("type") == "DELETED":
        return
    try:
        name = auto_rebalance(runtime)
    except Exception as exc:  # the next pod event tries again; never fail Kopf's watch on it
        log.warning("automatic rebalance on scale-up: %s", exc)
        return
    if name:
        log.info("brokers joined empty: created SluiceRebalance %s (add-brokers, auto-approved)", name)


def auto_rebalance(runtime: OperatorRuntime, ending: str = "") -> str | None:
    """Create the add-brokers rebalance for brokers that joined empty; its name, or None when none
    is due or another rebalance is running (its end calls this again with ``ending``, its own
    name: its status does not say so yet)."""
    held: dict[int, int] = {}
    for topic in _topics(runtime):
        for part in topic.partitions:
            for b in part.replicas:
                held[b] = held.get(b, 0) + 1
    if not held:
        return None  # no topic yet: there is nothing to share
    existing = runtime.custom().list_namespaced_custom_object(GROUP, VERSION, runtime.namespace, PLURAL)
    running = sorted(
        item["metadata"]["name"]
        for item in existing.get("items") or []
        if item["metadata"]["name"] != ending and _runs_or_will_run(item)
    )
    draining = {
        int(b)
        for item in existing.get("items") or []
        if (item.get("spec") or {}).get("mode") == REMOVE_BROKERS
        for b in (item.get("spec") or {}).get("brokers") or ()
    }
    dead = set(_dead(runtime))
    empty = sorted(
        b.broker_id
        for b in runtime.brokers()
        if not held.get(b.broker_id) and b.broker_id not in dead and b.broker_id not in draining
    )
    if not empty:
        return None
    if running:
        log.info("brokers %s joined empty: their rebalance waits for SluiceRebalance %s", empty, ", ".join(running))
        return None
    name = "auto-add-brokers-" + "-".join(str(b) for b in empty)
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SluiceRebalance",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "sluice-operator"}},
        "spec": {"mode": "add-brokers", "brokers": empty, "autoApprove": True},
    }
    try:
        runtime.custom().create_namespaced_custom_object(GROUP, VERSION, runtime.namespace, PLURAL, body)
    except ApiException as exc:
        if exc.status == 409:
            return None  # made on an earlier event
        raise
    return name


def _runs_or_will_run(item: Mapping[str, Any]) -> bool:
    """A rebalance that moves or is about to: not planned yet, Rebalancing, or a proposal approved
    in advance (autoApprove). A proposal waiting for the user's approval does not hold back others."""
    state = str((item.get("status") or {}).get("state") or "")
    auto = bool((item.get("spec") or {}).get("autoApprove"))
    return state in ("", REBALANCING) or (state == PROPOSAL_READY and auto)


def rebalance_changed(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    reconcile_rebalance(body, patch, runtime_of(memo))


def rebalance_tick(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    reconcile_rebalance(body, patch, runtime_of(memo))


def throttle_of(spec: Mapping[str, Any]) -> int | None:
    """``spec.throttleBytesPerSecond``: a positive integer, or None when absent (PlanRefused otherwise;
    the CRD's schema refuses such values too, this is for objects it did not check)."""
    value = spec.get("throttleBytesPerSecond")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise PlanRefused(f"spec.throttleBytesPerSecond must be a positive integer (bytes/s), not {value!r}")
    return value


def goal_of(spec: Mapping[str, Any]) -> Goal:
    """The planner's goal from a spec (the CRD's schema checks types; the planner checks meaning)."""
    mode = str(spec.get("mode") or "full")
    if mode not in MODES:
        raise PlanRefused(f"unknown mode {mode!r}: one of {', '.join(MODES)}")
    return Goal(
        mode=mode,
        brokers=tuple(int(b) for b in spec.get("brokers") or ()),
        topics=tuple(str(t) for t in spec.get("topics") or ()),
    )


def reconcile_rebalance(body: Mapping[str, Any], patch: kopf.Patch, runtime: OperatorRuntime) -> None:
    """One round of a SluiceRebalance (see the module docstring for its states)."""
    meta, spec, status = body["metadata"], body.get("spec") or {}, dict(body.get("status") or {})
    generation = meta.get("generation")
    if check_paused(meta, status, patch, generation):
        return
    action = str((meta.get("annotations") or {}).get(ANNOTATION, "")).strip().lower()
    conds = list(patch.status.get("conditions") or conditions_of(status))
    state = str(status.get("state") or "")
    stale = status.get("observedGeneration") != generation

    if action:  # acted on (or ignored) this round: removed, so the next one is the user's again
        patch.metadata.setdefault("annotations", {})[ANNOTATION] = None  # None removes it
    if action and get_condition(conds, "AnnotationIgnored") is not None:  # a new request: the old verdict goes
        conds = set_condition(conds, "AnnotationIgnored", FALSE, "Acted", "", generation)
    if action not in ("", APPROVE, STOP, REFRESH):
        message = f"{ANNOTATION}: {action!r} is not approve, stop or refresh"
        conds = set_condition(conds, "AnnotationIgnored", TRUE, "UnknownValue", message, generation)
    if state == REBALANCING and action == STOP:
        conds, state = _stop(runtime, status, conds, generation), STOPPED
    elif state != REBALANCING and (not state or stale or action == REFRESH):
        conds, state, status = _propose(runtime, spec, conds, generation, patch)
    elif state == REBALANCING and (stale or action == REFRESH):
        conds = set_condition(
            conds,
            "AnnotationIgnored",
            TRUE,
            "Rebalancing",
            "the plan cannot change while it runs: stop it first (sluice.dev/rebalance: stop), then refresh",
            generation,
        )
    if state in (PROPOSAL_READY, STOPPED) and (
        action == APPROVE or (state == PROPOSAL_READY and spec.get("autoApprove"))
    ):
        state = REBALANCING
        log.info("SluiceRebalance %s approved: %d partition(s) to move", meta["name"], len(status.get("plan") or ()))
    resource = f"{meta.get('namespace') or runtime.namespace}/{meta['name']}"
    throttle_note = ""
    if state == REBALANCING:
        throttle_note = _hold_throttle(runtime, resource, spec)
        conds, state = _execute(runtime, meta, spec, status, conds, generation, patch)
    if state != REBALANCING:
        sweep_throttle(runtime, resource, mine_too=True)  # ours goes when it stops; another's if left behind
    elif throttle_note:
        conds = _note(conds, "Rebalancing", throttle_note)
    if state != NOT_READY and goal_mode(spec) == REMOVE_BROKERS:
        conds = _drain_conditions(runtime, spec, conds, generation, state == READY)
    patch.status["state"] = state
    patch.status["conditions"] = conds
    if state != str(status.get("state") or "") and not _runs_or_will_run({"spec": spec, "status": {"state": state}}):
        _next_auto_rebalance(runtime, meta["name"])
    metrics.rebalance_progress(
        f"{meta.get('namespace') or runtime.namespace}/{meta['name']}",
        dict(patch.status.get("progress") or status.get("progress") or {}),
        active=state == REBALANCING,
    )


def _next_auto_rebalance(runtime: OperatorRuntime, ending: str) -> None:
    """``ending`` has just ended: brokers that joined empty while it ran get their rebalance now."""
    if not runtime.settings.auto_rebalance_on_scale_up:
        return
    try:
        name = auto_rebalance(runtime, ending)
    except Exception as exc:  # a pod event (or the operator's restart) tries again
        log.warning("automatic rebalance on scale-up after %s: %s", ending, exc)
        return
    if name:
        log.info("SluiceRebalance %s ended: created %s for the brokers that joined empty meanwhile", ending, name)


def goal_mode(spec: Mapping[str, Any]) -> str:
    return str(spec.get("mode") or "full")


def _note(conds: list[dict[str, Any]], type_: str, note: str) -> list[dict[str, Any]]:
    """``conds`` with ``note`` appended to the message of condition ``type_``."""
    return [
        {**c, "message": f"{c.get('message') or ''}; {note}".lstrip("; ")} if c.get("type") == type_ else c
        for c in conds
    ]


def _hold_throttle(runtime: OperatorRuntime, resource: str, spec: Mapping[str, Any]) -> str:
    """Keep the replication_throttle document at this rebalance's rate while it runs; what is in force, in words."""
    try:
        rate = throttle_of(spec)
    except PlanRefused as exc:  # changed to an invalid value while running: keep what is in force
        log.warning("SluiceRebalance %s: %s (the throttle in force stays)", resource, exc)
        rate = -1
    if rate is None:
        release_throttle(runtime, resource)  # the field was removed while running
    else:
        sweep_throttle(runtime, resource)  # another rebalance's, left behind: this one's rate takes over

    def change(doc: ReplicationThrottleDocument | None) -> ReplicationThrottleDocument | None:
        if rate is None or rate < 0 or (doc is not None and doc.resource != resource):
            return None  # nothing to write, or another rebalance's rate is in force
        if doc is not None and doc.rate == rate:
            return None
        return ReplicationThrottleDocument(rate, resource, now_ms())

    doc = documents.update_document(runtime.meta, keys.REPLICATION_THROTTLE, ReplicationThrottleDocument, change)
    if doc is None:
        return ""
    if doc.resource != resource:
        return f"the throttle in force is {doc.rate} bytes/s, set by rebalance {doc.resource}"
    return f"throttled to {doc.rate} bytes/s"


def sweep_throttle(runtime: OperatorRuntime, resource: str = "", *, mine_too: bool = False) -> bool:
    """Remove a replication_throttle document left by another rebalance (not ``resource``) that is
    gone or no longer Rebalancing: one deleted while no operator ran (its DELETED event then never
    came), say; with ``mine_too``, ``resource``'s own as well. Whether one was removed. The document
    of a rebalance that exists stays for ``SWEEP_GRACE_MS`` after it was written, whatever that
    rebalance's status says: it has just started, and its status does not say Rebalancing yet."""
    found = documents.read(runtime.meta, keys.REPLICATION_THROTTLE, ReplicationThrottleDocument)
    if found is None:
        return False
    if found.value.resource == resource:
        return mine_too and release_throttle(runtime, resource)
    namespace, _, name = found.value.resource.partition("/")
    if namespace != runtime.namespace:
        return False  # not ours to judge
    try:
        obj = runtime.custom().get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    except kopf.TemporaryError:
        return False  # no API client (yet): a later round sweeps
    except ApiException as exc:
        if exc.status != 404:
            raise
        obj = None
    if obj is not None and (
        (obj.get("status") or {}).get("state") == REBALANCING or now_ms() - found.value.updated_ms < SWEEP_GRACE_MS
    ):
        return False  # running, or just started and its status not patched yet
    return release_throttle(runtime, found.value.resource)


def release_throttle(runtime: OperatorRuntime, resource: str) -> bool:
    """Remove the replication_throttle document if ``resource`` set it; whether one was removed."""
    for _ in range(10):
        found = documents.read(runtime.meta, keys.REPLICATION_THROTTLE, ReplicationThrottleDocument)
        if found is None or found.value.resource != resource:
            return False
        try:
            runtime.meta.delete(keys.REPLICATION_THROTTLE, found.version)
        except VersionConflict:
            continue
        log.info("SluiceRebalance %s: its reassignment throttle removed", resource)
        return True
    return False


def partition_sizes(
    runtime: OperatorRuntime, topics: list[TopicDocument]
) -> tuple[dict[tuple[str, int], int], dict[int, str]]:
    """Each partition's size as its leader reports it (DescribeLogDirs to every broker), and the
    registered brokers whose sizes are unknown, with why. A partition whose leader did not answer
    (or that has none) is left out: its size is unknown."""
    registered = [b.broker_id for b in runtime.brokers()]
    try:
        answers = runtime.admin().describe_log_dirs(timeout=SIZES_TIMEOUT_S)
    except Exception as exc:  # none answered, or the call itself failed: every size is unknown
        log.warning("partition sizes: DescribeLogDirs failed: %s", exc)
        return {}, dict.fromkeys(registered, f"DescribeLogDirs failed: {exc}")
    unknown = {b: "did not answer" for b in registered if b not in answers}
    for b, answer in answers.items():
        if answer.error is not None:
            unknown[b] = f"refused: {answer.error}"
    sizes: dict[tuple[str, int], int] = {}
    for topic in topics:
        for index, part in enumerate(topic.partitions):
            leader = answers.get(part.leader)
            if leader is None or leader.error is not None:
                continue
            size = leader.replica_sizes.get(TopicPartition(topic.name, index))
            if size is not None:
                sizes[(topic.name, index)] = size
    return sizes, unknown


def _topics(runtime: OperatorRuntime) -> list[TopicDocument]:
    """Every topic as it is now (fresh reads, composed with its partition change records)."""
    topics = TopicView.load(runtime.meta).topics()
    return [topics[name] for name in sorted(topics)]


def _update_partitions(runtime: OperatorRuntime, name: str, change: Callable[[TopicDocument], TopicDocument]) -> None:
    """One topic's partition states changed by ``change`` (a record, or the topic document before records)."""
    topic_view.update_partitions(runtime.meta, name, change, writer="operator", attempts=50)


def _propose(
    runtime: OperatorRuntime, spec: Mapping[str, Any], conds: list[dict[str, Any]], generation: Any, patch: kopf.Patch
) -> tuple[list[dict[str, Any]], str, dict[str, Any]]:
    """Plan anew: the proposal and plan in status, state ProposalReady (Ready when nothing moves)."""
    patch.status["observedGeneration"] = generation
    try:
        goal = goal_of(spec)
        throttle_of(spec)
        topics = _topics(runtime)
        sizes, unknown = partition_sizes(runtime, topics)
        result = plan(goal, runtime.brokers(), topics, sizes)
    except PlanRefused as exc:
        patch.status["proposal"] = None
        patch.status["plan"] = []
        patch.status["progress"] = None
        conds = set_condition(conds, "ProposalReady", FALSE, "InvalidSpec", str(exc), generation)
        conds = set_condition(conds, "Rebalancing", FALSE, "InvalidSpec", "", generation)
        return set_condition(conds, "Ready", FALSE, "InvalidSpec", str(exc), generation), NOT_READY, {}
    rows = [{"topic": t, "partition": p, "replicas": rs} for (t, p), rs in result.moves.items()]
    patch.status["proposal"] = proposal_status(result, unknown)
    patch.status["plan"] = rows
    patch.status["progress"] = {"total": len(rows), "done": 0, "inFlight": 0}
    copied = "" if result.bytes_to_move is None else f" ({result.bytes_to_move} bytes)"
    summary = (
        f"{result.partitions_to_move} partition(s) to move, {result.replicas_to_copy} replica(s) to copy{copied},"
        f" {result.leader_changes} preferred leader(s) to change"
    )
    conds = set_condition(conds, "ProposalReady", TRUE, "ProposalComputed", summary, generation)
    conds = set_condition(conds, "Rebalancing", FALSE, "NotApproved" if rows else "NothingToMove", "", generation)
    if not rows:
        return set_condition(conds, "Ready", TRUE, "Balanced", "nothing to move", generation), READY, {"plan": []}
    message = f"approve with the annotation {ANNOTATION}: approve (or set spec.autoApprove)"
    conds = set_condition(conds, "Ready", FALSE, "ProposalReady", message, generation)
    return conds, PROPOSAL_READY, {"plan": rows}


def bytes_unknown(unknown: Mapping[int, str]) -> str:
    """``bytesToMove`` when a copied partition's size is unknown: why, never a guess."""
    if unknown:
        why = "; ".join(f"broker {b} {reason}" for b, reason in sorted(unknown.items()))
        return f"unknown: no partition sizes from broker(s) {sorted(unknown)} ({why}); replicasToCopy counts the copies"
    return (
        "unknown: a partition to copy has no size (no leader, or its leader has not opened it yet);"
        " replicasToCopy counts the copies"
    )


def proposal_status(result: Plan, unknown: Mapping[int, str] | None = None) -> dict[str, Any]:
    """The proposal as status shows it (the CRD's ``status.proposal``); ``unknown``: the brokers
    whose sizes are unknown, with why."""
    unknown = dict(unknown or {})
    brokers = []
    for load in result.loads:
        row: dict[str, Any] = {
            "id": load.broker_id,
            "replicasBefore": load.replicas_before,
            "replicasAfter": load.replicas_after,
            "leadersBefore": load.leaders_before,
            "leadersAfter": load.leaders_after,
        }
        if load.bytes_before is not None:
            row["bytesBefore"] = load.bytes_before
        if load.bytes_after is not None:
            row["bytesAfter"] = load.bytes_after
        brokers.append(row)
    return {
        "partitionsToMove": result.partitions_to_move,
        "replicasToCopy": result.replicas_to_copy,
        "leaderChanges": result.leader_changes,
        "bytesToMove": bytes_unknown(unknown) if result.bytes_to_move is None else result.bytes_to_move,
        "balancedBy": "bytes" if result.by_bytes else "replicas",
        "brokersWithoutSizes": sorted(unknown),
        "brokers": brokers,
    }


def _classify(row: Mapping[str, Any], topics: Mapping[str, TopicDocument]) -> str:
    """``done``, ``moving`` (our target is in flight) or ``pending`` for one planned partition."""
    topic = topics.get(str(row["topic"]))
    index, target = int(row["partition"]), [int(b) for b in row["replicas"]]
    if topic is None or index >= len(topic.partitions):
        return "done"  # the topic was deleted: nothing left to move
    part = topic.partitions[index]
    if part.reassigning:
        return "moving" if target_replicas(part) == target else "pending"
    return "done" if part.replicas == target else "pending"


def _execute(
    runtime: OperatorRuntime,
    meta: Mapping[str, Any],
    spec: Mapping[str, Any],
    status: Mapping[str, Any],
    conds: list[dict[str, Any]],
    generation: Any,
    patch: kopf.Patch,
) -> tuple[list[dict[str, Any]], str]:
    """Start the next batch of moves and report progress; Ready when every move is done."""
    rows = list(patch.status.get("plan") or status.get("plan") or [])
    limit = max(int(spec.get("maxPartitionsInFlight") or DEFAULT_IN_FLIGHT), 1)
    topics = {t.name: t for t in _topics(runtime)}
    states = [_classify(r, topics) for r in rows]
    room = limit - states.count("moving")
    registered = [b.broker_id for b in runtime.brokers()]
    refused: list[str] = []
    for row, st in zip(rows, states, strict=True):
        if st != "pending" or room <= 0:
            continue
        target = [int(b) for b in row["replicas"]]
        try:
            _start_move(runtime, str(row["topic"]), int(row["partition"]), target, registered)
            room -= 1
        except ReassignmentRefused as exc:
            refused.append(f"{row['topic']}-{row['partition']}: {exc.message}")
    if refused:
        message = "; ".join(refused[:5])
        log.warning("SluiceRebalance %s: moves refused: %s", meta["name"], message)
        conds = set_condition(conds, "Rebalancing", FALSE, "MoveRefused", message, generation)
        conds = set_condition(conds, "Ready", FALSE, "MoveRefused", message + " (refresh for a new plan)", generation)
        return conds, STOPPED
    topics = {t.name: t for t in _topics(runtime)}
    states = [_classify(r, topics) for r in rows]
    done, moving = states.count("done"), states.count("moving")
    patch.status["progress"] = {"total": len(rows), "done": done, "inFlight": moving}
    if done == len(rows):
        conds = set_condition(conds, "Rebalancing", FALSE, "Done", f"{done} partition(s) moved", generation)
        log.info("SluiceRebalance %s done: %d partition(s) moved", meta["name"], done)
        return set_condition(conds, "Ready", TRUE, "Rebalanced", f"{done} partition(s) moved", generation), READY
    message = f"{done} of {len(rows)} partition(s) moved, {moving} moving"
    conds = set_condition(conds, "Rebalancing", TRUE, "Moving", message, generation)
    return set_condition(conds, "Ready", FALSE, "Rebalancing", message, generation), REBALANCING


def _start_move(runtime: OperatorRuntime, name: str, index: int, target: list[int], registered: list[int]) -> None:
    """Start one partition's reassignment to ``target`` (the change AlterPartitionReassignments writes)."""

    def change(topic: TopicDocument) -> TopicDocument:
        if index >= len(topic.partitions):
            return topic
        part = topic.partitions[index]
        check_target(target, registered, len(target_replicas(part)), allow_replication_factor_change=False)
        return topic.with_partition(index, start(part, target))

    _update_partitions(runtime, name, change)


def _stop(
    runtime: OperatorRuntime, status: Mapping[str, Any], conds: list[dict[str, Any]], generation: Any
) -> list[dict[str, Any]]:
    """Cancel the plan's moves in flight (their partitions go back); finished moves stay."""
    topics = {t.name: t for t in _topics(runtime)}
    dead = frozenset(d for d in _dead(runtime))
    cancelled, kept = 0, []
    for row in status.get("plan") or []:
        if _classify(row, topics) != "moving":
            continue
        name, index = str(row["topic"]), int(row["partition"])

        def change(topic: TopicDocument, index: int = index) -> TopicDocument:
            if index >= len(topic.partitions) or not topic.partitions[index].reassigning:
                return topic
            return topic.with_partition(index, cancel(topic.partitions[index], dead))

        try:
            _update_partitions(runtime, name, change)
            cancelled += 1
        except ReassignmentRefused as exc:
            kept.append(f"{name}-{index}: {exc.message}")
    message = f"stopped: {cancelled} move(s) in flight cancelled" + (
        f"; not cancelled: {'; '.join(kept)}" if kept else ""
    )
    conds = set_condition(conds, "Rebalancing", FALSE, "Stopped", message, generation)
    return set_condition(conds, "Ready", FALSE, "Stopped", message + f" ({ANNOTATION}: approve resumes)", generation)


def _dead(runtime: OperatorRuntime) -> list[int]:
    found = documents.read(runtime.meta, keys.CONTROLLER, documents.ControllerDocument)
    return [] if found is None else list(found.value.dead_brokers)


def _drain_conditions(
    runtime: OperatorRuntime, spec: Mapping[str, Any], conds: list[dict[str, Any]], generation: Any, ready: bool
) -> list[dict[str, Any]]:
    """BrokersHoldReplicas / ReadyToScaleDown for the brokers a remove-brokers rebalance drains."""
    draining = {int(b) for b in spec.get("brokers") or ()}
    held: dict[int, int] = {}
    for topic in _topics(runtime):
        for part in topic.partitions:
            for b in part.replicas:
                if b in draining:
                    held[b] = held.get(b, 0) + 1
    if held:
        listed = ", ".join(f"broker {b}: {n} replica(s)" for b, n in sorted(held.items()))
        conds = set_condition(conds, "BrokersHoldReplicas", TRUE, "NotDrained", listed, generation)
        return set_condition(
            conds, "ReadyToScaleDown", FALSE, "BrokersHoldReplicas", f"do not scale down yet: {listed}", generation
        )
    ids = sorted(draining)
    conds = set_condition(conds, "BrokersHoldReplicas", FALSE, "Drained", f"brokers {ids} hold no replica", generation)
    if not ready:
        return set_condition(
            conds, "ReadyToScaleDown", FALSE, "NotRebalanced", "the rebalance has not finished", generation
        )
    return set_condition(
        conds, "ReadyToScaleDown", TRUE, "Drained", f"brokers {ids} hold no replica: they can be removed", generation
    )
