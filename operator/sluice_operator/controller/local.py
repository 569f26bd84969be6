"""The embedded cluster's controller process: ``python -m sluice.operator.controller.local``.

One per local cluster (LocalCluster and ``sluice dev up`` start it), next to
the brokers, sharing their metadata file. Every ``interval_ms`` it:

1. lists the registered brokers (``brokers/<id>``: brokers register
   themselves at start and are never removed when they die),
2. health-checks them (:mod:`sluice.operator.liveness.brokers`) and logs
   every broker that dies or comes back,
3. applies :func:`sluice.operator.controller.decisions.elect_leaders` to every topic
   document, then :func:`~sluice.operator.controller.decisions.restore_preferred_leaders`
   with only the brokers alive for ``preferred_leader_delay_ms`` counting (a
   returning broker first catches up and proves it stays up, then takes its
   leaderships back in one move, as Kafka's periodic leader rebalance does),
   and writes each changed one with compare-and-set, logging each
   election ("elected broker 2 leader of orders-0 at epoch 3 (broker 1
   dead)"). A conflict (a leader changed its ISR meanwhile) means re-read
   and re-decide: the decision is a pure function of the document and the
   liveness, so deciding again on the new version is always right.
4. writes the ``controller`` document when liveness changes, for
   observability: ``{"controller_id": -1, "epoch": n, "live_brokers": [..],
   "dead_brokers": [..], "updated_ms": ..}``. Brokers ignore it.

Every topic is reconsidered every round, not only changed ones: the rules
are idempotent (a second pass changes nothing), so this is also the repair
for anything a crashed controller left half done, at the cost of reading
every topic document a few times a second, which the embedded cluster's
size makes cheap.

Only one controller may act at a time. Each start takes the next
``epoch`` in the ``controller`` document; a controller that finds a higher
epoch there (a newer controller started on the same metadata) stops at once
instead of fighting it. ``controller_id`` is -1 because this controller is
not a broker (as a KRaft controller has its own id space); the Kubernetes
operator will write its own identity.

SIGTERM or SIGINT ends the loop between rounds; the process exits 0.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from sluice.metadata import keys
from sluice.metadata.store import Document, MetadataStore, VersionConflict, open_store, update
from sluice.operator.controller.decisions import describe_changes, elect_leaders, restore_preferred_leaders
from sluice.operator.liveness.brokers import DEFAULT_TIMEOUT_MS, FailureDetector, GrpcHealthChecker, Transition

log = logging.getLogger("sluice.operator.controller.decisions")

DEFAULT_INTERVAL_MS = 100
DEFAULT_PREFERRED_LEADER_DELAY_MS = 10_000
CAS_ATTEMPTS = 20


class Liveness(Protocol):
    """Where liveness comes from: health checks here, Pods in Kubernetes (sluice.operator.liveness.pods)."""

    def poll(self, targets: Mapping[int, str]) -> list[Transition]: ...

    @property
    def live(self) -> frozenset[int]: ...

    @property
    def dead(self) -> frozenset[int]: ...

    def alive_for(self, seconds: float) -> frozenset[int]: ...


# Called after each topic document the controller wrote: (key, old value, new value, live, dead).
ChangeListener = Callable[[str, dict[str, Any], dict[str, Any], frozenset[int], frozenset[int]], None]


class ControllerFenced(Exception):
    """A newer controller (higher epoch) runs on the same metadata: this one must stop."""


def _now_ms() -> int:
    return int(time.time() * 1000)


def broker_address(value: dict[str, Any]) -> str:
    host, port = str(value["host"]), int(value["port"])
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class LocalController:
    """The controller's loop over one MetadataStore (see the module docstring)."""

    def __init__(
        self,
        store: MetadataStore,
        detector: Liveness,
        *,
        preferred_leaders: bool = True,
        preferred_leader_delay_ms: int = DEFAULT_PREFERRED_LEADER_DELAY_MS,
        default_unclean: bool = False,
        clock_ms: Callable[[], int] = _now_ms,
        on_change: ChangeListener | None = None,
    ) -> None:
        self.store = store
        self.detector = detector
        self.on_change = on_change
        self.preferred_leaders = preferred_leaders
        self.preferred_leader_delay_s = preferred_leader_delay_ms / 1000
        self.default_unclean = default_unclean
        self.clock_ms = clock_ms
        self.epoch = -1
        self._published: tuple[frozenset[int], frozenset[int]] | None = None
        self.brokers: dict[int, str] = {}  # registered brokers (id -> address) as of the last round

    # -- the controller document ----------------------------------------------------------------

    def claim(self) -> int:
        """Take the next controller epoch; returns it."""

        def bump(value: dict[str, Any] | None) -> dict[str, Any]:
            return {
                "controller_id": -1,
                "epoch": int((value or {}).get("epoch", 0)) + 1,
                "live_brokers": [],
                "dead_brokers": [],
                "updated_ms": self.clock_ms(),
            }

        doc = update(self.store, keys.CONTROLLER, bump)
        assert doc is not None and doc.value is not None
        self.epoch = int(doc.value["epoch"])
        log.info("controller epoch %d", self.epoch)
        return self.epoch

    def _check_epoch(self) -> None:
        doc = self.store.get(keys.CONTROLLER)
        epoch = int(doc.value.get("epoch", 0)) if doc is not None and doc.value is not None else 0
        if epoch > self.epoch:
            raise ControllerFenced(f"controller epoch {epoch} took over from {self.epoch}")

    def _publish(self) -> None:
        live, dead = self.detector.live, self.detector.dead
        if self._published == (live, dead):
            return

        def write(value: dict[str, Any] | None) -> dict[str, Any]:
            epoch = int((value or {}).get("epoch", 0))
            if epoch > self.epoch:
                raise ControllerFenced(f"controller epoch {epoch} took over from {self.epoch}")
            return {
                "controller_id": -1,
                "epoch": self.epoch,
                "live_brokers": sorted(live),
                "dead_brokers": sorted(dead),
                "updated_ms": self.clock_ms(),
            }

        update(self.store, keys.CONTROLLER, write)
        self._published = (live, dead)

    # -- one round ------------------------------------------------------------------------------

    def registered_brokers(self) -> dict[int, str]:
        out: dict[int, str] = {}
        for doc in self.store.list(keys.BROKERS):
            if doc.value is None:
                continue
            try:
                out[int(doc.value["broker_id"])] = broker_address(doc.value)
            except (KeyError, ValueError, TypeError):
                log.warning("ignoring malformed broker document %s: %r", doc.key, doc.value)
        return out

    def step(self) -> int:
        """One round: check liveness, reconcile every topic. Returns the number of documents written."""
        self._check_epoch()
        self.brokers = self.registered_brokers()
        for change in self.detector.poll(self.brokers):
            log.info("%s", change.describe())
        self._publish()
        written = 0
        for doc in self.store.list(keys.TOPICS):
            written += self.reconcile(doc)
        return written

    def reconcile(self, doc: Document | None) -> int:
        """Apply the rules to one topic document with compare-and-set; 1 if it was written."""
        live, dead = self.detector.live, self.detector.dead
        for _ in range(CAS_ATTEMPTS):
            if doc is None or doc.value is None:
                return 0
            current = doc.value
            new = elect_leaders(current, live, dead, default_unclean=self.default_unclean)
            if self.preferred_leaders:
                settled = self.detector.alive_for(self.preferred_leader_delay_s)
                new = restore_preferred_leaders(new or current, settled) or new
            if new is None:
                return 0
            try:
                self.store.compare_and_set(doc.key, new, doc.version)
            except VersionConflict:
                doc = self.store.get(doc.key)
                continue
            for line in describe_changes(current, new, live, dead):
                log.info("%s", line)
            if self.on_change is not None:
                try:
                    self.on_change(doc.key, current, new, live, dead)
                except Exception:
                    log.exception("reporting the change of %s failed", doc.key)
            return 1
        log.warning("%s kept changing under the controller; trying again next round", doc.key if doc else "?")
        return 0

    def run(self, stop: threading.Event, interval_ms: int = DEFAULT_INTERVAL_MS) -> None:
        """Rounds every ``interval_ms`` until ``stop`` is set (or a newer controller fences this one)."""
        if self.epoch < 0:
            self.claim()
        while not stop.is_set():
            started = time.monotonic()
            try:
                self.step()
            except ControllerFenced as exc:
                log.warning("stopping: %s", exc)
                return
            except Exception:
                log.exception("controller round failed; trying again")
            stop.wait(max(0.0, interval_ms / 1000 - (time.monotonic() - started)))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m sluice.operator.controller.local",
        description="Run the embedded cluster's controller: failure detection and leader election.",
    )
    ap.add_argument("--metadata", required=True, help="the cluster's metadata store (a SQLite file path)")
    ap.add_argument(
        "--failure-timeout-ms",
        type=int,
        default=DEFAULT_TIMEOUT_MS,
        help=f"a broker is dead after failing health checks this long (default {DEFAULT_TIMEOUT_MS})",
    )
    ap.add_argument(
        "--interval-ms", type=int, default=DEFAULT_INTERVAL_MS, help="time between rounds (default %(default)s)"
    )
    ap.add_argument(
        "--check-timeout-ms",
        type=int,
        default=None,
        help="deadline of one health check (default: the failure timeout; checks never hold up a round)",
    )
    ap.add_argument(
        "--preferred-leaders",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="move leadership back to in-sync preferred replicas (Kafka's auto.leader.rebalance.enable)",
    )
    ap.add_argument(
        "--preferred-leader-delay-ms",
        type=int,
        default=DEFAULT_PREFERRED_LEADER_DELAY_MS,
        help="a returning broker takes its preferred leaderships back once alive this long (default %(default)s)",
    )
    ap.add_argument(
        "--unclean-leader-election",
        action="store_true",
        help="default of unclean.leader.election.enable for topics that do not set it",
    )
    ap.add_argument("--log-level", default="INFO")
    args = ap.parse_args(argv)
    if args.failure_timeout_ms <= 0 or args.interval_ms <= 0:
        ap.error("--failure-timeout-ms and --interval-ms must be positive")
    if args.preferred_leader_delay_ms < 0:
        ap.error("--preferred-leader-delay-ms must not be negative")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s [controller] %(name)s: %(message)s",
        stream=sys.stderr,
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    deadline_ms = args.check_timeout_ms or args.failure_timeout_ms
    checker = GrpcHealthChecker(deadline_ms)
    store = open_store(args.metadata)
    controller = LocalController(
        store,
        FailureDetector(checker, timeout_ms=args.failure_timeout_ms),
        preferred_leaders=args.preferred_leaders,
        preferred_leader_delay_ms=args.preferred_leader_delay_ms,
        default_unclean=args.unclean_leader_election,
    )
    log.info(
        "controller on %s: failure timeout %d ms, rounds every %d ms, checks with a %d ms deadline",
        args.metadata,
        args.failure_timeout_ms,
        args.interval_ms,
        deadline_ms,
    )
    try:
        controller.run(stop, args.interval_ms)
    finally:
        checker.close()
        store.close()
    log.info("controller stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
