"""Cluster metadata at scale: a simulation against a real kube-apiserver and etcd (issue 28, part 1).

What runs, in this one process unless said otherwise:

* **The control plane** (separate processes): the kube-apiserver and etcd the Kubernetes tests
  start (:class:`tests.support.k8s_env.TestControlPlane`), with etcd's fsync ON
  (``etcd_fsync=True``), so write latencies and the database size are what a disk gives. The
  project's CRDs are installed as the tests install them (:func:`tests.k8s.crds.install_crds`).
* **The real controller**: :class:`sluice.operator.controller.kubernetes.KubernetesController`, the
  operator's controller threads as they run in a cluster: the broker Pod watch feeding
  :class:`~sluice.operator.liveness.pods.PodLiveness`, the controller loop under the
  ``sluice-controller`` Lease (elections, ISR fencing, preferred leaders), the Events it posts
  (with their owner lookup) and the Topic status projection. Its store is a real
  :class:`~sluice.metadata.kubernetes.KubernetesMetadataStore` wrapped in :class:`CountingStore`.
  The Kopf resource handlers are not run: they are not on the failover path.
* **N simulated brokers**. Each has a Pod object (``sluice-broker-<id>``, the StatefulSet's naming,
  so the controller's Pod liveness maps it to the broker id) whose Ready condition the simulation
  sets as the kubelet would from the readiness probe, and registers with a real
  :class:`~sluice.broker.cluster.ClusterView` (``register()``: the ``cluster`` and ``brokers/<id>``
  documents). Each holds one watch stream (:class:`Watcher`) on every ``MetadataDocument``, exactly
  the request a broker's store makes (LIST, then WATCH from its resourceVersion with bookmarks,
  renewed every 30 s), counting bytes and events and time-stamping when it applied each change.
  ISR changes are what a real leader does (``--isr-path``): by default, as brokers do when the
  controller takes requests, ``ClusterView.request_isrs``, one write of the leader's own
  ``isr_requests/<id>`` document with all it asks, which the real controller decides and writes
  into the topic documents, every leader's changes to a topic in one write; with ``direct``, as
  before, ``ClusterView.write_isrs`` (a quorum GET of the whole topic document, then a replace
  carrying its resourceVersion with all of the leader's changes to that topic, up to 20 tries, a
  short random pause after each conflict).
* **Where partition states go** (``--partition-state``): by default the simulated brokers register
  as brokers of this code do (``metadata_features``), so the controller opens the gate and every
  state change is a ``partition_changes/<seq>`` record (a failover: one record), the watches leave
  the folded ``topic_states/`` out as the brokers' stores do, and the watchers decode records; with
  ``documents`` they register as brokers from before, and states stay in whole topic documents.
  The harness's own view of the topics is a :class:`~sluice.metadata.topic_view.WatchedTopics`
  over its uncounted store; "the final state" a watcher must have applied is every topic document
  and record there is once the scenario's condition holds.
* **A few real ClusterViews** (``--observers``, default 2): complete broker views, each over its
  own KubernetesMetadataStore (its own watch cache), refreshed every 100 ms as a broker's metadata
  poller does; the time a change reaches them is the end-to-end figure, including the decode of
  every document into :class:`~sluice.metadata.documents.TopicDocument`.

Applying an event: one process cannot decode 100 brokers' streams in parallel as 100 machines
would, so a watcher time-stamps an event when its last byte arrives, and adds the CPU time one
decode of that event takes (``json.loads`` of the event and of the document, then
``TopicDocument.from_json``), measured once per distinct event (:class:`Decoder`). "Applied at"
is then what a broker with a core of its own would see. The observers' figures have no such
model: they decode for real.

Scenarios (``--scenarios``):

* ``steady``: ISR shrink/expand at each ``--churn-rates`` value (changes/s) for ``--churn-seconds``,
  each change by the partition's leader through ``write_isr``;
* ``kill``, ``hang``, ``lost``: one broker fails (each scenario a broker of its own), its watch
  stream cut. The controller health-checks every broker itself, as the operator does
  (``--session-timeout``, 9 s by default: :mod:`sluice.operator.liveness.sessions`), so each
  simulated broker serves the gRPC health service on 127.0.0.1 and registers that address; a
  crash stops its server, a hang accepts checks and never answers, a lost node has every packet to
  its port dropped by iptables (:mod:`bench.metadata_faults`), and the Pod stays Ready in all
  three (the kubelet's probe would turn it NotReady 15 s after a crash or a hang, after the health
  checks' verdict; a lost node's kubelet reports nothing). With ``--session-timeout 0`` (the
  Pods' verdicts only), ``kill`` turns the Pod NotReady at once instead, which the kubelet does
  only after ``failureThreshold`` failed probes (15 s with the chart's defaults, on top of the
  detection figure, which is then the operator's grace period plus a controller round);
* ``return``: after each failure, that broker comes back (its health service answers again): it
  registers again, relists, its Pod turns Ready, every leader of a partition it replicates adds it
  back to the ISR (each leader one write per topic document with all its partitions of that
  topic, all leaders at once, as their followers catch up), and the controller hands preferred
  leaderships back after ``--preferred-delay``.
* ``rolling`` (not in the default set: minutes): a rolling restart of ``--rolling-brokers``
  brokers, one after the other as a StatefulSet does it: the broker answers NOT_SERVING and its
  Pod is deleted (the operator takes either as dead at once: the controlled shutdown), then the
  broker returns as above.

By default the brokers authenticate as the control plane's admin (``system:masters``), which API
Priority and Fairness exempts; ``--as-service-account`` makes them one ServiceAccount allowed
MetadataDocuments only, as a chart's brokers are, so APF puts them in ``workload-low``.

Measured per scenario: API-server requests by verb and code (``apiserver_request_total`` deltas,
409 conflicts), the store calls and bytes of the simulated brokers and of the controller (by
:class:`CountingStore`), write latency p50/p99 (client side, and the API server's histogram), API
Priority and Fairness rejections (``apiserver_flowcontrol_rejected_requests_total``), etcd's
database size (``etcd_mvcc_db_total_size_in_bytes``), watch bytes and events per broker, and for
the failover: detection (failure -> the ``controller`` document names the broker dead, as the
observers see it) and completion (failure -> the last watcher has applied the final state of every
topic document).

Results: ``bench/results/metadata-scale.json`` (every run, keyed by broker count: a run replaces
its own entry and keeps the others), ``metadata-scale.md`` (tables) and ``metadata-scale.png``
(the curves over broker counts; matplotlib from the ``bench`` extra, skipped when absent).

The issue's 10,000 TransactionalIds scenario is :mod:`bench.txnids_scale` (``python
bench/txnids_scale.py --ids 10000``): the operator's TransactionalId timers are Kopf handlers that ask
real brokers for DescribeTransactions, so it runs the real operator and three real brokers.

Every wait here is bounded in time and every loop in count; the control plane is stopped at the
end, whatever happens.
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import dataclasses
import json
import math
import os
import random
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":
    # Run as a file, Python puts bench/ first on the path; import bench.* and tests.* from the root.
    sys.path[0] = str(ROOT)

from bench.metadata_faults import HealthServers, PortDrops  # noqa: E402
from sluice.broker.cluster import ClusterView  # noqa: E402
from sluice.broker.config import BrokerConfig  # noqa: E402
from sluice.metadata import keys  # noqa: E402
from sluice.metadata.documents import (  # noqa: E402
    BrokerDocument,
    ControllerDocument,
    IsrRequest,
    PartitionChangesDocument,
    TopicDocument,
)
from sluice.metadata.isr import IsrChange, IsrOutcome  # noqa: E402
from sluice.metadata.kubernetes import (  # noqa: E402
    GROUP,
    PLURAL,
    VERSION,
    WATCH_SELECTOR,
    KubernetesMetadataStore,
    api_client,
)
from sluice.metadata.store import Document, MetadataStore, StoreUnavailable, VersionConflict  # noqa: E402
from sluice.metadata.topic_view import WatchedTopics  # noqa: E402

RESULTS = ROOT / "bench" / "results"
BROKER_LABELS = {"app.kubernetes.io/name": "sluice", "app.kubernetes.io/component": "broker"}
WATCH_TIMEOUT_S = 30  # as sluice.metadata.kubernetes: one watch request, then renewed
PROBE_DETECTION_S = 5 * 3  # the chart's readinessProbe: periodSeconds 5 x failureThreshold 3
WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE")  # apiserver_request_total's verbs that write
SYNC_WAIT_S = 600  # every watch stream's first LIST decoded (bounded)
MAX_LOG = 2_000_000  # applied-change records kept per watcher (bounded memory)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- counting ----------------------------------------------------------------------------------


@dataclass
class StoreCounts:
    """Store calls, conflicts, bytes and latencies seen by a :class:`CountingStore` (a window of them)."""

    calls: Counter[str] = field(default_factory=Counter)
    conflicts: int = 0
    noop_writes: int = 0  # replaces the API server answered without a change (same resourceVersion)
    unavailable: int = 0
    bytes_written: int = 0
    write_latencies: list[float] = field(default_factory=list)

    @property
    def writes(self) -> int:
        return self.calls["create"] + self.calls["replace"] + self.calls["delete"]

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.write_latencies)
        return {
            "calls": dict(sorted(self.calls.items())),
            "writes": self.writes,
            "conflicts": self.conflicts,
            "noop_writes": self.noop_writes,
            "unavailable": self.unavailable,
            "bytes_written": self.bytes_written,
            "write_p50_ms": round(percentile(lat, 50) * 1000, 2),
            "write_p99_ms": round(percentile(lat, 99) * 1000, 2),
        }


class CountingStore:
    """A MetadataStore that passes every call on and counts it: calls by kind, 409s, bytes, latency.

    ``on_changes`` (optional) hears every batch ``changes_since`` returns, which is how an observer
    ClusterView's applied changes are time-stamped. ``take()`` returns the counts since the last
    ``take()`` and starts a new window. Thread-safe.
    """

    def __init__(self, inner: MetadataStore, on_changes: Callable[[list[Document]], None] | None = None) -> None:
        self.inner = inner
        self.on_changes = on_changes
        self._lock = threading.Lock()
        self._counts = StoreCounts()

    def take(self) -> StoreCounts:
        with self._lock:
            counts, self._counts = self._counts, StoreCounts()
        return counts

    def _count(self, kind: str, started: float, *, written: int = 0, conflict: bool = False) -> None:
        with self._lock:
            self._counts.calls[kind] += 1
            self._counts.conflicts += conflict
            self._counts.bytes_written += written
            if kind in ("create", "replace", "delete"):
                self._counts.write_latencies.append(time.monotonic() - started)

    def _unavailable(self) -> None:
        with self._lock:
            self._counts.unavailable += 1

    def get(self, key: str) -> Document | None:
        started = time.monotonic()
        try:
            return self.inner.get(key)
        except StoreUnavailable:
            self._unavailable()
            raise
        finally:
            self._count("get", started)

    def list(self, prefix: str) -> builtins.list[Document]:
        started = time.monotonic()
        try:
            return self.inner.list(prefix)
        finally:
            self._count("list", started)

    def compare_and_set(self, key: str, value: dict[str, Any], expected_version: int | None) -> Document:
        started = time.monotonic()
        kind = "create" if expected_version is None else "replace"
        size = len(json.dumps(value, sort_keys=True))
        try:
            doc = self.inner.compare_and_set(key, value, expected_version)
        except VersionConflict:
            self._count(kind, started, written=size, conflict=True)
            raise
        except StoreUnavailable:
            self._unavailable()
            raise
        self._count(kind, started, written=size)
        if expected_version is not None and doc.version == expected_version:
            with self._lock:
                self._counts.noop_writes += 1
        return doc

    def delete(self, key: str, expected_version: int) -> None:
        started = time.monotonic()
        try:
            self.inner.delete(key, expected_version)
        except VersionConflict:
            self._count("delete", started, conflict=True)
            raise
        self._count("delete", started)

    def changes_since(self, revision: int, prefix: str = "") -> builtins.list[Document]:
        docs = self.inner.changes_since(revision, prefix)
        if self.on_changes is not None and docs:
            self.on_changes(docs)
        return docs

    def close(self) -> None:
        self.inner.close()


def percentile(sorted_values: list[float], pct: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, math.ceil(pct / 100 * len(sorted_values)) - 1))
    return sorted_values[index]


# -- watch streams -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Decoded:
    kind: str  # ADDED, MODIFIED, DELETED, BOOKMARK, ERROR
    key: str
    revision: int
    cost_s: float  # CPU time of one full decode of this event
    dead: tuple[int, ...] = ()  # the controller document's dead brokers (key "controller" only)


class Decoder:
    """Decodes each distinct watch event once and remembers its cost (see the module docstring)."""

    def __init__(self, max_entries: int = 20_000) -> None:
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._memo: dict[bytes, Decoded] = {}

    def decode(self, line: bytes) -> Decoded:
        with self._lock:
            known = self._memo.get(line)
        if known is not None:
            return known
        started = time.thread_time()
        event = json.loads(line)
        obj = event.get("object") or {}
        kind = str(event.get("type"))
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        key = str(spec.get("key", ""))
        dead: tuple[int, ...] = ()
        if kind in ("ADDED", "MODIFIED") and "value" in spec:
            value = json.loads(spec["value"])
            if not decode_topic_metadata(key, value) and key == keys.CONTROLLER:
                dead = tuple(ControllerDocument.from_json(value).dead_brokers)
        rv = int(meta.get("resourceVersion") or 0)
        decoded = Decoded(kind, key, rv, time.thread_time() - started, dead)
        with self._lock:
            if len(self._memo) >= self.max_entries:
                self._memo.clear()
            self._memo[line] = decoded
        return decoded

    def clear(self) -> None:
        with self._lock:
            self._memo.clear()


def decode_topic_metadata(key: str, value: Any) -> bool:
    """Decode a topic document or partition change record as a broker does (its CPU is what a watcher
    pays); False for any other key."""
    if key.startswith(keys.TOPICS):
        TopicDocument.from_json(value)
    elif key.startswith(keys.PARTITION_CHANGES):
        PartitionChangesDocument.from_json(value)
    else:
        return False
    return True


class Watcher:
    """One simulated broker's watch on every MetadataDocument, as its KubernetesMetadataStore holds it.

    Counts bytes and events (LIST included), and logs ``(key, revision, applied_at)`` for every
    change; ``applied_at`` is the arrival of the event's last byte plus one decode's CPU time.
    """

    def __init__(self, name: str, kubeconfig: Path, namespace: str, decoder: Decoder, deadline: float) -> None:
        self.name = name
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.decoder = decoder
        self.deadline = deadline
        self.bytes = 0
        self.events = 0
        self.lists = 0
        self.decode_s = 0.0
        self.applied: list[tuple[str, int, float]] = []
        self.dead_seen: list[tuple[tuple[int, ...], float]] = []  # (dead brokers, applied at)
        self.synced = threading.Event()
        self._stop = threading.Event()
        self._response: Any = None
        self._thread = threading.Thread(target=self._run, name=f"watch-{name}", daemon=True)

    def start(self) -> Watcher:
        self._thread.start()
        return self

    def counters(self) -> tuple[int, int, float]:
        return self.bytes, self.events, self.decode_s

    def _run(self) -> None:
        from kubernetes import client

        api: Any = client.CustomObjectsApi(api_client(str(self.kubeconfig)))
        revision: str | None = None
        for _attempt in range(10_000):  # bounded: each pass is one watch request of up to 30 s
            if self._stop.is_set() or time.monotonic() > self.deadline:
                break
            try:
                if revision is None:
                    revision = self._list(api)
                response: Any = api.list_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    self.namespace,
                    PLURAL,
                    watch=True,
                    label_selector=WATCH_SELECTOR,
                    resource_version=revision,
                    allow_watch_bookmarks=True,
                    timeout_seconds=WATCH_TIMEOUT_S,
                    _preload_content=False,
                    _request_timeout=(10, WATCH_TIMEOUT_S + 10),
                )
                self._response = response
                revision = self._stream(response, revision)
                response.release_conn()
            except Exception as exc:
                if self._stop.is_set():
                    break
                if getattr(exc, "status", None) == 410:
                    revision = None
                self._stop.wait(0.2)
        api.api_client.close()

    def _list(self, api: Any) -> str:
        response: Any = api.list_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            PLURAL,
            label_selector=WATCH_SELECTOR,
            _preload_content=False,
            _request_timeout=(10, 60),
        )
        body = response.data
        self.bytes += len(body)
        self.lists += 1
        started = time.thread_time()
        listed = json.loads(body)
        at = time.monotonic()
        for item in listed.get("items", []):
            spec = item.get("spec") or {}
            key = str(spec.get("key", ""))
            if len(self.applied) < MAX_LOG:  # what the LIST holds is applied too (a document never rewritten since)
                self.applied.append((key, int(item["metadata"]["resourceVersion"]), at))
            if key.startswith((keys.TOPICS, keys.PARTITION_CHANGES)):
                decode_topic_metadata(key, json.loads(spec["value"]))
        self.decode_s += time.thread_time() - started
        self.synced.set()
        return str(listed["metadata"]["resourceVersion"])

    def _stream(self, response: Any, revision: str | None) -> str | None:
        buffer = b""
        for chunk in response.stream(65536, decode_content=True):
            arrived = time.monotonic()
            self.bytes += len(chunk)
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if not line.strip():
                    continue
                event = self.decoder.decode(line)
                if event.kind == "ERROR":
                    return None  # 410 Gone: relist
                revision = str(event.revision)
                if event.kind == "BOOKMARK":
                    continue
                self.events += 1
                self.decode_s += event.cost_s
                if len(self.applied) < MAX_LOG:
                    self.applied.append((event.key, event.revision, arrived + event.cost_s))
                if event.dead and len(self.dead_seen) < MAX_LOG:
                    self.dead_seen.append((event.dead, arrived + event.cost_s))
            if self._stop.is_set():
                break
        return revision

    def stop(self) -> None:
        """Cut the stream at once (a crash), and wait (bounded) for the thread."""
        self._stop.set()
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):
                response.shutdown() if hasattr(response, "shutdown") else response.close()
        self._thread.join(timeout=5)

    def applied_at(self, wanted: dict[str, int], since: float) -> float | None:
        """When this watcher had applied every ``key -> revision`` of ``wanted`` (None: not all)."""
        return applied_at(self.applied, wanted, since)


def applied_at(applied: list[tuple[str, int, float]], wanted: dict[str, int], since: float) -> float | None:
    """The time every ``key -> revision`` of ``wanted`` was applied, by a log of ``(key, revision, at)``;
    a document applied before ``since`` counts as applied at ``since``; None when one never was."""
    first: dict[str, float] = {}
    for key, revision, at in applied:
        if key in wanted and revision >= wanted[key] and key not in first:
            first[key] = max(at, since)
    if len(first) < len(wanted):
        return None
    return max(first.values(), default=since)


class Observer:
    """A real ClusterView over its own store and watch cache, refreshed every 100 ms (a broker's poller)."""

    def __init__(self, name: str, url: str, config: BrokerConfig, deadline: float) -> None:
        self.name = name
        self.deadline = deadline
        self._pending: list[Document] = []
        self.store = CountingStore(KubernetesMetadataStore.from_url(url), on_changes=self._pending.extend)
        self.view = ClusterView(self.store, config)
        self.applied: list[tuple[str, int, float]] = []
        self.refresh_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"observer-{name}", daemon=True)

    def start(self) -> Observer:
        self._thread.start()
        return self

    def _run(self) -> None:
        for _ in range(10_000_000):
            if self._stop.wait(0.1) or time.monotonic() > self.deadline:
                return
            started = time.thread_time()
            with contextlib.suppress(StoreUnavailable):
                self.view.refresh()
            self.refresh_s += time.thread_time() - started
            now = time.monotonic()
            if len(self.applied) < MAX_LOG:
                self.applied.extend((d.key, d.revision, now) for d in self._pending)
            self._pending.clear()

    def applied_at(self, wanted: dict[str, int], since: float) -> float | None:
        return applied_at(self.applied, wanted, since)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.store.close()


# -- metrics -----------------------------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str, names: Iterable[str]) -> list[tuple[str, dict[str, str], float]]:
    """The samples of ``names`` in Prometheus text format: (name, labels, value)."""
    wanted = set(names)
    out = []
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _SAMPLE.match(line)
        if m is None or m.group(1) not in wanted:
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        with contextlib.suppress(ValueError):
            out.append((m.group(1), labels, float(m.group(3))))
    return out


@dataclass
class ServerMetrics:
    """What the API server's and etcd's /metrics say at one moment (the parts used here)."""

    requests: Counter[tuple[str, str, str]]  # (verb, resource, code) -> count
    apf_rejected: float
    put_buckets: dict[float, float]  # PUT metadatadocuments duration histogram: le -> count
    etcd_db_bytes: float
    etcd_db_in_use_bytes: float
    etcd_fsyncs: float

    def minus(self, before: ServerMetrics) -> dict[str, Any]:
        delta = self.requests - before.requests
        by_verb: Counter[str] = Counter()
        md: Counter[str] = Counter()
        for (verb, resource, code), n in delta.items():
            by_verb[f"{verb} {resource}"] += int(n)
            if resource == PLURAL:
                md[f"{verb} {code}"] += int(n)
        buckets = {le: n - before.put_buckets.get(le, 0.0) for le, n in self.put_buckets.items()}
        return {
            "requests_by_verb_resource": dict(by_verb.most_common()),
            "metadatadocuments_by_verb_code": dict(sorted(md.items())),
            "conflicts_409": sum(int(n) for (_v, _r, code), n in delta.items() if code == "409"),
            "apf_rejected": self.apf_rejected - before.apf_rejected,
            "server_put_p99_ms": round(histogram_quantile(buckets, 0.99) * 1000, 1),
            "etcd_db_bytes": int(self.etcd_db_bytes),
            "etcd_db_in_use_bytes": int(self.etcd_db_in_use_bytes),
            "etcd_fsyncs": int(self.etcd_fsyncs - before.etcd_fsyncs),
        }


def histogram_quantile(buckets: dict[float, float], q: float) -> float:
    """The upper bound of the bucket holding quantile ``q`` (coarse, as Prometheus' buckets are)."""
    ordered = sorted(buckets.items())
    total = ordered[-1][1] if ordered else 0.0
    if total <= 0:
        return 0.0
    for le, count in ordered:
        if count >= q * total:
            return le if math.isfinite(le) else ordered[-2][0] if len(ordered) > 1 else 0.0
    return 0.0


def scrape(plane: Any) -> ServerMetrics:
    api_text = plane.kubectl("get", "--raw", "/metrics", timeout=60.0).stdout
    requests: Counter[tuple[str, str, str]] = Counter()
    rejected = 0.0
    put: dict[float, float] = {}
    for name, labels, value in parse_metrics(
        api_text,
        (
            "apiserver_request_total",
            "apiserver_flowcontrol_rejected_requests_total",
            "apiserver_request_duration_seconds_bucket",
        ),
    ):
        if name == "apiserver_request_total":
            requests[(labels.get("verb", ""), labels.get("resource", ""), labels.get("code", ""))] += int(value)
        elif name == "apiserver_flowcontrol_rejected_requests_total":
            rejected += value
        elif labels.get("verb") == "PUT" and labels.get("resource") == PLURAL:
            le = float(labels.get("le", "inf").replace("+Inf", "inf"))
            put[le] = put.get(le, 0.0) + value
    etcd_text = ""
    if getattr(plane, "etcd_url", ""):  # an external cluster (SLUICE_TEST_KUBECONFIG) has no etcd of ours
        with urllib.request.urlopen(f"{plane.etcd_url}/metrics", timeout=10) as resp:
            etcd_text = resp.read().decode()
    etcd = {
        name: value
        for name, _labels, value in parse_metrics(
            etcd_text,
            (
                "etcd_mvcc_db_total_size_in_bytes",
                "etcd_mvcc_db_total_size_in_use_in_bytes",
                "etcd_disk_wal_fsync_duration_seconds_count",
            ),
        )
    }
    return ServerMetrics(
        requests,
        rejected,
        put,
        etcd.get("etcd_mvcc_db_total_size_in_bytes", 0.0),
        etcd.get("etcd_mvcc_db_total_size_in_use_in_bytes", 0.0),
        etcd.get("etcd_disk_wal_fsync_duration_seconds_count", 0.0),
    )


# -- the simulation ----------------------------------------------------------------------------


@dataclass
class Settings:
    brokers: int
    topics: int
    partitions: int
    replication_factor: int
    churn_rates: list[float]
    churn_seconds: float
    observers: int
    grace_s: float
    preferred_delay_s: float
    scenarios: list[str]
    budget_s: float
    rolling_brokers: int = 10
    # the brokers (watch streams, their stores, the observers) act as one ServiceAccount, as a chart's
    # brokers do, so API Priority and Fairness puts them in workload-low; else as system:masters (exempt)
    service_account: bool = False
    # how leaders change ISRs: "requests" to the controller (isr_requests/<id>, what brokers do when the
    # controller takes them), or "direct" writes of the topic documents (brokers before, or without it)
    isr_path: str = "requests"
    # where partition states go: "records" (partition change records, what brokers of this code
    # register for), or "documents" (the whole topic documents: brokers register without it)
    partition_state: str = "records"
    # the operator's own health checks (liveness.sessions): a broker without a SERVING answer this long
    # is dead, its Pod Ready or not (the operator's default, 9 s); 0: the Pods' verdicts only
    session_timeout_s: float = 9.0


@dataclass
class SimBroker:
    broker_id: int
    view: ClusterView  # for register() and write_isrs(); its store is the brokers' shared CountingStore
    watcher: Watcher | None = None
    alive: bool = True
    # ISR requests this leader has outstanding, by (topic, partition): its isr_requests document holds
    # them all, as a broker's does (sluice.broker.replica_manager)
    asked: dict[tuple[str, int], IsrRequest] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ask(self, changes: dict[str, tuple[TopicDocument, list[tuple[int, list[int]]]]]) -> None:
        """Ask the controller for ``changes`` (by topic: its document, and (partition, new ISR) pairs)
        in one write, with what is still outstanding (requests the documents show decided, by a moved
        partition epoch, are dropped), as a broker's ISR round does."""
        with self.lock:
            for (t, i), r in list(self.asked.items()):
                seen = changes.get(t)
                if (
                    seen is not None
                    and i < len(seen[0].partitions)
                    and seen[0].partitions[i].partition_epoch != r.partition_epoch
                ):
                    del self.asked[(t, i)]
            for name, (topic, wanted) in changes.items():
                for i, isr in wanted:
                    p = topic.partitions[i]
                    self.asked[(name, i)] = IsrRequest(
                        name, topic.topic_id, i, p.leader_epoch, p.partition_epoch, list(p.isr), list(isr)
                    )
            self.view.request_isrs(list(self.asked.values()))


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / interval) + 2):
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
    return predicate()


class Simulation:
    """The control plane, the controller, N simulated brokers and the observers (module docstring)."""

    def __init__(self, settings: Settings, workdir: Path, plane: Any = None) -> None:
        """``plane``: a running control plane to use (a test's; left running at the end), else one is
        started (etcd fsync on) and stopped by :meth:`close`."""
        self.s = settings
        self.workdir = workdir
        self.deadline = time.monotonic() + settings.budget_s
        self.decoder = Decoder()
        self.plane: Any = plane
        self._own_plane = plane is None
        self.namespace = ""
        self.url = ""
        self.controller: Any = None
        self.controller_store: CountingStore | None = None
        self.broker_store: CountingStore | None = None
        self.brokers: dict[int, SimBroker] = {}
        self.observers: list[Observer] = []
        self.round_times: list[float] = []  # every controller round's duration (s), in order
        self.core: Any = None
        self.custom: Any = None
        self.raw: KubernetesMetadataStore | None = None  # uncounted: the harness's own reads
        self.harness: WatchedTopics | None = None  # the topics composed, from raw's watch cache
        self._harness_lock = threading.Lock()
        self.broker_kubeconfig: Path = workdir / "kubeconfig-unset"
        self.results: dict[str, Any] = {}
        # the brokers' health services, when the controller checks them (session timeout), and the
        # iptables rules of the "lost" scenario (bench.metadata_faults)
        self.health: HealthServers | None = None
        self.drops: PortDrops | None = None

    # -- set-up ------------------------------------------------------------------------------

    def register(self, view: ClusterView) -> None:
        """Register a simulated broker as the broker does; with ``--partition-state documents`` as a
        broker of code from before partition change records (no metadata_features), so the
        controller keeps writing whole topic documents."""
        view.register()
        if self.s.partition_state == "documents":
            key = keys.broker(view.config.broker_id)
            doc = view.store.get(key)
            assert doc is not None and doc.value is not None
            old = dataclasses.replace(BrokerDocument.from_json(doc.value), metadata_features=())
            view.store.compare_and_set(key, old.to_json(), doc.version)

    def config(self, broker_id: int) -> BrokerConfig:
        records = {"metadata.partition.changes.enable": str(self.s.partition_state == "records").lower()}
        host, port = f"broker-{broker_id}.sim", 9092
        if self.health is not None and broker_id in self.health.ports:  # (not an observer's)
            # registered where its health service answers the controller's checks
            host, port = "127.0.0.1", self.health.ports[broker_id]
        return BrokerConfig.build(broker_id, host, port, str(self.workdir / "unused"), self.url, records)

    def start(self) -> None:
        from kubernetes import client

        from sluice.operator.controller.kubernetes import KubernetesController
        from tests.k8s.crds import install_crds
        from tests.support.k8s_env import TestControlPlane

        if {"hang", "lost"} & set(self.s.scenarios) and self.s.session_timeout_s <= 0:
            raise SystemExit("the hang and lost scenarios need the operator's health checks (--session-timeout > 0)")
        if "lost" in self.s.scenarios:
            why = PortDrops.available()
            if why is not None:
                raise SystemExit(f"the lost scenario drops packets with iptables: {why}")
            self.drops = PortDrops()
        if self.s.session_timeout_s > 0:
            self.health = HealthServers()
        if self.plane is None:
            log("starting etcd (fsync on) and kube-apiserver")
            self.plane = TestControlPlane(self.workdir / "k8s", etcd_fsync=True)
            self.plane.start()
        install_crds(self.plane)
        self.namespace = self.plane.create_namespace("metasim")
        kubeconfig = self.plane.kubeconfig
        self.url = f"kubernetes://{self.namespace}?kubeconfig={kubeconfig}"
        admin = api_client(str(kubeconfig))
        self.core = client.CoreV1Api(admin)
        self.custom = client.CustomObjectsApi(admin)
        self.raw = KubernetesMetadataStore.from_url(self.url)
        self.harness = WatchedTopics(self.raw)
        self.broker_kubeconfig = kubeconfig
        if self.s.service_account:
            self.broker_kubeconfig = self._broker_service_account()
        broker_url = f"kubernetes://{self.namespace}?kubeconfig={self.broker_kubeconfig}"
        self.broker_store = CountingStore(KubernetesMetadataStore.from_url(broker_url))
        n = self.s.brokers
        log(f"registering {n} simulated brokers and their Pods")
        for i in range(n):
            if self.health is not None:
                self.health.start(i)
            view = ClusterView(self.broker_store, self.config(i))
            self.register(view)
            self.brokers[i] = SimBroker(i, view)
            self._create_pod(i)
            self.set_ready(i, True)
        self._create_topics()
        log("starting the controller (KubernetesController: Pod watch, Lease, controller loop, Events, statuses)")
        self.controller_store = CountingStore(KubernetesMetadataStore.from_url(self.url))
        self.controller = KubernetesController(
            self.controller_store,
            api_client(str(kubeconfig)),
            self.namespace,
            grace_s=self.s.grace_s,
            preferred_leader_delay_s=self.s.preferred_delay_s,
            identity="metasim-operator",
            session_timeout_s=self.s.session_timeout_s,
        )
        self._time_rounds(self.controller.loop)
        self.controller.start()
        if not wait_until(self.controller.leading.is_set, 60):
            raise RuntimeError("the controller did not take its Lease within 60 s")
        log(f"starting {n} watch streams and {self.s.observers} observer ClusterView(s)")
        for i in range(n):
            self.brokers[i].watcher = Watcher(
                f"b{i}", self.broker_kubeconfig, self.namespace, self.decoder, self.deadline
            ).start()
        for j in range(self.s.observers):
            self.observers.append(Observer(f"o{j}", broker_url, self.config(10_000 + j), self.deadline).start())
        # Each stream's first LIST is decoded in this one process (GIL): at 100 brokers and 100,000
        # partitions that is 100 x 100 documents of 1,000 partitions, minutes of CPU; said as it goes.
        started = time.monotonic()
        synced = 0
        for _ in range(SYNC_WAIT_S // 10):
            synced = sum(1 for b in self.brokers.values() if b.watcher is not None and b.watcher.synced.is_set())
            if synced == n:
                break
            log(f"watch streams synced: {synced} of {n} after {time.monotonic() - started:.0f} s")
            wait_until(
                lambda: all(b.watcher is not None and b.watcher.synced.is_set() for b in self.brokers.values()), 10
            )
        else:
            raise RuntimeError(f"the watch streams did not sync within {SYNC_WAIT_S} s ({synced} of {n})")
        wait_until(lambda: all(len(o.view.topics) >= self.s.topics for o in self.observers), 60)
        self.settle("start-up")

    def _broker_service_account(self) -> Path:
        """A kubeconfig for the ServiceAccount ``sluice-broker``, allowed MetadataDocuments only."""
        rules = {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["*"]}
        role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "sluice-broker"}}
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "sluice-broker"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "sluice-broker"},
            "subjects": [{"kind": "ServiceAccount", "name": "sluice-broker", "namespace": self.namespace}],
        }
        self.plane.apply(json.dumps({**role, "rules": [rules]}), namespace=self.namespace)
        self.plane.apply(json.dumps(binding), namespace=self.namespace)
        path: Path = self.plane.service_account_kubeconfig(self.namespace, "sluice-broker")
        return path

    def _create_pod(self, i: int) -> None:
        self.core.create_namespaced_pod(
            self.namespace,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"sluice-broker-{i}", "labels": dict(BROKER_LABELS)},
                "spec": {"containers": [{"name": "broker", "image": "sluice:sim"}]},
            },
        )

    def set_ready(self, i: int, ready: bool) -> None:
        """What the kubelet writes from the readiness probe's verdict: the Pod's Ready condition."""
        status = "True" if ready else "False"
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        conditions = [
            {"type": "Ready", "status": status, "lastTransitionTime": now},
            {"type": "ContainersReady", "status": status, "lastTransitionTime": now},
        ]
        self.core.patch_namespaced_pod_status(
            f"sluice-broker-{i}",
            self.namespace,
            {"status": {"phase": "Running", "podIP": f"10.1.{i // 250}.{i % 250 + 1}", "conditions": conditions}},
        )

    def _create_topics(self) -> None:
        """Topic resources (as users write them) and their documents (as a broker's CreateTopics writes them)."""
        first = self.brokers[0].view
        first.refresh()  # every registered broker, for placement
        log(f"creating {self.s.topics} topics x {self.s.partitions} partitions, RF {self.s.replication_factor}")
        for t in range(self.s.topics):
            name = f"t{t:03d}"
            first.create_topic(name, self.s.partitions, self.s.replication_factor, {})
            self.custom.create_namespaced_custom_object(
                GROUP,
                VERSION,
                self.namespace,
                "topics",
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "Topic",
                    "metadata": {"name": name},
                    "spec": {"partitions": self.s.partitions, "replicationFactor": self.s.replication_factor},
                },
            )
            # what the operator's Topic handler writes once it reconciled: the projection patches after it
            self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, self.namespace, "topics", name, {"status": {"observedGeneration": 1}}
            )

    # -- state ---------------------------------------------------------------------------------

    def topics(self) -> dict[str, TopicDocument]:
        """Every topic by its document key, composed with its partition change records (the harness's
        own watch cache: what a broker's view holds, a watch delay behind the store)."""
        assert self.harness is not None
        with self._harness_lock:
            self.harness.catch_up()
            return {keys.topic(name): t for name, t in self.harness.view.topics().items()}

    def topic_revisions(self) -> dict[str, int]:
        """The revision of every topic document and partition change record there is: what a watcher
        must have applied to hold the topics as they are (folded states are not watched)."""
        assert self.raw is not None
        return {
            d.key: d.revision
            for prefix in (keys.TOPICS, keys.PARTITION_CHANGES)
            for d in self.raw.changes_since(0, prefix)
            if d.value is not None
        }

    def settled(self) -> bool:
        """Every partition at its full ISR and led by its preferred (first) replica; with records, every
        topic switched to them (the one-time switch is a write per topic, not part of any scenario)."""
        for topic in self.topics().values():
            if self.s.partition_state == "records" and not topic.states_in_records:
                return False
            for p in topic.partitions:
                if sorted(p.isr) != sorted(p.replicas) or p.leader != p.replicas[0]:
                    return False
        return True

    def heal(self) -> int:
        """Leaders add back every replica missing from their ISRs (unmeasured: between scenarios), each
        leader all of a topic's in one write, as a broker's ISR check does (one write per partition
        took minutes after the churn of 50 changes/s: the 1,000 partitions it leaves short)."""
        healed = 0
        for key, topic in self.topics().items():
            by_leader: dict[int, list[IsrChange]] = {}
            for i, p in enumerate(topic.partitions):
                if sorted(p.isr) != sorted(p.replicas) and p.leader in self.brokers and self.brokers[p.leader].alive:
                    change = IsrChange(i, p.leader_epoch, tuple(p.isr), tuple(p.replicas), p.partition_epoch)
                    by_leader.setdefault(p.leader, []).append(change)
            for leader, changes in by_leader.items():
                written = self.brokers[leader].view.write_isrs(key[len(keys.TOPICS) :], leader, changes)
                healed += sum(IsrOutcome.applied(written.outcomes.get(c.partition)) for c in changes)
        return healed

    def settle(self, what: str, timeout: float = 90.0) -> None:
        """Heal ISRs and wait (bounded) until preferred leaders are back, before a measured scenario."""
        started = time.monotonic()
        for _ in range(100):
            if self.settled() or time.monotonic() - started > timeout:
                break
            self.heal()
            time.sleep(1.0)
        log(f"{what}: settled={self.settled()} after {time.monotonic() - started:.1f} s")
        if not self.settled():  # what is left, so that a run that could not settle says why
            short = [
                f"{key[len(keys.TOPICS) :]}-{i}: replicas {p.replicas} leader {p.leader} isr {p.isr}"
                for key, topic in self.topics().items()
                for i, p in enumerate(topic.partitions)
                if sorted(p.isr) != sorted(p.replicas) or p.leader != p.replicas[0]
            ]
            log(f"{what}: {len(short)} partition(s) not settled, e.g. " + "; ".join(short[:5]))

    def live_watchers(self) -> list[Watcher]:
        return [b.watcher for b in self.brokers.values() if b.alive and b.watcher is not None]

    # -- measuring windows -----------------------------------------------------------------------

    def _time_rounds(self, loop: Any) -> None:
        """Record how long each of the controller's rounds takes (its loop object's run_round, wrapped)."""
        inner = loop.run_round

        def timed() -> int:
            started = time.monotonic()
            try:
                return int(inner())
            finally:
                self.round_times.append(time.monotonic() - started)  # list.append: atomic under the GIL

        loop.run_round = timed

    @contextlib.contextmanager
    def window(self, name: str) -> Iterator[dict[str, Any]]:
        """Measure one scenario: server metrics, store counts and watch counters around it."""
        assert self.broker_store is not None and self.controller_store is not None
        out: dict[str, Any] = {"scenario": name}
        before = scrape(self.plane)
        self.broker_store.take()
        self.controller_store.take()
        counters = {b.broker_id: b.watcher.counters() for b in self.brokers.values() if b.watcher is not None}
        first_round = len(self.round_times)
        started = time.monotonic()
        yield out
        seconds = time.monotonic() - started
        rounds = sorted(self.round_times[first_round:])
        out["controller_rounds"] = {
            "count": len(rounds),
            "p50_ms": round(percentile(rounds, 50) * 1000, 1),
            "p99_ms": round(percentile(rounds, 99) * 1000, 1),
            "max_ms": round(max(rounds, default=0.0) * 1000, 1),
            "over_1s": sum(1 for r in rounds if r > 1.0),
        }
        after = scrape(self.plane)
        brokers_counts, controller_counts = self.broker_store.take(), self.controller_store.take()
        per_bytes, per_events, per_decode = [], [], []
        for b in self.brokers.values():
            if b.watcher is None:
                continue
            b0, e0, d0 = counters.get(b.broker_id, (0, 0, 0.0))
            if b.watcher.bytes < b0:  # a new stream (the broker returned): counted from zero
                b0, e0, d0 = 0, 0, 0.0
            per_bytes.append(b.watcher.bytes - b0)
            per_events.append(b.watcher.events - e0)
            per_decode.append(b.watcher.decode_s - d0)
        out.update(
            {
                "seconds": round(seconds, 2),
                "server": after.minus(before),
                "brokers_store": brokers_counts.summary(),
                "controller_store": controller_counts.summary(),
                "watch": {
                    "watchers": len(per_bytes),
                    "bytes_total": sum(per_bytes),
                    "bytes_per_broker_mean": int(statistics.fmean(per_bytes)) if per_bytes else 0,
                    "bytes_per_broker_max": max(per_bytes, default=0),
                    "events_per_broker_mean": round(statistics.fmean(per_events), 1) if per_events else 0,
                    "decode_cpu_s_per_broker_mean": round(statistics.fmean(per_decode), 3) if per_decode else 0,
                },
            }
        )
        writes = out["server"]["metadatadocuments_by_verb_code"]
        md_writes = sum(n for k, n in writes.items() if k.split()[0] in WRITE_VERBS)
        out["server"]["metadatadocument_writes_per_s"] = round(md_writes / seconds, 2) if seconds else 0.0
        all_writes = sum(
            n for k, n in out["server"]["requests_by_verb_resource"].items() if k.split()[0] in WRITE_VERBS
        )
        out["server"]["writes_per_s_all_resources"] = round(all_writes / seconds, 2) if seconds else 0.0
        self.results.setdefault("scenarios", []).append(out)
        log(summary_line(out))

    # -- scenarios -------------------------------------------------------------------------------

    def steady(self, rate: float) -> None:
        """ISR shrink/expand at ``rate`` changes/s for churn_seconds, by each partition's leader."""
        rng = random.Random(int(rate * 1000) + 1)
        outcome: Counter[str] = Counter()

        def one_change() -> None:
            # The leader decides on its own state, which is the stored document's: the harness reads it
            # (one GET, uncounted by the brokers' store but seen by the API server), then the leader
            # writes through write_isrs (its own GET and PUT). A decision on a view 100 ms stale would
            # sometimes write the ISR the document already has: a no-op PUT.
            name = f"t{rng.randrange(self.s.topics):03d}"
            topic = self.topics().get(keys.topic(name))
            if topic is None:
                outcome["no document"] += 1
                return
            partitions = topic.partitions
            i = rng.randrange(len(partitions))
            p = partitions[i]
            if p.leader not in self.brokers or not self.brokers[p.leader].alive:
                outcome["leader not alive"] += 1
                return
            if sorted(p.isr) == sorted(p.replicas) and len(p.isr) > 1:
                dropped = rng.choice([b for b in p.isr if b != p.leader])
                isr = [b for b in p.isr if b != dropped]
            else:
                isr = list(p.replicas)
            try:
                if self.s.isr_path == "requests":
                    self.brokers[p.leader].ask({name: (topic, [(i, isr)])})
                    outcome["written"] += 1  # asked: the controller writes it, with others, in its next round
                else:
                    change = IsrChange(i, p.leader_epoch, tuple(p.isr), tuple(isr), p.partition_epoch)
                    written = self.brokers[p.leader].view.write_isrs(name, p.leader, [change])
                    outcome[written.outcomes[i].value] += 1
            except StoreUnavailable:
                outcome["store unavailable"] += 1
            except VersionConflict:
                outcome["gave up after conflicts"] += 1

        with self.window(f"steady {rate:g}/s") as out:
            count = int(rate * self.s.churn_seconds)
            started = time.monotonic()
            if count == 0:
                time.sleep(self.s.churn_seconds)
            else:
                with ThreadPoolExecutor(max_workers=8, thread_name_prefix="churn") as pool:
                    futures = []
                    for k in range(count):
                        due = started + k / rate
                        delay = due - time.monotonic()
                        if delay > 0:
                            time.sleep(delay)
                        futures.append(pool.submit(one_change))
                    for f in futures:
                        f.result(timeout=max(1.0, self.deadline - time.monotonic()))
            out["churn_rate_asked"] = rate
            out["churn_outcomes"] = dict(outcome)
            out["churn_rate_achieved"] = round(outcome["written"] / (time.monotonic() - started), 2)
        self.settle(f"after steady {rate:g}/s")

    def final_state(self, done: Callable[[dict[str, TopicDocument]], bool], timeout: float) -> dict[str, int] | None:
        """Wait (bounded) until ``done`` holds for the stored topics; then their revisions."""
        found: dict[str, int] = {}

        def check() -> bool:
            if done(self.topics()):
                found.update(self.topic_revisions())
                return True
            return False

        return found if wait_until(check, timeout, 0.2) else None

    def completion(self, out: dict[str, Any], wanted: dict[str, int] | None, t0: float) -> None:
        """Failover figures: when each watcher and observer had applied the final state."""
        if wanted is None:
            out["completed"] = False
            return
        time.sleep(2.0)  # the last events reach every stream
        out["completed"] = True
        times = []
        missing = 0
        for w in self.live_watchers():
            at = w.applied_at(wanted, t0)
            if at is None:
                missing += 1
            else:
                times.append(at - t0)
        out["last_watcher_applied_s"] = round(max(times), 3) if times else None
        out["median_watcher_applied_s"] = round(statistics.median(times), 3) if times else None
        out["watchers_missing_final_state"] = missing
        obs = [o.applied_at(wanted, t0) for o in self.observers]
        out["observer_clusterviews_applied_s"] = [None if a is None else round(a - t0, 3) for a in obs]

    def kill(self, victim: int) -> None:
        """A hard kill: the stream is cut; with health checks, the health server stops (its port
        refuses); without, the Pod turns NotReady at once."""
        with self.window(f"kill broker {victim}") as out:
            self._fail(victim, out, mode="crash")

    def hang(self, victim: int) -> None:
        """A hung broker (SIGSTOP): the stream stops, checks are accepted and never answered, the Pod
        stays Ready (its probe would fail 15 s later, after the health checks' verdict)."""
        with self.window(f"hang broker {victim}") as out:
            self._fail(victim, out, mode="hang")

    def lose(self, victim: int) -> None:
        """A lost node: the stream stops, every packet to the broker's port is dropped, the Pod stays Ready."""
        with self.window(f"lost broker {victim}") as out:
            self._fail(victim, out, mode="lost")

    def comeback(self, victim: int) -> None:
        """The broker returns: registers, relists, Ready; leaders add it back; preferred leaders return."""
        with self.window(f"return broker {victim}") as out:
            self._return(victim, out, recreate_pod=False)

    def rolling(self, count: int) -> None:
        """A rolling restart of ``count`` brokers, one after the other, as a StatefulSet does it: the Pod
        is deleted (dead at once for the operator: the controlled shutdown), the broker comes back
        (new Pod, Ready, registers, relists, leaders add it back, preferred leaders return), then the next."""
        with self.window(f"rolling restart of {count} brokers") as out:
            steps = []
            for victim in list(self.brokers)[:count]:
                if time.monotonic() > self.deadline:
                    break
                failed: dict[str, Any] = {}
                back: dict[str, Any] = {}
                self._fail(victim, failed, mode="controlled")
                self._return(victim, back, recreate_pod=True)
                steps.append(
                    {
                        "broker": victim,
                        "down_last_watcher_s": failed.get("last_watcher_applied_s"),
                        "back_last_watcher_s": back.get("last_watcher_applied_s"),
                        "expansions": back.get("expansion_outcomes"),
                    }
                )
                log(f"rolling restart: broker {victim}: {steps[-1]}")
            out["steps"] = steps
            done = [st["back_last_watcher_s"] for st in steps if st["back_last_watcher_s"] is not None]
            out["completed"] = len(done) == count
            out["last_watcher_applied_s"] = max(
                (st["down_last_watcher_s"] or 0 for st in steps), default=None
            )  # the longest shutdown

    def _fail(self, victim: int, out: dict[str, Any], *, mode: str) -> None:
        """``mode``: controlled (a rolling restart's), crash, hang or lost (bench.metadata_faults)."""
        broker = self.brokers[victim]
        health = self.health
        t0 = time.monotonic()
        broker.alive = False
        if broker.watcher is not None:
            broker.watcher.stop()
        if mode == "controlled":
            if health is not None:
                health.shut_down(victim)  # NOT_SERVING, as a broker in controlled shutdown answers
            # the Pod deleted (a rolling restart): the operator takes it as dead at once
            self.core.delete_namespaced_pod(f"sluice-broker-{victim}", self.namespace, grace_period_seconds=0)
        elif health is None:
            self.set_ready(victim, False)  # (mode crash: the only one without health checks)
        elif mode == "crash":
            health.crash(victim)
        elif mode == "hang":
            health.hang(victim)
        else:
            assert self.drops is not None
            self.drops.drop(health.ports[victim])

        def dead_seen() -> bool:
            return all(victim in o.view.dead_brokers for o in self.observers)

        if not wait_until(dead_seen, self.s.grace_s + self.s.session_timeout_s + 30, 0.05):
            log(f"broker {victim} was never declared dead ({mode}): no detection figure")
            out["detected"] = False
        # detection: the controller document naming the broker dead, applied by the first watcher
        seen = [at for w in self.live_watchers() for dead, at in w.dead_seen if victim in dead and at > t0]
        detected = (min(seen) if seen else time.monotonic()) - t0
        out["detection_s"] = round(detected, 3) if seen else None

        def fenced(docs: dict[str, TopicDocument]) -> bool:
            return all(p.leader != victim and victim not in p.isr for t in docs.values() for p in t.partitions)

        wanted = self.final_state(fenced, 60)
        self.completion(out, wanted, t0)
        out["after_detection_s"] = (
            round(out["last_watcher_applied_s"] - detected, 3) if seen and out.get("last_watcher_applied_s") else None
        )
        if mode == "controlled" and health is not None:
            health.crash(victim)  # the process exits once its partitions moved
        out["failure"] = mode
        if health is None and mode != "controlled":
            out["probe_detection_not_simulated_s"] = PROBE_DETECTION_S

    def _heal(self, victim: int) -> None:
        """The broker's health service answers again (resumed, reachable, or restarted on its port)."""
        health = self.health
        if health is None:
            return
        health.resume(victim)
        if self.drops is not None:
            self.drops.heal(health.ports[victim])
        if victim not in health.servers:
            health.start(victim)

    def _return(self, victim: int, out: dict[str, Any], *, recreate_pod: bool) -> None:
        broker = self.brokers[victim]
        assert self.plane is not None
        t0 = time.monotonic()
        if recreate_pod:
            wait_until(lambda: self._pod_gone(victim), 30)
            self._create_pod(victim)
        self._heal(victim)
        self.register(broker.view)
        broker.watcher = Watcher(
            f"b{victim}", self.plane.kubeconfig, self.namespace, self.decoder, self.deadline
        ).start()
        self.set_ready(victim, True)
        broker.alive = True
        wait_until(lambda: all(victim not in o.view.dead_brokers for o in self.observers), self.s.grace_s + 30)
        out["alive_again_s"] = round(time.monotonic() - t0, 3)
        # every leader of a partition the returned broker replicates adds it back, one write per topic
        # document per leader, all leaders at once (their followers catch up together); what a leader
        # could not write (refused as stale, or 20 conflicts) it tries again on its next pass, as a
        # broker does on its next ISR check
        outcome: Counter[str] = Counter()
        lock = threading.Lock()
        known: dict[str, TopicDocument] = {}  # the topics as of the last outside(): each leader's view

        def expand(leader: int, items: list[tuple[str, int]]) -> None:
            # as a broker's maintain_isr: all of this leader's changes asked of the controller in one
            # write of its requests document, or (direct) one write per topic document
            view = self.brokers[leader].view
            by_topic: dict[str, list[int]] = {}
            for name, i in items:
                by_topic.setdefault(name, []).append(i)
            if self.s.isr_path == "requests":
                try:
                    wanted: dict[str, tuple[TopicDocument, list[tuple[int, list[int]]]]] = {}
                    for name, indexes in by_topic.items():
                        topic = known.get(keys.topic(name))  # the leader's view of the topic
                        if topic is None:
                            continue
                        wanted[name] = (topic, [(i, sorted({*topic.partitions[i].isr, victim})) for i in indexes])
                    self.brokers[leader].ask(wanted)
                    results = ["asked"] * len(items)
                except StoreUnavailable:
                    results = ["store unavailable"] * len(items)
                with lock:
                    outcome.update(results)
                return
            for name, indexes in by_topic.items():
                results: list[str]
                try:
                    topic = known.get(keys.topic(name))
                    if topic is None:
                        results = ["no document"] * len(indexes)
                    else:
                        parts = topic.partitions
                        changes = [
                            IsrChange(
                                i, p.leader_epoch, tuple(p.isr), tuple(sorted({*p.isr, victim})), p.partition_epoch
                            )
                            for i, p in ((i, parts[i]) for i in indexes)
                        ]
                        written = view.write_isrs(name, leader, changes)
                        results = [written.outcomes[i].value for i in indexes]
                except StoreUnavailable:
                    results = ["store unavailable"] * len(indexes)
                with lock:
                    outcome.update(results)

        def outside() -> dict[int, list[tuple[str, int]]]:
            """By leader: the partitions the returned broker replicates and is not in the ISR of."""
            work: dict[int, list[tuple[str, int]]] = {}
            known.clear()
            known.update(self.topics())
            for key, topic in known.items():
                for i, p in enumerate(topic.partitions):
                    if victim in p.replicas and victim not in p.isr and p.leader >= 0:
                        work.setdefault(p.leader, []).append((key[len(keys.TOPICS) :], i))
            return work

        passes = 0
        leaders: set[int] = set()
        for _ in range(10):
            work = outside()
            if not work or time.monotonic() > self.deadline:
                break
            leaders |= set(work)
            passes += 1
            with ThreadPoolExecutor(max_workers=max(1, min(len(work), 64)), thread_name_prefix="expand") as pool:
                for f in [pool.submit(expand, leader, items) for leader, items in work.items()]:
                    f.result(timeout=max(1.0, self.deadline - time.monotonic()))
            if self.s.isr_path == "requests":
                # the controller decides them in its rounds; a broker asks again only for what is left
                # when its requests go unanswered (ISR_REQUEST_TIMEOUT_S, 3 s)
                wait_until(lambda: not outside(), 3.0, interval=0.2)
        out["expansion_passes"] = passes
        out["expansion_leaders"] = len(leaders)
        out["expansion_outcomes"] = dict(outcome)
        out["expansion_s"] = round(time.monotonic() - t0, 3)
        wanted = self.final_state(
            lambda docs: all(
                sorted(p.isr) == sorted(p.replicas) and p.leader == p.replicas[0]
                for t in docs.values()
                for p in t.partitions
            ),
            self.s.preferred_delay_s + 60,
        )
        self.completion(out, wanted, t0)

    def _pod_gone(self, victim: int) -> bool:
        try:
            self.core.read_namespaced_pod(f"sluice-broker-{victim}", self.namespace)
        except Exception as exc:
            return getattr(exc, "status", None) == 404
        return False

    # -- the whole run ---------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        started = time.time()
        self.results = {
            "brokers": self.s.brokers,
            "settings": dataclasses.asdict(self.s),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "machine": {"cpus": os.cpu_count(), "load_at_start": os.getloadavg()[0]},
            "scenarios": [],
        }
        self.start()
        docs = self.topics()
        sizes = [len(json.dumps(t.to_json(), sort_keys=True)) for t in docs.values()]
        self.results["topic_document_bytes_mean"] = int(statistics.fmean(sizes)) if sizes else 0
        self.results["all_topic_documents_bytes"] = sum(sizes)
        if "steady" in self.s.scenarios:
            for rate in self.s.churn_rates:
                if time.monotonic() > self.deadline:
                    break
                self.steady(rate)
        # each failure on a broker of its own, each followed by its return
        for scenario, fail, victim in (("kill", self.kill, 2), ("hang", self.hang, 3), ("lost", self.lose, 4)):
            if scenario in self.s.scenarios and time.monotonic() < self.deadline:
                victim = min(victim, self.s.brokers - 1)
                if not self.brokers[victim].alive:  # (fewer than 5 brokers, without "return")
                    log(f"{scenario}: broker {victim} is down already (add 'return', or more brokers): skipped")
                    continue
                fail(victim)
                if "return" in self.s.scenarios and time.monotonic() < self.deadline:
                    self.comeback(victim)
        if "rolling" in self.s.scenarios and time.monotonic() < self.deadline:
            self.settle("before the rolling restart")
            self.rolling(min(self.s.rolling_brokers, self.s.brokers))
        self.results["seconds"] = round(time.time() - started, 1)
        self.results["machine"]["load_at_end"] = os.getloadavg()[0]
        return self.results

    def close(self) -> None:
        for o in self.observers:
            with contextlib.suppress(Exception):
                o.stop()
        for b in self.brokers.values():
            if b.watcher is not None:
                with contextlib.suppress(Exception):
                    b.watcher.stop()
        if self.controller is not None:
            with contextlib.suppress(Exception):
                self.controller.stop()
        for store in (self.controller_store, self.broker_store, self.raw):
            if store is not None:
                with contextlib.suppress(Exception):
                    store.close()
        if self.drops is not None:
            with contextlib.suppress(Exception):
                self.drops.close()
        if self.health is not None:
            with contextlib.suppress(Exception):
                self.health.close()
        if self.plane is not None and self._own_plane:
            self.plane.stop()


def summary_line(out: dict[str, Any]) -> str:
    server, watch = out["server"], out["watch"]
    parts = [
        f"{out['scenario']}: {out['seconds']} s",
        f"md writes {server['metadatadocument_writes_per_s']}/s",
        f"409s {server['conflicts_409']}",
        f"broker write p99 {out['brokers_store']['write_p99_ms']} ms",
        f"watch {watch['bytes_per_broker_mean'] / 1e6:.2f} MB/broker ({watch['events_per_broker_mean']} events)",
        f"APF rejected {server['apf_rejected']:g}",
        f"etcd db {server['etcd_db_bytes'] / 1e6:.1f} MB",
    ]
    for key in ("detection_s", "last_watcher_applied_s", "observer_clusterviews_applied_s", "churn_rate_achieved"):
        if key in out:
            parts.append(f"{key} {out[key]}")
    return "; ".join(parts)


# -- reports -------------------------------------------------------------------------------------


def write_reports(runs: dict[str, Any], stem: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(runs, indent=2, sort_keys=True) + "\n")
    (RESULTS / f"{stem}.md").write_text(markdown(runs))
    chart(runs, RESULTS / f"{stem}.png")


def markdown(runs: dict[str, Any]) -> str:
    lines = ["# Metadata at scale: measured (bench/metadata_scale.py)", ""]
    for n in sorted(runs, key=int):
        run = runs[n]
        s = run["settings"]
        lines += [
            f"## {n} brokers",
            "",
            f"{s['topics']} topics x {s['partitions']} partitions, RF {s['replication_factor']}; "
            f"topic document {run.get('topic_document_bytes_mean', 0) / 1000:.1f} KB; "
            f"{s['observers']} real ClusterView(s); grace {s['grace_s']} s; started {run['started']}; "
            f"load {run['machine']['load_at_start']:.1f} -> {run['machine'].get('load_at_end', 0):.1f} "
            f"on {run['machine']['cpus']} cores; {run.get('seconds', 0)} s in all.",
            "",
            "| scenario | s | md writes/s | all writes/s | 409s | broker write p50/p99 ms | server PUT p99 ms "
            "| controller writes (bytes) | watch MB/broker | events/broker | decode CPU s/broker | APF rej. "
            "| etcd db MB | detection s | last watcher s | ClusterViews s |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for sc in run["scenarios"]:
            sv, w, bs, cs = sc["server"], sc["watch"], sc["brokers_store"], sc["controller_store"]
            scenario = sc["scenario"]
            if "churn_rate_achieved" in sc:
                scenario += f" (achieved {sc['churn_rate_achieved']}/s)"
            views = sc.get("observer_clusterviews_applied_s")
            lines.append(
                f"| {scenario} | {sc['seconds']} | {sv['metadatadocument_writes_per_s']} "
                f"| {sv['writes_per_s_all_resources']} | {sv['conflicts_409']} "
                f"| {bs['write_p50_ms']}/{bs['write_p99_ms']} | {sv['server_put_p99_ms']} "
                f"| {cs['writes']} ({cs['bytes_written'] / 1e6:.2f} MB) | {w['bytes_per_broker_mean'] / 1e6:.2f} "
                f"| {w['events_per_broker_mean']} | {w['decode_cpu_s_per_broker_mean']} | {sv['apf_rejected']:g} "
                f"| {sv['etcd_db_bytes'] / 1e6:.1f} | {sc.get('detection_s', '')} "
                f"| {sc.get('last_watcher_applied_s', '')} | {'' if views is None else views} |"
            )
        lines.append("")
        for sc in run["scenarios"]:
            extra = {
                k: sc[k]
                for k in (
                    "churn_outcomes",
                    "expansion_leaders",
                    "expansion_passes",
                    "expansion_outcomes",
                    "expansion_s",
                    "alive_again_s",
                    "after_detection_s",
                    "detected",
                    "completed",
                    "watchers_missing_final_state",
                    "controller_rounds",
                )
                if k in sc
            }
            if extra:
                lines.append(f"- {sc['scenario']}: {json.dumps(extra, sort_keys=True)}")
            for step in sc.get("steps", []):
                lines.append(f"  - {json.dumps(step, sort_keys=True)}")
        lines.append("")
    return "\n".join(lines) + "\n"


def chart(runs: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed (pip install -e '.[bench]'): no chart")
        return
    ns = sorted(runs, key=int)
    xs = [int(n) for n in ns]

    def figure(scenario_prefix: str, pick: Callable[[dict[str, Any]], float]) -> list[float]:
        values = []
        for n in ns:
            found = [sc for sc in runs[n]["scenarios"] if sc["scenario"].startswith(scenario_prefix)]
            values.append(pick(found[0]) if found else float("nan"))
        return values

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    ax = axes[0]
    ax.plot(xs, figure("kill", lambda sc: sc["watch"]["bytes_total"] / 1e6), "o-", label="kill: watch MB (all brokers)")
    ax.plot(
        xs, figure("return", lambda sc: sc["watch"]["bytes_total"] / 1e6), "s-", label="return: watch MB (all brokers)"
    )
    ax.plot(xs, figure("rolling", lambda sc: sc["watch"]["bytes_total"] / 1e6), "^-", label="rolling restart: watch MB")
    ax.set_yscale("log")
    ax.set_xlabel("brokers")
    ax.set_ylabel("MB (log)")
    ax.set_title("watch egress per failover")
    ax.legend(fontsize=8)
    ax = axes[1]
    ax.plot(xs, figure("kill", lambda sc: sc.get("detection_s") or float("nan")), "o-", label="kill: detection")
    ax.plot(
        xs,
        figure("kill", lambda sc: sc.get("last_watcher_applied_s") or float("nan")),
        "s-",
        label="kill: last watcher",
    )
    ax.plot(
        xs, figure("return", lambda sc: sc.get("last_watcher_applied_s") or float("nan")), "^-", label="return: settled"
    )
    ax.set_xlabel("brokers")
    ax.set_ylabel("s after the failure")
    ax.set_title("failover time")
    ax.legend(fontsize=8)
    ax = axes[2]
    for rate in sorted({sc.get("churn_rate_asked", -1) for n in ns for sc in runs[n]["scenarios"]} - {-1}):
        ax.plot(
            xs,
            figure(f"steady {rate:g}/s", lambda sc: sc["brokers_store"]["write_p99_ms"]),
            "o-",
            label=f"ISR churn {rate:g}/s: write p99",
        )
    ax.set_xlabel("brokers")
    ax.set_ylabel("ms")
    ax.set_title("ISR write latency p99 (client)")
    ax.legend(fontsize=8)
    fig.suptitle("Sluice metadata in the API server (etcd fsync on); scale in bench/results/metadata-scale.md")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# -- command line --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--brokers", type=int, nargs="+", default=[10], help="broker counts, one run each (10 30 100)")
    parser.add_argument("--topics", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=200, help="partitions per topic")
    parser.add_argument("--replication-factor", type=int, default=3)
    parser.add_argument("--churn-rates", type=float, nargs="+", default=[0, 1, 10, 50], help="ISR changes/s")
    parser.add_argument("--churn-seconds", type=float, default=20.0)
    parser.add_argument("--observers", type=int, default=2, help="real ClusterViews")
    parser.add_argument("--grace", type=float, default=10.0, help="the operator's NotReady grace period (s)")
    parser.add_argument("--preferred-delay", type=float, default=10.0, help="SLUICE_PREFERRED_LEADER_DELAY_S")
    parser.add_argument(
        "--scenarios",
        nargs="+",
        default=["steady", "kill", "return"],
        choices=["steady", "kill", "hang", "lost", "return", "rolling"],
        help="kill, hang, lost: a broker fails so (each a broker of its own, then its return with 'return'); "
        "rolling: a rolling restart of --rolling-brokers brokers (not in the default set: minutes)",
    )
    parser.add_argument(
        "--session-timeout",
        type=float,
        default=9.0,
        help="the operator's own health checks: a broker without a SERVING answer this long is dead "
        "(SLUICE_BROKER_SESSION_TIMEOUT_S, default 9); 0: the Pods' verdicts only",
    )
    parser.add_argument("--rolling-brokers", type=int, default=10)
    parser.add_argument(
        "--as-service-account",
        action="store_true",
        help="brokers act as one ServiceAccount (APF workload-low), not as system:masters (APF-exempt)",
    )
    parser.add_argument(
        "--isr-path",
        choices=["requests", "direct"],
        default="requests",
        help="leaders ask the controller for ISR changes (requests, as brokers do) or write them (direct, as before)",
    )
    parser.add_argument(
        "--partition-state",
        choices=["records", "documents"],
        default="records",
        help="partition states as change records (records, as brokers of this code register for) or in the "
        "whole topic documents (documents, as before)",
    )
    parser.add_argument("--budget", type=float, default=1800.0, help="seconds per broker count, at most")
    parser.add_argument("--stem", default="metadata-scale", help="results file names in bench/results/")
    parser.add_argument("--report-only", action="store_true", help="write the .md and .png from the .json again")
    args = parser.parse_args(argv)
    path = RESULTS / f"{args.stem}.json"
    runs: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    if args.report_only:
        write_reports(runs, args.stem)
        return 0
    # a SIGTERM (a timeout, CI) ends a run through its finally: no iptables rule is left behind
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    for n in args.brokers:
        settings = Settings(
            brokers=n,
            topics=args.topics,
            partitions=args.partitions,
            replication_factor=args.replication_factor,
            churn_rates=list(args.churn_rates),
            churn_seconds=args.churn_seconds,
            observers=args.observers,
            grace_s=args.grace,
            preferred_delay_s=args.preferred_delay,
            scenarios=list(args.scenarios),
            budget_s=args.budget,
            rolling_brokers=args.rolling_brokers,
            service_account=args.as_service_account,
            isr_path=args.isr_path,
            partition_state=args.partition_state,
            session_timeout_s=args.session_timeout,
        )
        log(f"== {n} brokers ==")
        with tempfile.TemporaryDirectory(prefix="metasim-") as tmp:
            sim = Simulation(settings, Path(tmp))
            try:
                runs[str(n)] = sim.run()
            finally:
                sim.close()
        write_reports(runs, args.stem)
        log(f"results: {RESULTS / args.stem}.json, .md, .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
