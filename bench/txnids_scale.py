"""10,000 TransactionalIds: the operator's status work against a real API server (issue 28's scenario).

Issue 28's target: "steady API-server writes under 20 per second with 10,000 TransactionalIds".
The cost of a TransactionalId resource is the operator's status work every
``--status-interval-s`` (5 s in the chart): asking the coordinator (DescribeTransactions) and
patching the status when it changed. It was a Kopf timer per resource (which also declared the
id's document each time; results kept in ``txnids-scale-timers``); it is now one status round for
every id (:mod:`sluice.operator.transactional_id_statuses`). Nothing of that can be simulated
faithfully without running it, so everything here is real and only the count is scaled:

* **The control plane**: the kube-apiserver and etcd of the Kubernetes tests
  (:class:`tests.support.k8s_env.TestControlPlane`) with etcd's fsync ON, so etcd's figures are
  what a disk gives; the CRDs installed as the tests install them; the KopfPeering object.
* **Three real brokers and the real operator** (:class:`tests.k8s.sluice_on_k8s.SluiceOnK8s`, as
  ``tests/k8s/test_operator.py`` starts them): broker processes on 127.0.0.10-12 with
  ``transactional.id.declaration.required=true`` (an id works only once its resource is Ready),
  their Pods set Ready as a kubelet would, the Coordinator resources, and ``sluice operator`` in a
  subprocess with ``--status-interval-s`` ``--status-interval`` (default 5, the chart's). Each
  broker also serves ``--metrics-listen`` so the DescribeTransactions it answered can be counted
  (``kafka_network_requestmetrics_requests_total{request="DescribeTransactions"}``).
* **N TransactionalId resources** (``--ids``), created by a thread pool (bounded by
  ``--create-timeout``), then the wait until the operator has handled them all (their Ready
  condition True, counted with paged LISTs of 500; bounded by ``--handled-timeout``). Both phases
  print their progress and rates, and how far they got is itself a result when a bound is hit.
* **Activity**: ``--active`` of the ids are used by real transactional producers
  (:class:`sluice.client.Producer`, one thread each) that begin, send one record and commit about
  once a second, so those statuses really change; the rest are idle, as most ids of a large
  installation are at any moment.

Measured over a steady window of ``--seconds`` (after a warm-up of two status intervals): API
server requests (``apiserver_request_total`` deltas, by :func:`bench.metadata_scale.scrape`) as
writes/s (POST, PUT, PATCH, DELETE) and reads/s (GET, LIST; WATCH apart) overall and by verb and
resource, API Priority-and-Fairness rejections, etcd's database size; the CPU of the operator
process and of each broker (utime + stime from ``/proc/<pid>/stat``, as % of one core); the
DescribeTransactions the brokers answered (and the other RPCs, by name: the brokers ask each other
for DescribeTransactions too, so the operator's own work is counted apart from its log: the
status timer calls in the window, ``ids`` / those calls per second being how often each status
was really refreshed; or the status rounds, the window / the rounds being that period; against
the ``--status-interval`` asked). Then the **status
freshness**: for one idle probe id, ``--freshness-reps`` times, begin a transaction and time until
its resource's ``status.state`` says Ongoing, commit and time until it no longer does (each wait
bounded by ``--freshness-timeout``). That is the lag a user of ``kubectl get transactionalids``
sees, and the one figure that shows an operator which keeps its write rate low by falling behind.
Finally the operator's log (``operator.log`` in the work directory, kept after the run) is
summarised: warnings, errors and tracebacks by message.

Everyone authenticates as the control plane's admin (``system:masters``), as the tests do; API
Priority and Fairness exempts it, so APF rejections are reported but cannot happen here.

Results: ``bench/results/txnids-scale.json`` (``--stem`` names another; keyed by id count: a run
replaces its own entry and keeps the others) and ``txnids-scale.md`` (a table). Every wait here is
bounded in time and every loop in count; brokers, operator and control plane are stopped at the
end, whatever happens.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":
    # Run as a file, Python puts bench/ first on the path; import bench.* and tests.* from the root.
    sys.path[0] = str(ROOT)

from bench.metadata_scale import RESULTS, WRITE_VERBS, ServerMetrics, log, parse_metrics, scrape  # noqa: E402
from sluice.client import Producer  # noqa: E402
from sluice.testing._process import ManagedProcess  # noqa: E402

V1 = "sluice.dev/v1alpha1"
GROUP, VERSION, PLURAL = "sluice.dev", "v1alpha1", "transactionalids"
TOPIC = "txnsim"
READ_VERBS = ("GET", "LIST")
PAGE = 500
STEM = "txnids-scale"
CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- small helpers -----------------------------------------------------------------------------


def cpu_seconds(pid: int | None) -> float:
    """utime + stime of ``pid`` in seconds (0 when it is gone)."""
    if pid is None:
        return 0.0
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = text.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of proc(5)


def rss_mb(pid: int | None) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except (OSError, ValueError):
        pass
    return 0.0


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return {}


def txn_id(name: str) -> dict[str, Any]:
    return {"apiVersion": V1, "kind": "TransactionalId", "metadata": {"name": name}, "spec": {"transactionalId": name}}


def id_name(i: int) -> str:
    return f"txn-{i:05d}"


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / interval) + 2):
        try:
            if predicate():
                return True
        except Exception:  # a resource not there yet, a broker moving: not yet
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
    return False


def broker_requests(url: str) -> Counter[str]:
    """RPCs a broker answered, by name (``kafka_network_requestmetrics_requests_total``)."""
    out: Counter[str] = Counter()
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
    except OSError:
        return out
    for _name, labels, value in parse_metrics(text, ("kafka_network_requestmetrics_requests_total",)):
        out[labels.get("request", "")] += int(value)
    return out


TIMER_DONE = "Timer 'transactional_id_status' succeeded"  # the operator before status rounds: a timer per id
ROUND_DONE = "TransactionalId status round:"  # since: one round refreshes every id (logged when any changed)


def timer_calls(path: Path, start: str, end: str) -> dict[str, Any]:
    """The TransactionalId status timer calls the operator logged in [start, end) (UTC, its log's format).

    Kopf logs one line per call that succeeded; the calls per second against the ``ids / interval``
    asked say how often each status is really refreshed (DescribeTransactions cannot say it alone:
    the brokers also ask each other for it, KIP-890's verification of the active producers).
    """
    calls = rounds = 0
    round_seconds: list[float] = []
    try:
        with path.open(errors="replace") as f:
            for line in f:
                stamp = line[:19]
                if not start <= stamp < end:
                    continue
                if TIMER_DONE in line:
                    calls += 1
                elif ROUND_DONE in line:
                    rounds += 1
                    with contextlib.suppress(ValueError, IndexError):
                        round_seconds.append(float(line.rsplit(" in ", 1)[1].split()[0]))
    except OSError:
        return {}
    seconds = (
        time.mktime(time.strptime(end, "%Y-%m-%d %H:%M:%S")) - time.mktime(time.strptime(start, "%Y-%m-%d %H:%M:%S"))
    ) or 1.0
    out: dict[str, Any] = {"status_timer_calls": calls, "status_timer_calls_per_s": round(calls / seconds, 2)}
    if rounds:
        out.update(
            status_rounds=rounds,
            status_round_period_s=round(seconds / rounds, 2),
            status_round_seconds_max=max(round_seconds, default=0.0),
        )
    return out


# -- the active producers ------------------------------------------------------------------------


@dataclass
class ActiveProducers:
    """``ids`` used by one transactional producer each, one transaction about every second."""

    bootstrap: str
    ids: list[str]
    stop: threading.Event = field(default_factory=threading.Event)
    commits: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    threads: list[threading.Thread] = field(default_factory=list)
    max_iterations: int = 100_000

    def start(self) -> None:
        for k, name in enumerate(self.ids):
            t = threading.Thread(target=self._run, args=(k, name), name=f"producer-{name}", daemon=True)
            t.start()
            self.threads.append(t)

    def _run(self, k: int, name: str) -> None:
        producer: Producer | None = None
        for _ in range(self.max_iterations):
            if self.stop.is_set():
                break
            started = time.monotonic()
            try:
                if producer is None:
                    producer = Producer(self.bootstrap, transactional_id=name, transaction_timeout_ms=60_000)
                    producer.init_transactions(timeout=30)
                producer.begin_transaction()
                producer.send(TOPIC, value=f"{name}-{started}".encode(), partition=k % 3)
                producer.commit_transaction(timeout=30)
                self.commits[name] += 1
            except Exception as exc:  # count it and start again with a new producer
                self.errors[f"{type(exc).__name__}: {str(exc)[:80]}"] += 1
                if producer is not None:
                    with_timeout_close(producer)
                producer = None
                self.stop.wait(1.0)
            self.stop.wait(max(0.0, 1.0 - (time.monotonic() - started)))
        if producer is not None:
            with_timeout_close(producer)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=40)


def with_timeout_close(producer: Producer) -> None:
    with contextlib.suppress(Exception):
        producer.close(timeout=10)


# -- the run -------------------------------------------------------------------------------------


class TxnIdsRun:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.plane: Any = None
        self.cluster: Any = None
        self.metrics_urls: list[str] = []
        self.names = [id_name(i) for i in range(args.ids)]
        self.result: dict[str, Any] = {
            "ids": args.ids,
            "active": args.active,
            "status_interval_s": args.status_interval,
            "seconds": args.seconds,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "workdir": str(workdir),
        }

    # -- set-up -------------------------------------------------------------------------------

    def start(self) -> None:
        from tests.k8s.crds import install_crds
        from tests.k8s.sluice_on_k8s import HOSTS, SluiceOnK8s, common_port
        from tests.support.k8s_env import TestControlPlane

        log("starting etcd (fsync on) and kube-apiserver")
        self.plane = TestControlPlane(self.workdir / "k8s", etcd_fsync=True)
        self.plane.start()
        install_crds(self.plane)
        namespace = self.plane.create_namespace("txnsim")
        self.plane.kubectl("apply", "-n", namespace, "-f", str(ROOT / "manifests/operator/peering.yaml"))
        cluster = SluiceOnK8s(self.plane, namespace, self.workdir / "sluice")
        self.cluster = cluster
        metrics_port = common_port(HOSTS[: cluster.count], after=cluster.inter_broker_port)
        log(f"starting {cluster.count} brokers (metrics on port {metrics_port})")
        for i in range(cluster.count):
            cluster.create_pod(i)
            cluster.set_ready(i, False)
            # broker_args are read when start_broker builds the command line: one metrics address each
            cluster.broker_args = ["--metrics-listen", f"{HOSTS[i]}:{metrics_port}"]
            cluster.start_broker(i, {"transactional.id.declaration.required": "true"})
            self.metrics_urls.append(f"http://{HOSTS[i]}:{metrics_port}/metrics")
        cluster.broker_args = []
        for i in range(cluster.count):
            cluster.wait_serving(i)
            cluster.set_ready(i, True)
        log(f"starting the operator (--status-interval-s {self.args.status_interval})")
        # argparse: the last --status-interval-s wins over the 1 s SluiceOnK8s passes
        cluster.start_operator("--status-interval-s", str(self.args.status_interval))
        for kind in ("transaction", "group"):
            cluster.apply(
                {
                    "apiVersion": V1,
                    "kind": "Coordinator",
                    "metadata": {"name": f"{kind}s"},
                    "spec": {"type": kind, "partitions": 4, "replicationFactor": 3},
                }
            )
        cluster.apply(
            {
                "apiVersion": V1,
                "kind": "Topic",
                "metadata": {"name": TOPIC},
                "spec": {"partitions": 3, "replicationFactor": 3},
            }
        )

        def topic_ready() -> bool:
            return condition(cluster.get("topics", TOPIC), "Ready").get("status") == "True"

        if not wait_until(topic_ready, 120):
            raise RuntimeError(f"Topic {TOPIC} not Ready within 120 s\n{cluster.logs()}")
        log("cluster ready")

    # -- phases -------------------------------------------------------------------------------

    def create_ids(self) -> int:
        """Create the resources with a thread pool, until done or ``--create-timeout``; returns how many exist."""
        custom, ns = self.cluster.custom, self.cluster.namespace
        deadline = time.monotonic() + self.args.create_timeout
        created: Counter[str] = Counter()
        lock = threading.Lock()

        def create(name: str) -> None:
            if time.monotonic() >= deadline:
                with lock:
                    created["skipped"] += 1
                return
            for _attempt in range(5):
                try:
                    custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, txn_id(name))
                    outcome = "created"
                    break
                except Exception as exc:
                    if getattr(exc, "status", None) == 409:
                        outcome = "created"  # already there
                        break
                    outcome = f"error {getattr(exc, 'status', type(exc).__name__)}"
                    time.sleep(0.5)
            with lock:
                created[outcome] += 1

        log(f"creating {len(self.names)} TransactionalId resources ({self.args.create_workers} threads)")
        t0 = time.monotonic()
        with ThreadPoolExecutor(self.args.create_workers) as pool:
            futures = [pool.submit(create, name) for name in self.names]
            last = 0.0
            while not all(f.done() for f in futures[-50:]) or not all(f.done() for f in futures):
                time.sleep(1.0)
                if time.monotonic() - last >= 5:
                    last = time.monotonic()
                    with lock:
                        done = created["created"]
                        snapshot = dict(created)
                    elapsed = time.monotonic() - t0
                    log(f"  created {done}/{len(self.names)} in {elapsed:.0f} s ({done / elapsed:.1f}/s) {snapshot}")
                if time.monotonic() > deadline + 120:  # the pool's calls check the deadline: a safety net
                    break
        elapsed = time.monotonic() - t0
        done = created["created"]
        self.result["create"] = {
            "seconds": round(elapsed, 1),
            "created": done,
            "per_s": round(done / elapsed, 1) if elapsed else 0.0,
            "outcomes": dict(created),
            "complete": done == len(self.names),
        }
        log(f"created {done} in {elapsed:.0f} s ({done / max(elapsed, 1e-9):.1f}/s); outcomes {dict(created)}")
        return done

    def count_ready(self) -> tuple[int, int]:
        """(resources, resources whose Ready condition is True), by paged LISTs of ``PAGE``."""
        custom, ns = self.cluster.custom, self.cluster.namespace
        total = ready = 0
        token: str | None = None
        for _page in range(len(self.names) // PAGE + 5):
            kwargs: dict[str, Any] = {"limit": PAGE}
            if token:
                kwargs["_continue"] = token
            page = custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, **kwargs)
            for obj in page.get("items", []):
                total += 1
                if condition(obj, "Ready").get("status") == "True":
                    ready += 1
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                break
        return total, ready

    def wait_handled(self, expected: int) -> None:
        log(
            f"waiting for the operator to handle {expected} resources (Ready=True),"
            f" at most {self.args.handled_timeout:.0f} s"
        )
        t0 = time.monotonic()
        deadline = t0 + self.args.handled_timeout
        ready = total = 0
        samples: list[tuple[float, int]] = []
        for _ in range(100_000):
            try:
                total, ready = self.count_ready()
            except Exception as exc:
                log(f"  LIST failed: {exc}")
            elapsed = time.monotonic() - t0
            samples.append((round(elapsed, 1), ready))
            log(f"  {ready}/{expected} Ready after {elapsed:.0f} s (resources: {total})")
            if ready >= expected or time.monotonic() >= deadline:
                break
            time.sleep(min(10.0, max(0.0, deadline - time.monotonic())))
        elapsed = time.monotonic() - t0
        rate = 0.0
        if len(samples) >= 2 and samples[-1][0] > samples[0][0]:
            rate = (samples[-1][1] - samples[0][1]) / (samples[-1][0] - samples[0][0])
        self.result["handled"] = {
            "seconds_after_create": round(elapsed, 1),
            "ready": ready,
            "expected": expected,
            "complete": ready >= expected,
            "per_s_while_waiting": round(rate, 1),
            "progress": samples[-30:],
        }

    def measure(self) -> dict[str, Any]:
        cluster = self.cluster
        operator: ManagedProcess = cluster.operator
        brokers: dict[int, ManagedProcess] = cluster.brokers
        before = scrape(self.plane)
        op_cpu0 = cpu_seconds(operator.pid)
        br_cpu0 = {i: cpu_seconds(p.pid) for i, p in brokers.items()}
        rpcs0 = [broker_requests(u) for u in self.metrics_urls]
        t0 = time.monotonic()
        wall0 = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
        log(f"steady window: {self.args.seconds:.0f} s")
        end = t0 + self.args.seconds
        for _ in range(int(self.args.seconds) + 2):
            left = end - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(10.0, left))
            if end - time.monotonic() > 0.5:
                log(f"  {time.monotonic() - t0:.0f} s of {self.args.seconds:.0f}")
        elapsed = time.monotonic() - t0
        op_cpu = cpu_seconds(operator.pid) - op_cpu0
        br_cpu = {i: cpu_seconds(p.pid) - br_cpu0[i] for i, p in brokers.items()}
        rpcs1 = [broker_requests(u) for u in self.metrics_urls]
        after: ServerMetrics = scrape(self.plane)
        window = self._window(before, after, elapsed, op_cpu, br_cpu, rpcs0, rpcs1)
        window["window_utc"] = [wall0, time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())]
        window.update(timer_calls(self.workdir / "sluice" / "operator.log", *window["window_utc"]))
        return window

    def _window(
        self,
        before: ServerMetrics,
        after: ServerMetrics,
        elapsed: float,
        op_cpu: float,
        br_cpu: dict[int, float],
        rpcs0: list[Counter[str]],
        rpcs1: list[Counter[str]],
    ) -> dict[str, Any]:
        delta = after.requests - before.requests
        writes = sum(n for (verb, _r, _c), n in delta.items() if verb in WRITE_VERBS)
        reads = sum(n for (verb, _r, _c), n in delta.items() if verb in READ_VERBS)
        watches = sum(n for (verb, _r, _c), n in delta.items() if verb == "WATCH")
        by: Counter[str] = Counter()
        by_code: Counter[str] = Counter()
        for (verb, resource, code), n in delta.items():
            by[f"{verb} {resource or '(non-resource)'}"] += n
            by_code[f"{verb} {resource or '(non-resource)'} {code}"] += n
        rpcs: Counter[str] = Counter()
        for b0, b1 in zip(rpcs0, rpcs1, strict=True):
            rpcs.update(b1 - b0)
        server = after.minus(before)
        operator: ManagedProcess = self.cluster.operator
        return {
            "seconds": round(elapsed, 1),
            "writes_per_s": round(writes / elapsed, 2),
            "reads_per_s": round(reads / elapsed, 2),
            "watch_requests_per_s": round(watches / elapsed, 2),
            "per_s_by_verb_resource": {k: round(n / elapsed, 2) for k, n in by.most_common()},
            "count_by_verb_resource_code": dict(by_code.most_common()),
            "apf_rejected": server["apf_rejected"],
            "etcd_db_bytes": server["etcd_db_bytes"],
            "etcd_db_in_use_bytes": server["etcd_db_in_use_bytes"],
            "etcd_fsyncs_per_s": round(server["etcd_fsyncs"] / elapsed, 1),
            "operator_cpu_pct": round(100 * op_cpu / elapsed, 1),
            "operator_rss_mb": rss_mb(operator.pid),
            "broker_cpu_pct": {str(i): round(100 * c / elapsed, 1) for i, c in br_cpu.items()},
            "describe_transactions_per_s": round(rpcs.get("DescribeTransactions", 0) / elapsed, 2),
            "broker_rpcs_per_s": {k: round(n / elapsed, 2) for k, n in rpcs.most_common(12)},
        }

    def freshness(self, probe: str) -> list[dict[str, Any]]:
        """Begin a transaction on ``probe``: until its status says Ongoing; commit: until it no longer does."""
        cluster = self.cluster
        timeout = self.args.freshness_timeout
        state: dict[str, str] = {}

        def status() -> tuple[str, str]:
            st = cluster.get(PLURAL, probe).get("status") or {}
            state["now"] = str(st.get("state"))
            return state["now"], str(st.get("transactionStartTime") or "")

        reps: list[dict[str, Any]] = []
        producer = Producer(
            cluster.bootstrap_servers,
            transactional_id=probe,
            transaction_timeout_ms=int(max(60, 2 * timeout + 60) * 1000),
        )
        try:
            producer.init_transactions(timeout=60)
            for rep in range(self.args.freshness_reps):
                t0 = time.monotonic()
                # this transaction's Ongoing, not a stale one of the repetition before: its start time
                # (whole seconds in the status) is not before this begin
                since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 1))
                producer.begin_transaction()
                producer.send(TOPIC, value=f"probe-{rep}".encode(), partition=0)
                producer.flush(timeout=30)

                def ongoing(since: str = since) -> bool:
                    now, started = status()
                    return now == "Ongoing" and started >= since

                seen = wait_until(ongoing, timeout, 0.2)
                ongoing_s = round(time.monotonic() - t0, 2) if seen else None
                producer.commit_transaction(timeout=30)
                t1 = time.monotonic()
                # only meaningful once the status had said Ongoing (else it still shows an older state)
                gone = seen and wait_until(lambda: status()[0] not in ("Ongoing", ""), timeout, 0.2)
                after_s = round(time.monotonic() - t1, 2) if gone else None
                row = {"ongoing_s": ongoing_s, "not_ongoing_s": after_s, "final_state": state.get("now")}
                reps.append(row)
                log(f"  freshness {rep + 1}/{self.args.freshness_reps}: {row}")
        finally:
            with_timeout_close(producer)
        return reps

    def operator_log(self) -> dict[str, Any]:
        path = self.workdir / "sluice" / "operator.log"
        levels: Counter[str] = Counter()
        messages: Counter[str] = Counter()
        tracebacks = 0
        lines = 0
        try:
            with path.open(errors="replace") as f:
                for line in f:
                    lines += 1
                    if line.startswith("Traceback"):
                        tracebacks += 1
                    m = re.search(r"\b(WARNING|ERROR|CRITICAL)\b", line)
                    if m:
                        levels[m.group(1)] += 1
                        text = line[m.end() :].strip()
                        text = re.sub(r"\d+(\.\d+)?", "N", text)  # one message, not one per id and time
                        text = re.sub(r"txn-N", "txn-*", text)
                        messages[text[:160]] += 1
        except OSError as exc:
            return {"path": str(path), "error": str(exc)}
        return {
            "path": str(path),
            "lines": lines,
            "by_level": dict(levels),
            "tracebacks": tracebacks,
            "top_messages": dict(messages.most_common(8)),
        }

    def run(self) -> dict[str, Any]:
        self.start()
        created = self.create_ids()
        self.wait_handled(created)
        active_ids = self.names[: min(self.args.active, created)]
        probe = self.names[created - 1] if created > len(active_ids) else None
        log(f"starting {len(active_ids)} transactional producers (a transaction about every second each)")
        producers = ActiveProducers(self.cluster.bootstrap_servers, active_ids)
        producers.start()
        try:
            warm = 2 * self.args.status_interval
            log(f"warm-up {warm:.0f} s")
            time.sleep(warm)
            commits0 = sum(producers.commits.values())
            window = self.measure()
            window["active_commits_per_s"] = round((sum(producers.commits.values()) - commits0) / window["seconds"], 2)
            self.result["steady"] = window
            log(summary_line(self.result))
            if probe is not None:
                log(f"status freshness on {probe} ({self.args.freshness_reps} repetitions)")
                self.result["freshness"] = self.freshness(probe)
        finally:
            producers.close()
            self.result["active_errors"] = dict(producers.errors.most_common(8))
        self.result["operator_log"] = self.operator_log()
        self.result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return self.result

    def close(self) -> None:
        try:
            if self.cluster is not None:
                self.cluster.close()
        finally:
            if self.plane is not None:
                self.plane.stop()


# -- reports -------------------------------------------------------------------------------------


def summary_line(r: dict[str, Any]) -> str:
    s = r.get("steady") or {}
    top5 = ", ".join(f"{k} {v}" for k, v in top(s.get("per_s_by_verb_resource") or {}, 5))
    return (
        f"{r['ids']} ids: writes {s.get('writes_per_s')}/s, reads {s.get('reads_per_s')}/s ({top5}); "
        f"operator CPU {s.get('operator_cpu_pct')}%, DescribeTransactions {s.get('describe_transactions_per_s')}/s"
    )


def top(rates: dict[str, float], n: int) -> list[tuple[str, float]]:
    """The ``n`` largest (the JSON file keeps its keys sorted by name, not by rate)."""
    return sorted(rates.items(), key=lambda kv: -kv[1])[:n]


def per_s_of(label: str) -> Callable[[dict[str, Any]], Any]:
    def get(r: dict[str, Any]) -> Any:
        return r["steady"]["per_s_by_verb_resource"].get(label, 0)

    return get


def effective_period(r: dict[str, Any]) -> Any:
    """How often each id's status was really refreshed: with status rounds, the window / the rounds
    (each refreshes every id); with a timer per id, ids / the timer calls per second."""
    if r["steady"].get("status_rounds"):
        return r["steady"]["status_round_period_s"]
    per_s = r["steady"]["status_timer_calls_per_s"]
    return round(r["ids"] / per_s, 1) if per_s else "-"


def markdown(runs: dict[str, Any]) -> str:
    keys = sorted(runs, key=int)
    out = [
        "# TransactionalIds at scale (bench/txnids_scale.py)",
        "",
        "Issue 28's target: steady API-server writes under 20/s with 10,000 TransactionalIds. "
        "3 real brokers, the real operator, a real kube-apiserver and etcd (fsync on); "
        "figures per second over the steady window. Made by `python bench/txnids_scale.py --ids N`.",
        "",
        "| | " + " | ".join(f"{k} ids" for k in keys) + " |",
        "|---|" + "---|" * len(keys),
    ]

    def row(label: str, fn: Callable[[dict[str, Any]], Any]) -> None:
        cells = []
        for k in keys:
            try:
                cells.append(str(fn(runs[k])))
            except (KeyError, TypeError, IndexError):
                cells.append("-")
        out.append(f"| {label} | " + " | ".join(cells) + " |")

    row("run started (UTC)", lambda r: r["started"])
    row("status interval (s); active ids", lambda r: f"{r['status_interval_s']}; {r['active']}")
    row(
        "created (per s); complete",
        lambda r: f"{r['create']['created']} ({r['create']['per_s']}); {r['create']['complete']}",
    )
    row(
        "Ready (s after creation); complete",
        lambda r: f"{r['handled']['ready']} ({r['handled']['seconds_after_create']}); {r['handled']['complete']}",
    )
    row("steady window (s)", lambda r: r["steady"]["seconds"])
    row("**API writes/s**", lambda r: f"**{r['steady']['writes_per_s']}**")
    row("API reads/s (GET+LIST)", lambda r: r["steady"]["reads_per_s"])
    for label in (
        "PATCH transactionalids",
        "GET transactionalids",
        "LIST transactionalids",
        "GET metadatadocuments",
        "PUT metadatadocuments",
        "POST events",
        "PATCH events",
    ):
        row(f"&nbsp; {label} /s", per_s_of(label))
    row(
        "top 5 by verb+resource /s",
        lambda r: "; ".join(f"{k} {v}" for k, v in top(r["steady"]["per_s_by_verb_resource"], 5)),
    )
    row("APF rejections", lambda r: r["steady"]["apf_rejected"])
    row("etcd db (MB)", lambda r: round(r["steady"]["etcd_db_bytes"] / 1e6, 1))
    row(
        "operator CPU (% of a core); RSS MB",
        lambda r: f"{r['steady']['operator_cpu_pct']}; {r['steady']['operator_rss_mb']}",
    )
    row("broker CPU (% of a core)", lambda r: " / ".join(str(v) for v in r["steady"]["broker_cpu_pct"].values()))
    row("DescribeTransactions served /s", lambda r: r["steady"]["describe_transactions_per_s"])
    row("active commits /s", lambda r: r["steady"]["active_commits_per_s"])
    row("status timer calls /s asked (ids / interval)", lambda r: round(r["ids"] / r["status_interval_s"], 1))
    row("status timer calls /s done (operator log)", lambda r: r["steady"]["status_timer_calls_per_s"])
    row(
        "status rounds in the window; longest round (s)",
        lambda r: f"{r['steady'].get('status_rounds', '-')}; {r['steady'].get('status_round_seconds_max', '-')}",
    )
    row("effective status period (s): ids / calls done per s", effective_period)
    row(
        "freshness: begin -> Ongoing (s)",
        lambda r: " / ".join(str(x["ongoing_s"]) for x in r["freshness"]),
    )
    row(
        "freshness: commit -> not Ongoing (s)",
        lambda r: " / ".join(str(x["not_ongoing_s"]) if x["ongoing_s"] is not None else "-" for x in r["freshness"]),
    )
    row("operator log: warnings / errors / tracebacks", lambda r: "{} / {} / {}".format(
        r["operator_log"]["by_level"].get("WARNING", 0),
        r["operator_log"]["by_level"].get("ERROR", 0),
        r["operator_log"]["tracebacks"],
    ))  # fmt: skip
    out.append("")
    out.append(
        "`None` in a freshness cell: not seen within the run's --freshness-timeout (120 s);"
        " `-`: not measured, Ongoing was never seen."
    )
    for k in keys:
        frequent = (runs[k].get("operator_log") or {}).get("top_messages") or {}
        if frequent:
            out += ["", f"Operator log, {k} ids, most frequent warnings/errors:", ""]
            out += [f"- {n} x `{m}`" for m, n in frequent.items()]
    return "\n".join(out) + "\n"


def write_reports(runs: dict[str, Any], stem: str = STEM) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(runs, indent=2, sort_keys=True) + "\n")
    (RESULTS / f"{stem}.md").write_text(markdown(runs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--ids", type=int, default=10_000, help="TransactionalId resources")
    parser.add_argument("--seconds", type=float, default=60.0, help="the steady window")
    parser.add_argument("--active", type=int, default=20, help="ids used by a producer (a transaction per second)")
    parser.add_argument("--status-interval", type=float, default=5.0, help="the operator's --status-interval-s")
    parser.add_argument("--create-workers", type=int, default=8)
    parser.add_argument("--create-timeout", type=float, default=900.0, help="seconds for creating, at most")
    parser.add_argument("--handled-timeout", type=float, default=900.0, help="seconds for all to be Ready, at most")
    parser.add_argument("--freshness-reps", type=int, default=3)
    parser.add_argument("--freshness-timeout", type=float, default=120.0, help="seconds per freshness wait, at most")
    parser.add_argument("--workdir", type=Path, help="kept after the run (default: a new directory under /tmp)")
    parser.add_argument("--report-only", action="store_true", help="write the .md from the .json again")
    parser.add_argument("--stem", default=STEM, help=f"results file names in bench/results/ (default {STEM})")
    args = parser.parse_args(argv)
    if args.ids < 1:
        parser.error("--ids must be at least 1")
    path = RESULTS / f"{args.stem}.json"
    runs: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    if args.report_only:
        write_reports(runs, args.stem)
        return 0
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="txnsim-"))
    workdir.mkdir(parents=True, exist_ok=True)
    log(f"== {args.ids} TransactionalIds; work directory (kept: operator.log, broker logs) {workdir} ==")
    sim = TxnIdsRun(args, workdir)
    try:
        runs[str(args.ids)] = sim.run()
    except BaseException as exc:  # keep how far it got, then fail
        sim.result["error"] = f"{type(exc).__name__}: {exc}"[:500]
        sim.result["operator_log"] = sim.operator_log()
        runs[str(args.ids)] = sim.result
        raise
    finally:
        sim.close()
        write_reports(runs, args.stem)
    log(summary_line(runs[str(args.ids)]))
    log(f"results: {RESULTS / args.stem}.json, .md; operator log {workdir / 'sluice' / 'operator.log'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
