"""The operator's Prometheus metrics: reconciliations, failovers, leaders per broker, drift repairs.

One registry per process (the Kopf operator, or the embedded cluster's controller process), fed
by one hook line where each event happens and served by prometheus_client's own HTTP server on
``--metrics-listen HOST:PORT`` (a daemon thread; off unless the flag is given, as the brokers'):

* **Reconciliations** of the operator's resources: every Kopf handler is wrapped where it is
  registered (:func:`instrument`, called by ``handlers.runtime.register_kind``), so each call is
  counted by kind (Topic, Coordinator, TransactionalId) and result (``success``; ``retry``: a
  ``kopf.TemporaryError``, the resource waits for something; ``error``: anything else) and timed.
  The controller loop's rounds count as kind ``Leadership`` (:func:`controller_round`).
* **Failovers**: a partition whose leader the controller moved away from a dead broker. Its
  duration is the time from the broker's last healthy answer (the liveness source's silence when
  it declared the broker dead) to the topic document with the new leader being written: what
  clients of the partition waited for.
* **Leaders per broker** and leaderless (offline) partitions, from the topic documents the
  controller read or wrote in its last round: Sluice's controller is the operator, so the
  cluster-wide leadership view belongs here.
* **Replicas per broker** and partitions being reassigned, from the same documents; the
  **rebalances** being executed (SluiceRebalance): their planned, moved and moving partitions.
* **Drift repairs**: a change the periodic drift check had to make (a topic missing, partitions
  or config not as declared) because the cluster no longer matched its resource. A change made
  because the resource itself changed is a reconciliation, not a repair: the timer handlers run
  with a thread-local flag set (Kopf runs sync handlers in worker threads, one call per thread
  at a time), and :func:`drift_repaired` counts only under it.

Label values are bounded: kinds, results, repair names and broker ids; no resource names.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from sluice.metadata.documents import TopicDocument

REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)

KINDS = {
    "topics": "Topic",
    "coordinators": "Coordinator",
    "transactionalids": "TransactionalId",
    "sluiceusers": "SluiceUser",
    "sluicerebalances": "SluiceRebalance",
}
LEADERSHIP = "Leadership"  # the controller loop's rounds

_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_FAILOVER_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0)

RECONCILIATIONS = Counter(
    "sluice_operator_reconciliations",
    "Reconciliations by resource kind and result (success, retry, error)",
    ["kind", "result"],
    registry=REGISTRY,
)
RECONCILE_SECONDS = Histogram(
    "sluice_operator_reconcile_duration_seconds",
    "Time one reconciliation took, by resource kind",
    ["kind"],
    buckets=_DURATION_BUCKETS,
    registry=REGISTRY,
)
FAILOVERS = Counter(
    "sluice_operator_failovers",
    "Partitions whose leadership the controller moved away from a dead broker",
    registry=REGISTRY,
)
FAILOVER_SECONDS = Histogram(
    "sluice_operator_failover_duration_seconds",
    "From a dead leader's last healthy answer to its partition's new leader being written",
    buckets=_FAILOVER_BUCKETS,
    registry=REGISTRY,
)
DRIFT_REPAIRS = Counter(
    "sluice_operator_drift_repairs",
    "Changes the periodic drift check made because the cluster no longer matched a resource",
    ["kind", "repair"],
    registry=REGISTRY,
)
BROKERS = Gauge("sluice_operator_brokers", "Registered brokers by liveness (live, dead)", ["state"], registry=REGISTRY)

# Every known series exists from the start at 0 (Prometheus' advice for labelled counters): a rate()
# or an alert over a series that appears only with its first event misses that event.
RESULTS = ("success", "retry", "error")
REPAIRS = {"Topic": ("created", "partitions", "config"), "Coordinator": ("created",)}
for _kind in (*KINDS.values(), LEADERSHIP):
    RECONCILE_SECONDS.labels(_kind)
    for _result in RESULTS:
        RECONCILIATIONS.labels(_kind, _result)
for _kind, _repairs in REPAIRS.items():
    for _repair in _repairs:
        DRIFT_REPAIRS.labels(_kind, _repair)
for _state in ("live", "dead"):
    BROKERS.labels(_state)

_drift = threading.local()
_F = TypeVar("_F", bound=Callable[..., Any])


# -- reconciliations (Kopf handlers) ---------------------------------------------------------------


def kind_of(plural: str) -> str:
    return KINDS.get(plural, plural)


def instrument(kind: str, handler: _F, *, drift_check: bool = False) -> _F:
    """``handler`` counted and timed as one reconciliation of ``kind`` per call (Kopf sees the same
    name, so handler ids do not change); ``drift_check`` marks the periodic timer's calls."""
    import kopf

    @functools.wraps(handler)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        result = "error"
        previous = getattr(_drift, "active", False)
        _drift.active = drift_check
        try:
            out = handler(*args, **kwargs)
            result = "success"
            return out
        except kopf.TemporaryError:
            result = "retry"
            raise
        finally:
            _drift.active = previous
            RECONCILIATIONS.labels(kind, result).inc()
            RECONCILE_SECONDS.labels(kind).observe(time.perf_counter() - started)

    return wrapped  # type: ignore[return-value]


def drift_repaired(kind: str, repair: str) -> None:
    """A change a reconciliation made; counted as a drift repair only inside the drift timer."""
    if getattr(_drift, "active", False):
        DRIFT_REPAIRS.labels(kind, repair).inc()


# -- the controller loop ----------------------------------------------------------------------------


class _Leadership(Collector):
    """Leaders per broker and leaderless partitions, from the topic documents of the last round."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # topic document key -> the document last read or written: counted only when scraped (copying
        # each partition's leader and replicas on every decision cost more than the decision itself
        # at 1,000 partitions a topic, bench/controller_rounds.py). Documents are never changed in place.
        self._docs: dict[str, TopicDocument] = {}
        self._dead_at: dict[int, float] = {}  # broker -> monotonic time its last healthy answer came
        self._rounds = 0

    def observe(self, key: str, doc: TopicDocument) -> None:
        with self._lock:
            self._docs[key] = doc

    def keep_only(self, keys: Iterable[str]) -> None:
        wanted = set(keys)
        with self._lock:
            for key in [k for k in self._docs if k not in wanted]:
                del self._docs[key]
            self._rounds += 1

    def broker_died(self, broker_id: int, silent_s: float) -> None:
        with self._lock:
            self._dead_at[broker_id] = time.monotonic() - max(silent_s, 0.0)

    def broker_alive(self, broker_id: int) -> None:
        with self._lock:
            self._dead_at.pop(broker_id, None)

    def silent_for(self, broker_id: int) -> float | None:
        with self._lock:
            since = self._dead_at.get(broker_id)
        return None if since is None else time.monotonic() - since

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            docs = list(self._docs.values())
            rounds = self._rounds
        partitions = [p for doc in docs for p in doc.partitions]
        leaders = [p.leader for p in partitions]
        replicas = [b for p in partitions for b in p.replicas]
        reassigning = sum(1 for p in partitions if p.reassigning)
        per_broker = GaugeMetricFamily(
            "sluice_operator_leaders",
            "Partitions each broker leads, as the controller last read or wrote them",
            labels=["broker"],
        )
        counts: dict[int, int] = {}
        for leader in leaders:
            if leader >= 0:
                counts[leader] = counts.get(leader, 0) + 1
        for broker, n in sorted(counts.items()):
            per_broker.add_metric([str(broker)], n)
        yield per_broker
        offline = GaugeMetricFamily(
            "sluice_operator_offline_partitions", "Partitions without a leader, cluster-wide (0 until the first round)"
        )
        offline.add_metric([], sum(1 for leader in leaders if leader < 0) if rounds else 0)
        yield offline
        per_broker_replicas = GaugeMetricFamily(
            "sluice_operator_partition_replicas",
            "Partition replicas on each broker (a partition being reassigned counts on its old and new ones)",
            labels=["broker"],
        )
        for broker, n in sorted(Tally(replicas).items()):
            per_broker_replicas.add_metric([str(broker)], n)
        yield per_broker_replicas
        moving = GaugeMetricFamily(
            "sluice_operator_reassigning_partitions",
            "Partitions with a reassignment in progress, cluster-wide (any cause: a rebalance, the CLI, Kafka's tool)",
        )
        moving.add_metric([], reassigning)
        yield moving


LEADERSHIP_VIEW = _Leadership()
REGISTRY.register(LEADERSHIP_VIEW)


@contextlib.contextmanager
def controller_round() -> Iterator[None]:
    """One round of the controller loop: counted (success/error) and timed as kind Leadership."""
    started = time.perf_counter()
    result = "error"
    try:
        yield
        result = "success"
    finally:
        RECONCILIATIONS.labels(LEADERSHIP, result).inc()
        RECONCILE_SECONDS.labels(LEADERSHIP).observe(time.perf_counter() - started)


def broker_changed(broker_id: int, new_state: str, silent_s: float) -> None:
    """A liveness transition the controller logged (``new_state`` "dead" or "alive" ...)."""
    if new_state == "dead":
        LEADERSHIP_VIEW.broker_died(broker_id, silent_s)
    else:
        LEADERSHIP_VIEW.broker_alive(broker_id)


def brokers_seen(live: Iterable[int], dead: Iterable[int]) -> None:
    BROKERS.labels("live").set(len(set(live)))
    BROKERS.labels("dead").set(len(set(dead)))


def topic_read(key: str, doc: TopicDocument) -> None:
    LEADERSHIP_VIEW.observe(key, doc)


def topic_written(key: str, old: TopicDocument, new: TopicDocument, dead: frozenset[int]) -> None:
    """A topic document the controller rewrote: leaders updated, failovers counted and timed."""
    LEADERSHIP_VIEW.observe(key, new)
    for before, after in zip(old.partitions, new.partitions, strict=False):
        if before.leader >= 0 and before.leader in dead and after.leader != before.leader:
            FAILOVERS.inc()
            took = LEADERSHIP_VIEW.silent_for(before.leader)
            if took is not None:
                FAILOVER_SECONDS.observe(took)


def round_listed(keys: Iterable[str]) -> None:
    """The round listed these topic documents: forget topics that are gone."""
    LEADERSHIP_VIEW.keep_only(keys)


# -- rebalances (SluiceRebalance) ---------------------------------------------------------------------


class _Rebalances(Collector):
    """Partitions of the running rebalances: planned, done, moving (summed: no resource names as labels)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[str, tuple[int, int, int]] = {}  # namespace/name -> total, done, in flight

    def update(self, resource: str, progress: Mapping[str, Any], active: bool) -> None:
        with self._lock:
            if active:
                self._running[resource] = (
                    int(progress.get("total", 0)),
                    int(progress.get("done", 0)),
                    int(progress.get("inFlight", 0)),
                )
            else:
                self._running.pop(resource, None)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            running = list(self._running.values())
        family = GaugeMetricFamily(
            "sluice_operator_rebalance_partitions",
            "Partitions of the SluiceRebalances being executed: planned (total), moved (done), moving (in_flight)",
            labels=["state"],
        )
        for i, state in enumerate(("total", "done", "in_flight")):
            family.add_metric([state], sum(r[i] for r in running))
        yield family
        count = GaugeMetricFamily("sluice_operator_rebalances_running", "SluiceRebalances being executed")
        count.add_metric([], len(running))
        yield count


REBALANCES = _Rebalances()
REGISTRY.register(REBALANCES)


def rebalance_progress(resource: str, progress: Mapping[str, Any], active: bool) -> None:
    """A SluiceRebalance's progress after a round (``active``: it is executing; else it is forgotten)."""
    REBALANCES.update(resource, progress, active)


# -- serving ----------------------------------------------------------------------------------------


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) -> (host, port); ValueError with the reason otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT with a port in 1..65535, not {text!r}")
    return host.strip("[]"), int(port)


def serve(listen: str) -> Any:
    """Serve ``/metrics`` on ``listen`` (HOST:PORT) from a daemon thread; returns the server.

    Raises OSError (with the address) if the port cannot be bound, so the process stops with a
    message instead of running without the metrics it was asked to serve."""
    host, port = parse_listen(listen)
    try:
        server, _thread = start_http_server(port, addr=host, registry=REGISTRY)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot serve metrics on {listen}: {exc.strerror or exc}") from exc
    return server


def snapshot() -> Mapping[str, float]:
    """Every sample of the registry by name and labels (for tests in this process)."""
    out: dict[str, float] = {}
    for family in REGISTRY.collect():
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out
