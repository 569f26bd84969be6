"""The controller in Kubernetes: leader election from broker Pods, status projection, Events.

The Kopf handlers (:mod:`sluice.operator.handlers`) turn resources into
metadata documents; this module keeps the cluster right while brokers come
and go. It runs in the operator process as threads that do not depend on
Kopf's event loop, so a burst of resource events never delays a failover:

* **Pod watch.** A LIST+WATCH of the broker Pods (a label selector) feeds
  :class:`~sluice.operator.liveness.pods.PodLiveness`: Ready pods are live,
  pods NotReady beyond the grace period or deleted are dead. With a session
  timeout (``SLUICE_BROKER_SESSION_TIMEOUT_S``, the chart's 9 s, Kafka's
  ``broker.session.timeout.ms``) the controller also health-checks every
  broker itself, and one without a SERVING answer that long is dead while its
  Pod still says Ready: a crash, a hang or a lost node is seen without waiting
  for the kubelet's probes (:mod:`sluice.operator.liveness.sessions`).
* **Liveness thread.** While this replica leads, the detector is polled every 100 ms and a
  broker's death published in the ``controller`` document at once, not after the controller
  round in progress (:meth:`~sluice.operator.controller.loop.ControllerLoop.watch_liveness`).
* **Controller loop.** The same :class:`~sluice.operator.controller.loop.ControllerLoop`
  the embedded cluster runs, over the Kubernetes MetadataStore, with Pod
  liveness instead of health checks: it applies the pure rules of
  :mod:`sluice.operator.controller.decisions` to every topic document (user topics and
  the coordinators' internal topics alike), electing new leaders for
  everything a dead broker led and handing leadership back to preferred
  replicas once they are back in the ISR.
* **One active controller.** Two operator replicas may run (Kopf peering
  keeps their resource handlers apart); the controller loop runs only in
  the replica that holds the ``sluice-controller`` Lease
  (coordination.k8s.io). Taking the lease also takes the next controller
  epoch in the ``controller`` document, and a controller that finds a newer
  epoch there stops acting at once (it lost its lease while paused, say),
  so two controllers never act on the same epoch.
* **Events.** Every topic document the controller rewrites yields one
  Kubernetes Event (reason ``LeaderElected``, ``LeaderNotAvailable`` or
  ``IsrShrunk``) naming every leadership move, on the Topic (or Coordinator,
  for internal topics) it concerns, else on the new leader's Pod. A broker whose log
  directory goes offline (a full disk) gets a Warning Event ``LogDirOffline`` on its Pod, and
  ``LogDirOnline`` when it is back; one whose data volume runs low on space (below
  ``log.dir.free.space.warn.percent`` free), ``LogDirLowSpace`` and later ``LogDirSpaceOk``.
  Events are posted from a queue by their own thread.
* **Status projection.** Topic and Coordinator statuses follow the
  ``topics/<name>`` documents (partitions, leaders, ISR, epochs, Ready)
  through the store's watch: a leadership move or an ISR change by a leader
  shows in ``kubectl get topic -o yaml`` within a moment. Each changed topic's
  resource is read by name (a GET) and patched only when its status would
  change; which resource belongs to which topic (a Topic's ``spec.topicName`` may differ
  from its object name) is kept in a :class:`ResourceIndex` that the Event owner lookup
  shares, so neither LISTs every Topic per change (each LIST carries every Topic's
  status, one row per partition). The index is re-LISTed only on a miss, at most
  once per ``RELIST_S``.
* **Broker count.** The ConfigMap ``sluice-cluster`` (``data.brokers``) says
  how many brokers the cluster has: the larger of the registered brokers
  and the configured count (the StatefulSet's replicas). The
  ValidatingAdmissionPolicy of manifests/policies/ reads it to refuse a
  replicationFactor above it.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from sluice.metadata import keys
from sluice.metadata.documents import TopicDocument
from sluice.metadata.kubernetes import GROUP, VERSION, api_status
from sluice.metadata.store import MetadataStore, VersionConflict
from sluice.metadata.topic_view import WatchedTopics
from sluice.operator.controller.decisions import describe_changes
from sluice.operator.controller.loop import DEFAULT_PREFERRED_LEADER_HOLD_MS, ControllerFenced, ControllerLoop
from sluice.operator.liveness.brokers import FailureDetector, GrpcHealthChecker
from sluice.operator.liveness.pods import PodLiveness
from sluice.operator.liveness.sessions import SessionLiveness
from sluice.operator.resources import (
    COORDINATOR_TOPICS,
    coordinator_rows,
    leadership_condition,
    now_iso,
    partition_rows,
    topic_name,
)
from sluice.operator.settings import DEFAULT_BROKER_SELECTOR

log = logging.getLogger("sluice.operator.controller")

# A topic whose resource is not in the ResourceIndex LISTs its kind again, at most this often: a
# topic without a resource (created through the Kafka admin API) must not LIST on every change.
RELIST_S = 2.0
LEASE_NAME = "sluice-controller"
CLUSTER_CONFIGMAP = "sluice-cluster"
COMPONENT = "sluice-operator"


class LeaseElector:
    """Holds the ``sluice-controller`` Lease while this replica is the active controller."""

    def __init__(
        self,
        coordination: Any,
        namespace: str,
        identity: str,
        duration_s: float = 6.0,
        renew_s: float = 1.0,
        name: str = LEASE_NAME,
    ) -> None:
        self.api = coordination
        self.namespace = namespace
        self.identity = identity
        self.duration_s = duration_s
        self.renew_s = renew_s
        self.name = name
        self._renewed = 0.0  # monotonic time of the last successful renewal

    def _body(self, transitions: int, acquired: str | None, resource_version: str | None) -> dict[str, Any]:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if resource_version:
            meta["resourceVersion"] = resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": max(1, round(self.duration_s)),
                "acquireTime": acquired or now,
                "renewTime": now,
                "leaseTransitions": transitions,
            },
        }

    def holds(self) -> bool:
        """True while this replica holds the lease; renews it every ``renew_s`` (one API write)."""
        if self._renewed and time.monotonic() - self._renewed < self.renew_s:
            return True
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
        except Exception as exc:
            if api_status(exc) != 404:
                log.warning("reading the controller lease failed: %s", exc)
                return self._still_valid()
            try:
                self.api.create_namespaced_lease(self.namespace, self._body(0, None, None))
            except Exception as exc2:
                log.info("another operator took the controller lease first: %s", exc2)
                return False
            return self._took()
        spec = lease.spec
        holder = spec.holder_identity or ""
        renewed: datetime | None = spec.renew_time
        duration = spec.lease_duration_seconds or self.duration_s
        expired = renewed is None or datetime.now(UTC) - renewed > timedelta(seconds=duration)
        if holder != self.identity and not expired:
            self._renewed = 0.0
            return False
        transitions = (spec.lease_transitions or 0) + (0 if holder == self.identity else 1)
        acquired = (
            spec.acquire_time.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            if holder == self.identity and spec.acquire_time
            else None
        )
        try:
            self.api.replace_namespaced_lease(
                self.name, self.namespace, self._body(transitions, acquired, lease.metadata.resource_version)
            )
        except Exception as exc:
            log.info("renewing the controller lease failed: %s", exc)
            return self._still_valid() if holder == self.identity else False
        if holder != self.identity:
            log.info("took the controller lease from %r", holder or "nobody")
        return self._took()

    def _took(self) -> bool:
        self._renewed = time.monotonic()
        return True

    def _still_valid(self) -> bool:
        return bool(self._renewed) and time.monotonic() - self._renewed < self.duration_s / 2

    def release(self) -> None:
        self._renewed = 0.0


class EventRecorder:
    """Posts core/v1 Events from a queue, on its own thread."""

    def __init__(self, core: Any, namespace: str, instance: str) -> None:
        self.core = core
        self.namespace = namespace
        self.instance = instance
        self._queue: queue.Queue[tuple[Callable[[], Mapping[str, Any] | None], str, str, bool] | None] = queue.Queue(
            maxsize=10_000
        )
        self._thread = threading.Thread(target=self._run, name="sluice-events", daemon=True)
        self._thread.start()

    def record_later(
        self,
        involved: Callable[[], Mapping[str, Any] | None],
        reason: str,
        message: str,
        warning: bool = False,
    ) -> None:
        """Queue an Event whose object is found by ``involved()`` on the event thread (None: dropped)."""
        try:
            self._queue.put_nowait((involved, reason, message, warning))
        except queue.Full:
            log.warning("event queue full; dropped: %s %s", reason, message)

    def record(self, involved: Mapping[str, Any], reason: str, message: str, warning: bool = False) -> None:
        self.record_later(lambda: involved, reason, message, warning)

    def _event(self, involved: Mapping[str, Any], reason: str, message: str, warning: bool) -> dict[str, Any]:
        now = now_iso()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{involved.get('name', 'sluice')}.", "namespace": self.namespace},
            "involvedObject": dict(involved),
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        return event

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            find, reason, message, warning = item
            try:
                involved = find()
                if involved is not None:
                    self.core.create_namespaced_event(self.namespace, self._event(involved, reason, message, warning))
            except Exception as exc:
                log.warning("posting an event failed: %s", exc)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)


class ResourceIndex:
    """Which Topic or Coordinator object belongs to which Kafka topic: ``(plural, topic) -> (name, uid)``.

    Filled by one LIST of a kind, listed again only when a lookup misses and the last LIST is
    older than ``RELIST_S`` (a Topic created since, or a topic that has none). ``forget`` drops
    an entry a GET found gone or renamed. Thread-safe: the status thread and the event thread share it.
    """

    PLURALS = ("topics", "coordinators")

    def __init__(self, custom: Any, namespace: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.custom = custom
        self.namespace = namespace
        self.clock = clock
        self._lock = threading.Lock()
        self._entries: dict[str, dict[str, tuple[str, str]]] = {p: {} for p in self.PLURALS}
        self._listed_at: dict[str, float] = {}  # plural -> clock of its last LIST
        self.lists = 0  # LISTs made (tests and the simulation count them)

    @staticmethod
    def plural_of(topic: str) -> str:
        return "coordinators" if topic in COORDINATOR_TOPICS.values() else "topics"

    @staticmethod
    def topic_of(plural: str, item: Mapping[str, Any]) -> str:
        if plural == "topics":
            return topic_name(item)
        return COORDINATOR_TOPICS.get(str((item.get("spec") or {}).get("type", "")), "")

    def listed_at(self, plural: str) -> float | None:
        with self._lock:
            return self._listed_at.get(plural)

    def lookup(self, topic: str) -> tuple[str, str] | None:
        """(object name, uid) of ``topic``'s resource; LISTs its kind on a miss (rate-limited)."""
        plural = self.plural_of(topic)
        with self._lock:
            found = self._entries[plural].get(topic)
            listed = self._listed_at.get(plural)
        if found is not None or (listed is not None and self.clock() - listed < RELIST_S):
            return found
        self.relist(plural)
        with self._lock:
            return self._entries[plural].get(topic)

    def relist(self, plural: str) -> None:
        items = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, plural)["items"]
        entries: dict[str, tuple[str, str]] = {}
        for item in items:
            topic = self.topic_of(plural, item)
            if topic and topic not in entries:  # the first one, as the LIST-and-scan lookup chose
                meta = item["metadata"]
                entries[topic] = (str(meta["name"]), str(meta.get("uid", "")))
        with self._lock:
            self._entries[plural] = entries
            self._listed_at[plural] = self.clock()
            self.lists += 1

    def remember(self, topic: str, item: Mapping[str, Any]) -> None:
        """Take ``item`` (just read) as ``topic``'s resource: one deleted and made again has a new uid."""
        meta = item["metadata"]
        with self._lock:
            self._entries[self.plural_of(topic)][topic] = (str(meta["name"]), str(meta.get("uid", "")))

    def forget(self, topic: str) -> None:
        with self._lock:
            self._entries[self.plural_of(topic)].pop(topic, None)


class KubernetesController:
    """Pod watch, controller loop under a lease, events and status projection (module docstring)."""

    def __init__(
        self,
        store: MetadataStore,
        api_client: Any,
        namespace: str,
        *,
        broker_selector: str = DEFAULT_BROKER_SELECTOR,
        grace_s: float = 10.0,
        interval_s: float = 0.1,
        expected_brokers: int = 0,
        identity: str | None = None,
        lease_duration_s: float = 6.0,
        statefulset: str | None = None,
        preferred_leader_delay_s: float = 10.0,
        preferred_leader_hold_s: float = DEFAULT_PREFERRED_LEADER_HOLD_MS / 1000,
        session_timeout_s: float = 0.0,
        health_port: int | None = None,
    ) -> None:
        from kubernetes import client

        self.store = store
        self.api_client = api_client
        self.namespace = namespace
        self.broker_selector = broker_selector
        self.interval_s = interval_s
        self.expected_brokers = expected_brokers
        self.statefulset = statefulset
        self._replicas: tuple[float, int] = (0.0, 0)  # (read at, the StatefulSet's replicas)
        self.identity = identity or f"{socket.gethostname()}-{id(self):x}"
        self.core: Any = client.CoreV1Api(api_client)
        self.custom: Any = client.CustomObjectsApi(api_client)
        self.liveness = PodLiveness(grace_s)
        # With a session timeout, the operator health-checks the brokers itself too (liveness.sessions)
        self._checker: GrpcHealthChecker | None = None
        detector: PodLiveness | SessionLiveness = self.liveness
        if session_timeout_s > 0:
            self._checker = GrpcHealthChecker(int(session_timeout_s * 1000))
            health = FailureDetector(self._checker, int(session_timeout_s * 1000))
            detector = SessionLiveness(self.liveness, health, health_port)
        self.events = EventRecorder(self.core, namespace, self.identity)
        self.elector = LeaseElector(client.CoordinationV1Api(api_client), namespace, self.identity, lease_duration_s)
        self.loop = ControllerLoop(
            store,
            detector,
            on_change=self._on_change,
            on_log_dir=self._on_log_dir,
            on_log_dir_space=self._on_log_dir_space,
            preferred_leader_delay_ms=int(preferred_leader_delay_s * 1000),
            preferred_leader_hold_ms=int(preferred_leader_hold_s * 1000),
        )
        self.leading = threading.Event()
        self.pods_synced = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._published_brokers = -1
        self._holding: set[int] = set()  # brokers scaled away but holding replicas, already reported
        self._replica_counts: tuple[int, Counter[int]] = (-1, Counter())  # (topics' revision, replicas per broker)
        self._projected = WatchedTopics(self.store)  # the topics as the status projection last saw them
        self.resources = ResourceIndex(self.custom, namespace)
        # Changed topics whose status is not projected yet: topic -> (document, when its change was seen).
        self._unprojected: dict[str, tuple[TopicDocument | None, float]] = {}

    # -- life cycle -------------------------------------------------------------------------------

    def start(self) -> None:
        for target, name in (
            (self._watch_pods, "sluice-pod-watch"),
            (self._run_controller_loop, "sluice-controller"),
            (self._watch_liveness, "sluice-liveness"),
            (self._project_statuses, "sluice-status"),
        ):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        self.loop.wake.set()  # a round waiting for its interval sees the stop at once
        for thread in self._threads:
            thread.join(timeout=5)
        if self._checker is not None:
            self._checker.close()
        self.events.close()

    # -- pods -------------------------------------------------------------------------------------

    def _watch_pods(self) -> None:
        from kubernetes import watch as kube_watch

        watch: Any = kube_watch
        resource_version: str | None = None
        known: set[str] = set()
        while not self._stop.is_set():
            try:
                if resource_version is None:
                    listed: Any = self.core.list_namespaced_pod(self.namespace, label_selector=self.broker_selector)
                    names: set[str] = set()
                    for pod in listed.items:
                        raw = self.api_client.sanitize_for_serialization(pod)
                        self.liveness.pod_event("ADDED", raw)
                        names.add(pod.metadata.name)
                    for gone in known - names:
                        self.liveness.pod_event("DELETED", {"metadata": {"name": gone}})
                    known = names
                    resource_version = listed.metadata.resource_version
                    self.pods_synced.set()
                w = watch.Watch()
                for event in w.stream(
                    self.core.list_namespaced_pod,
                    self.namespace,
                    label_selector=self.broker_selector,
                    resource_version=resource_version,
                    timeout_seconds=30,
                    allow_watch_bookmarks=True,
                ):
                    if self._stop.is_set():
                        w.stop()
                        break
                    raw = event.get("raw_object") or {}
                    kind = event.get("type")
                    if kind == "ERROR":
                        resource_version = None
                        break
                    resource_version = (raw.get("metadata") or {}).get("resourceVersion", resource_version)
                    if kind == "BOOKMARK":
                        continue
                    name = (raw.get("metadata") or {}).get("name", "")
                    if kind == "DELETED":
                        known.discard(name)
                    else:
                        known.add(name)
                    broker = self.liveness.pod_event(str(kind), raw)
                    log.debug("pod %s %s (broker %s)", name, kind, broker)
            except Exception as exc:
                if self._stop.is_set():
                    return
                if api_status(exc) == 410:
                    resource_version = None
                log.warning("broker pod watch failed (%s); watching again", exc)
                self._stop.wait(0.5)

    # -- the controller loop ----------------------------------------------------------------------

    def _run_controller_loop(self) -> None:
        """Rounds of the controller loop while this replica holds the Lease (the sluice-controller thread)."""
        self.pods_synced.wait(timeout=30)
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                if self.elector.holds():
                    if not self.leading.is_set():
                        epoch = self.loop.claim()
                        log.info("%s is the active controller (epoch %d)", self.identity, epoch)
                        self.leading.set()
                    self.loop.run_round()
                    self._unregister_scaled_away()
                    self._publish_broker_count()
                elif self.leading.is_set():
                    log.info("%s lost the controller lease", self.identity)
                    self.leading.clear()
            except ControllerFenced as exc:
                log.warning("standing down: %s", exc)
                self.leading.clear()
                self.elector.release()
                self._stop.wait(self.elector.duration_s)
            except Exception:
                log.exception("controller round failed; trying again")
            took = time.monotonic() - started
            if took > 1.0:
                log.warning("a controller round took %.1f s", took)
            self.loop.wait_for_next_round(self.interval_s - took)

    def _watch_liveness(self) -> None:
        """Liveness polled and published between rounds while this replica leads (ControllerLoop.watch_liveness)."""
        self.loop.watch_liveness(self._stop, active=self.leading)

    def expected(self) -> int:
        """The broker count the cluster is meant to have: the configured one, else the StatefulSet's replicas."""
        if self.expected_brokers or not self.statefulset:
            return self.expected_brokers
        read_at, replicas = self._replicas
        if time.monotonic() - read_at > 5.0:
            from kubernetes import client

            try:
                sts: Any = client.AppsV1Api(self.api_client).read_namespaced_stateful_set(
                    self.statefulset, self.namespace
                )
                replicas = int(sts.spec.replicas or 0)
            except Exception as exc:
                log.debug("reading StatefulSet %s failed: %s", self.statefulset, exc)
            self._replicas = (time.monotonic(), replicas)
        return replicas

    def _unregister_scaled_away(self) -> None:
        """Remove the registration of brokers the StatefulSet scaled away, once they hold no replica.

        A broker registers itself at start and nothing removed it: a broker scaled away stayed
        registered and dead for good, counted in the cluster's size (``sluice-cluster``), listed
        dead in the ``controller`` document and checked by the operator forever. So, as Kafka's
        UnregisterBroker, the operator removes ``brokers/<id>`` (and its ``isr_requests/<id>``) of a
        broker whose ordinal is at or above the StatefulSet's replicas and whose Pod is gone. One
        that still holds replicas is kept (their partitions still name it): the operator says so
        (a Warning Event on the StatefulSet, once) and removes it once a ``remove-brokers``
        rebalance has moved them. A broker that comes back (scaled up again) registers itself again.
        Only with a StatefulSet to read (the chart's ``SLUICE_BROKER_STATEFULSET``)."""
        if not self.statefulset or self.expected_brokers or not self.pods_synced.is_set():
            return
        replicas = self.expected()
        if replicas <= 0:
            return  # not read (yet), or scaled to nothing: the whole cluster is down, nobody to remove
        pods = self.liveness.pods()
        gone = sorted(b for b in self.loop.brokers if b >= replicas and b not in pods)
        self._holding = {b for b in self._holding if b in gone}
        if not gone:
            return
        revision = self.loop.topics.revision
        if self._replica_counts[0] != revision:  # counted again only when a topic changed (300,000 replicas)
            view = self.loop.topics.view
            counts = Counter(b for t in view.topics().values() for p in t.partitions for b in p.replicas)
            self._replica_counts = (revision, counts)
        held = self._replica_counts[1]
        sts = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": self.statefulset, "namespace": self.namespace}
        for broker_id in gone:
            if held[broker_id]:
                if broker_id not in self._holding:
                    self._holding.add(broker_id)
                    message = (
                        f"broker {broker_id} was scaled away (StatefulSet replicas {replicas}) but still holds "
                        f"{held[broker_id]} replica(s): kept registered until a remove-brokers rebalance moves them"
                    )
                    log.warning("%s", message)
                    self.events.record(sts, "BrokerHoldsReplicas", message, warning=True)
                continue
            listed = self.loop.registration(broker_id)  # the registration this was decided on
            if listed is None or broker_id in self.liveness.pods():
                continue
            try:
                # with the version the round listed: a broker that registered again since (scaled up
                # again, its Pod back) keeps its new registration
                self.store.delete(listed.key, listed.version)
            except VersionConflict:
                continue
            requests = self.store.get(keys.isr_requests(broker_id))
            if requests is not None:
                with contextlib.suppress(VersionConflict):  # written meanwhile: a broker that is back
                    self.store.delete(requests.key, requests.version)
            message = (
                f"broker {broker_id} was scaled away (StatefulSet replicas {replicas}) and holds nothing: unregistered"
            )
            log.info("%s", message)
            self.events.record(sts, "BrokerUnregistered", message)

    def _publish_broker_count(self) -> None:
        count = max(len(self.loop.brokers), self.expected())  # read by the round just run
        if count == self._published_brokers:
            return
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": CLUSTER_CONFIGMAP,
                "namespace": self.namespace,
                "labels": {"app.kubernetes.io/part-of": "sluice", "app.kubernetes.io/managed-by": COMPONENT},
            },
            "data": {"brokers": str(count)},
        }
        try:
            self.core.patch_namespaced_config_map(CLUSTER_CONFIGMAP, self.namespace, {"data": body["data"]})
        except Exception as exc:
            if api_status(exc) != 404:
                raise
            self.core.create_namespaced_config_map(self.namespace, body)
        self._published_brokers = count
        log.info("the cluster has %d broker(s) (ConfigMap %s)", count, CLUSTER_CONFIGMAP)

    # -- events -----------------------------------------------------------------------------------

    def owner_of(self, topic: str) -> dict[str, Any] | None:
        """The resource a topic belongs to, as an involvedObject: its Topic, or its Coordinator."""
        plural = ResourceIndex.plural_of(topic)
        try:
            found = self.resources.lookup(topic)
        except Exception as exc:
            log.debug("listing %s failed: %s", plural, exc)
            return None
        if found is None:
            return None
        name, uid = found
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Topic" if plural == "topics" else "Coordinator",
            "name": name,
            "namespace": self.namespace,
            "uid": uid,
        }

    def _on_change(
        self, key: str, old: TopicDocument, new: TopicDocument, live: frozenset[int], dead: frozenset[int]
    ) -> None:
        """Queue the Event for one rewritten topic document (resolved and posted by the event thread)."""
        lines = describe_changes(old, new, live, dead)
        if not lines or not key.startswith(keys.TOPICS):
            return
        leaderless = any(p.leader < 0 for p in new.partitions)
        moved = any(a.leader != b.leader for a, b in zip(old.partitions, new.partitions, strict=False))
        reason = "LeaderNotAvailable" if leaderless else ("LeaderElected" if moved else "IsrShrunk")
        topic = key[len(keys.TOPICS) :]
        leaders = [p.leader for p in new.partitions]
        self.events.record_later(lambda: self._involved(topic, leaders), reason, "; ".join(lines), leaderless)

    def _on_log_dir(self, broker_id: int, failure: str) -> None:
        """Queue the Event for a broker whose log directory went offline (``failure``) or came back ("")."""
        if failure:
            reason, warning = "LogDirOffline", True
            message = f"broker {broker_id}'s log directory is offline ({failure}); its partitions move elsewhere"
        else:
            reason, warning = "LogDirOnline", False
            message = f"broker {broker_id}'s log directory is back online"
        self.events.record_later(lambda: self._broker_pod(broker_id), reason, message, warning)

    def _on_log_dir_space(self, broker_id: int, low: bool, free: int, size: int) -> None:
        """Queue the Event for a broker whose data volume runs low on space (or has space again)."""
        if low:
            mib = 1024 * 1024
            free_mib, size_mib = free / mib, size / mib
            reason = "LogDirLowSpace"
            message = f"broker {broker_id}'s data volume is low on space: {free_mib:.1f} MiB free of {size_mib:.1f} MiB"
        else:
            reason, message = "LogDirSpaceOk", f"broker {broker_id}'s data volume has space again"
        self.events.record_later(lambda: self._broker_pod(broker_id), reason, message, low)

    def _broker_pod(self, broker_id: int) -> dict[str, Any] | None:
        pod = self.liveness.pods().get(broker_id)
        if pod is None:
            return None
        return {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "namespace": self.namespace}

    def _involved(self, topic: str, leaders: list[int]) -> dict[str, Any] | None:
        """What an Event about ``topic`` is attached to: its Topic or Coordinator, else a leader's Pod."""
        involved = self.owner_of(topic)
        if involved is not None:
            return involved
        pods = self.liveness.pods()
        target = next((pods[b].name for b in leaders if b in pods), None)
        if target is None:
            return None
        return {"apiVersion": "v1", "kind": "Pod", "name": target, "namespace": self.namespace}

    # -- status projection ------------------------------------------------------------------------

    def _project_statuses(self) -> None:
        """Status projection while this replica leads (the sluice-status thread)."""
        while not self._stop.is_set():
            try:
                if self.leading.is_set():
                    self.project_once()
            except Exception:
                log.exception("updating resource statuses failed; trying again")
            self._stop.wait(0.2)

    def project_once(self) -> int:
        """Patch the status of every Topic/Coordinator whose document changed; returns how many.

        Each changed topic's resource is found in the :class:`ResourceIndex`, read by name and
        patched when its status would change. A topic whose resource the index does not know
        yet waits (at most ``RELIST_S``) for the next LIST; one that a LIST made after its
        change still does not show has no resource, and is dropped.
        """
        changed = self._projected.catch_up()
        if changed:
            seen = self.resources.clock()
            # The newest state of each changed topic (None: deleted), composed with its records.
            for topic in changed:
                self._unprojected[topic] = (self._projected.view.topic(topic), seen)
        patched = 0
        for topic, (doc, seen) in sorted(self._unprojected.items()):
            if doc is None:
                del self._unprojected[topic]
                continue
            plural = ResourceIndex.plural_of(topic)
            found = self.resources.lookup(topic)
            if found is None:
                listed = self.resources.listed_at(plural)
                if listed is not None and listed >= seen:
                    del self._unprojected[topic]  # no resource for it (a topic made through the admin API)
                continue
            try:
                item = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, plural, found[0])
            except Exception as exc:
                if api_status(exc) != 404:
                    raise
                item = None
            if item is None or ResourceIndex.topic_of(plural, item) != topic:
                self.resources.forget(topic)  # deleted or renamed meanwhile: found again by the next LIST
                continue
            self.resources.remember(topic, item)
            if plural == "topics":
                patched += self._patch_status(plural, item, topic_status_patch(item, doc))
            else:
                patched += self._patch_status(plural, item, coordinator_status_patch(item, doc))
            del self._unprojected[topic]
        return patched

    def _patch_status(self, plural: str, item: Mapping[str, Any], status: dict[str, Any]) -> int:
        current = item.get("status") or {}
        if "observedGeneration" not in current:
            return 0  # not reconciled yet: its handler writes the first whole status
        if all(current.get(k) == v for k, v in status.items()):
            return 0  # already so: a patch would write the object (and wake its watchers) for nothing
        try:
            self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, self.namespace, plural, item["metadata"]["name"], {"status": status}
            )
        except Exception as exc:
            if api_status(exc) == 404:
                return 0  # deleted meanwhile
            raise
        return 1


def topic_status_patch(item: Mapping[str, Any], doc: TopicDocument) -> dict[str, Any]:
    """The part of a Topic's status that follows its document (partitions, topic id, Ready)."""
    status = item.get("status") or {}
    return {
        "topicName": doc.name or topic_name(item),
        "topicId": doc.topic_id,
        "partitions": partition_rows(doc),
        "conditions": leadership_condition(
            status.get("conditions"), doc, status.get("observedGeneration"), f"topic {doc.name}"
        ),
    }


def coordinator_status_patch(item: Mapping[str, Any], doc: TopicDocument) -> dict[str, Any]:
    """The part of a Coordinator's status that follows its internal topic's document."""
    status = item.get("status") or {}
    return {
        "topicName": doc.name,
        "partitions": coordinator_rows(doc),
        "conditions": leadership_condition(
            status.get("conditions"), doc, status.get("observedGeneration"), f"coordinator topic {doc.name}"
        ),
    }
