"""The controller loop: one round of liveness, elections and ISR fencing over a MetadataStore.

:class:`ControllerLoop` is the controller itself, independent of where it
runs: the embedded cluster's controller process (:mod:`sluice.operator.controller.local`)
drives it with gRPC health checks, the Kubernetes operator
(:mod:`sluice.operator.controller.kubernetes`) with broker Pod liveness under a
Lease. Every round it:

1. lists the registered brokers (``brokers/<id>``: brokers register
   themselves at start and are never removed when they die),
2. polls its liveness source and logs every broker that dies or comes back, and takes a snapshot
   of it that the whole round decides with,
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
   A broker whose ``brokers/<id>`` document names a ``log_dir_failure`` (its disk is full or
   failing: it can neither lead nor follow) counts as dead whatever its health checks say, as
   KRaft fences a broker that reports its only log directory offline: it leaves every ISR and
   its leaderships move at once. The change is logged and reported to ``on_log_dir`` (the
   Kubernetes controller posts an Event on the broker's Pod); a restart clears the field.
   ``log_dir_low_space`` (the data volume nearly full) is only a warning: logged and reported to
   ``on_log_dir_space`` when it changes, nothing else.
4. writes the ``controller`` document (:class:`~sluice.metadata.documents.ControllerDocument`)
   when liveness changes: leaders read its ``dead_brokers``.

**Liveness has a thread of its own** (:meth:`ControllerLoop.watch_liveness`, run next to the
rounds by :meth:`ControllerLoop.run` and by the Kubernetes controller): it polls the detector every
100 ms and writes the ``controller`` document as soon as a broker changes state, then wakes the
next round. At 100,000 partitions a round may take seconds, and a death that waited for the round
in progress to end was published up to that much later (the metadata simulation measured a lost
node declared dead 8.6-9 s after it failed and published at 10.4 s). The round in progress keeps
deciding on the snapshot it took, so no decision mixes two liveness views; the next round, woken
at once, elects. The detector and the document are guarded by one lock, and only rounds open
partition change records (a round never sees ``partition_changes`` move under it).

**Preferred leaders move in one write per topic.** A returning broker is re-admitted to the ISRs
of its partitions one at a time, as each leader sees it catch up; handing leadership back as each
admission lands rewrote a topic's whole document once per round of admissions (the metadata
simulation, bench/metadata_scale.py, measured 1,614 controller writes in a rolling restart of 10
brokers, most of them racing the leaders' ISR writes). So while a topic has a partition whose
preferred replica is settled but still *catching up* (live, not yet in the ISR, under a live
leader), its preferred-leader moves wait, up to ``preferred_leader_hold_ms`` from the first round
that could have moved one; then every eligible partition of the topic moves in one write, as
Kafka's periodic preferred-leader election does all imbalanced partitions at once. Elections and
fencing never wait: a write they need carries whatever preferred moves are eligible then.

Every topic is reconsidered every round, not only changed ones: the rules
are idempotent (a second pass changes nothing), so this is also the repair
for anything a crashed controller left half done (a new controller decides
every topic in its first round). What is not repeated is work whose answer
is known: the rules are pure functions of a topic document and the liveness
sets (with ``default_unclean``, fixed for a loop), so a
topic whose document (its store-wide ``revision``) and liveness are those of
a round that decided "no change" is not decided again, and the documents
are read from the store's changes since the last round, each decoded once.
So are the ``brokers/`` and ``controller`` documents: over Kubernetes, ``changes_since`` is
served by the store's watch cache (an informer), so an idle round makes no request to the API
server at all (it made a quorum GET and a quorum LIST, 20 reads/s at 100 ms rounds). The epoch
check may then see a newer controller a watch delay late; that is safe because every write is a
compare-and-set on the version the decision was made from, and the newer controller re-decides
every topic in its first round (and in Kubernetes the Lease keeps a second controller off anyway).
An idle cluster's round is then the health checks and reads of memory.

Only one controller may act at a time. Each start takes the next
``epoch`` in the ``controller`` document; a controller that finds a higher
epoch there (a newer controller started on the same metadata) stops at once
instead of fighting it (:class:`ControllerFenced`). ``controller_id`` is -1
because this controller is not a broker (as a KRaft controller has its own id
space).

It was called ``LocalController`` while it was only the embedded cluster's;
the Kubernetes operator runs the same loop, so it is named for what it is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from sluice.metadata import documents, keys
from sluice.metadata.documents import (
    METADATA_PARTITION_CHANGES,
    NO_LEADER,
    BrokerDocument,
    ControllerDocument,
    FoldDocument,
    IsrRequest,
    IsrRequestsDocument,
    TopicDocument,
    TopicStateDocument,
    Versioned,
)
from sluice.metadata.isr import IsrChange, IsrOutcome, apply_isr_changes
from sluice.metadata.store import Document, MetadataStore, StoreUnavailable, VersionConflict
from sluice.metadata.topic_view import (
    FOLD_PARTITION_CHANGES,
    FOLD_RECORDS,
    WatchedTopics,
    append_changes,
    changed_partitions,
    record_seq,
)
from sluice.operator import metrics
from sluice.operator.controller.decisions import describe_changes, elect_leaders, restore_preferred_leaders
from sluice.operator.liveness.brokers import Transition

# The controller's log: elections, fencing, liveness changes (the local process and the operator alike).
log = logging.getLogger("sluice.operator.controller")

DEFAULT_INTERVAL_MS = 100
# How often the liveness thread polls the detector between rounds (watch_liveness).
LIVENESS_INTERVAL_MS = 100
DEFAULT_PREFERRED_LEADER_DELAY_MS = 10_000
# How long a topic's preferred-leader moves may wait for its other preferred replicas to catch up
# (module docstring): long enough for a restarted broker's ISR re-admissions to land, short enough
# that one replica that never catches up does not keep leadership off the others for long.
DEFAULT_PREFERRED_LEADER_HOLD_MS = 30_000
CAS_ATTEMPTS = 20
# Topics whose folded state one round writes, and folded records one round deletes (_fold_if_due):
# a fold is spread over rounds.
FOLD_TOPICS_PER_ROUND = 10
FOLD_DELETES_PER_ROUND = 25


class Liveness(Protocol):
    """Where liveness comes from: health checks (sluice.operator.liveness.brokers) or Pods (.liveness.pods)."""

    def poll(self, targets: Mapping[int, str]) -> list[Transition]: ...

    @property
    def live(self) -> frozenset[int]: ...

    @property
    def dead(self) -> frozenset[int]: ...

    def alive_for(self, seconds: float) -> frozenset[int]: ...


# Called after each topic document the controller wrote: (key, old document, new document, live, dead).
ChangeListener = Callable[[str, TopicDocument, TopicDocument, frozenset[int], frozenset[int]], None]
# Called when a broker's log directory goes offline (broker id, the failure) or is back (broker id, "").
LogDirListener = Callable[[int, str], None]
# Called when a broker's data volume runs low on space or has space again: (broker id, low, free, size).
LogDirSpaceListener = Callable[[int, bool, int, int], None]


class ControllerFenced(Exception):
    """A newer controller (higher epoch) runs on the same metadata: this one must stop."""


# What a topic's decision depends on besides default_unclean (fixed for a loop): the document's
# revision, live, dead, settled, and the newest revision of the ISR requests naming the topic.
_Inputs = tuple[int, frozenset[int], frozenset[int], frozenset[int] | None, int]


def _now_ms() -> int:
    return int(time.time() * 1000)


class ControllerLoop:
    """The controller's loop over one MetadataStore (see the module docstring)."""

    def __init__(
        self,
        store: MetadataStore,
        detector: Liveness,
        *,
        preferred_leaders: bool = True,
        preferred_leader_delay_ms: int = DEFAULT_PREFERRED_LEADER_DELAY_MS,
        preferred_leader_hold_ms: int = DEFAULT_PREFERRED_LEADER_HOLD_MS,
        default_unclean: bool = False,
        clock_ms: Callable[[], int] = _now_ms,
        on_change: ChangeListener | None = None,
        on_log_dir: LogDirListener | None = None,
        on_log_dir_space: LogDirSpaceListener | None = None,
        fold_records: int = FOLD_RECORDS,
        fold_changes: int = FOLD_PARTITION_CHANGES,
    ) -> None:
        self.store = store
        self.detector = detector
        self.fold_records, self.fold_changes = fold_records, fold_changes  # when to fold (_fold_if_due)
        self.on_change = on_change
        self.on_log_dir = on_log_dir
        self.log_dir_failures: dict[int, str] = {}  # broker id -> why its log directory is offline
        self.on_log_dir_space = on_log_dir_space
        self.low_space: set[int] = set()  # brokers whose data volume is nearly full
        self.preferred_leaders = preferred_leaders
        self.preferred_leader_delay_s = preferred_leader_delay_ms / 1000
        self.preferred_leader_hold_s = preferred_leader_hold_ms / 1000
        # Per topic key: the clock (ms) of the first round whose preferred moves were held back
        # because other preferred replicas of the topic were still catching up.
        self._held_since: dict[str, int] = {}
        self._held_inputs: dict[str, _Inputs] = {}  # the inputs of the last round that held them
        self.default_unclean = default_unclean
        self.clock_ms = clock_ms
        self.epoch = -1
        self._published: tuple[frozenset[int], frozenset[int]] | None = None
        # The detector is polled and the controller document written by rounds and by the liveness
        # thread (watch_liveness) alike: one at a time. A round decides on its own snapshot.
        self._liveness_lock = threading.RLock()
        self._round_liveness: tuple[frozenset[int], frozenset[int]] = (frozenset(), frozenset())
        self._settled: frozenset[int] | None = None  # alive for preferred_leader_delay_ms, this round
        self.wake = threading.Event()  # set by the liveness thread when a broker changed state
        self._folding: tuple[int, list[str]] | None = None  # a fold under way: (its last record, topics left)
        self._to_delete: list[Document] = []  # records the last fold folded, not deleted yet
        self.rounds = 0  # rounds run (the liveness thread waits for the first: it lists the brokers)
        self.brokers: dict[int, str] = {}  # registered brokers (id -> address) as of the last round
        # Per topic key: the inputs (revision, live, dead, settled) of its last decision that changed
        # nothing; the same inputs decide the same (the rules are pure), so they are not decided again.
        self._unchanged: dict[str, _Inputs] = {}
        # Every topic, composed from declarations and partition change records, as of the last round,
        # and the store revision it is current to.
        self.topics = WatchedTopics(store)
        # Partition states are written as change records (ControllerDocument.partition_changes): as
        # published in the controller document; opened once every registered broker reads them.
        self.partition_changes = False
        # The brokers/ and controller documents as of the last round, and the revision each prefix
        # is current to (read from the store's changes, not a quorum read per round).
        self._watched: dict[str, Document] = {}
        self._watched_revision: dict[str, int] = {keys.BROKERS: 0, keys.CONTROLLER: 0, keys.ISR_REQUESTS: 0}
        # Leaders' ISR requests by topic key, as of the last round: [(revision, broker, request)].
        self._requests: dict[str, list[tuple[int, int, IsrRequest]]] = {}
        self._requests_decoded: dict[str, tuple[int, IsrRequestsDocument | None]] = {}  # key -> (revision, doc)

    # -- the controller document ----------------------------------------------------------------

    def claim(self) -> int:
        """Take the next controller epoch; returns it."""

        def bump(current: ControllerDocument | None) -> ControllerDocument:
            epoch = 0 if current is None else current.epoch
            return ControllerDocument(
                controller_id=-1,
                epoch=epoch + 1,
                updated_ms=self.clock_ms(),
                isr_requests=True,
                partition_changes=current is not None and current.partition_changes,  # never closed again
            )

        with self._liveness_lock:
            doc = documents.update_document(self.store, keys.CONTROLLER, ControllerDocument, bump)
            assert doc is not None
            self.epoch = doc.epoch
            self.partition_changes = doc.partition_changes
            # The document now names nobody live or dead: the first round publishes liveness again (a
            # controller that takes its Lease back must not skip it as "unchanged"), and the liveness
            # thread waits for that round's list of brokers, not the previous term's.
            self._published = None
            self.rounds = 0
        log.info("controller epoch %d", self.epoch)
        return self.epoch

    def _refresh_watched(self) -> None:
        """Bring the cached brokers/ and controller documents up to the store's latest changes."""
        for prefix, since in self._watched_revision.items():
            for doc in self.store.changes_since(since, prefix):
                self._watched_revision[prefix] = max(self._watched_revision[prefix], doc.revision)
                if doc.value is None:
                    self._watched.pop(doc.key, None)
                else:
                    self._watched[doc.key] = doc

    def _check_epoch(self) -> None:
        cached = self._watched.get(keys.CONTROLLER)
        epoch = 0 if cached is None or cached.value is None else ControllerDocument.from_json(cached.value).epoch
        if epoch > self.epoch:
            raise ControllerFenced(f"controller epoch {epoch} took over from {self.epoch}")

    # -- liveness: the detector's, with brokers whose log directory failed counted dead -----------

    @property
    def live(self) -> frozenset[int]:
        """The live brokers this round decides with (a snapshot: the liveness thread moves on meanwhile)."""
        return self._round_liveness[0]

    @property
    def dead(self) -> frozenset[int]:
        return self._round_liveness[1]

    def _current_liveness(self) -> tuple[frozenset[int], frozenset[int]]:
        failed = self.log_dir_failures.keys()
        return self.detector.live - failed, self.detector.dead | failed

    def poll_liveness(self) -> bool:
        """Poll the detector, log what changed and publish it; True if a broker changed state.

        Called by every round, and every ``LIVENESS_INTERVAL_MS`` by the liveness thread
        (:meth:`watch_liveness`) while rounds run: a broker's death is published within one
        interval of its verdict, not after the round in progress ends (which at 100,000 partitions
        may take seconds). The round decides on its own snapshot (``live``, ``dead``), so the
        thread never changes a liveness under a decision."""
        with self._liveness_lock:
            changed = self._poll()
            self._publish(None)
        return changed

    def _poll(self) -> bool:
        changes = self.detector.poll(self.brokers)
        for change in changes:
            log.info("%s", change.describe())
            metrics.broker_changed(change.broker_id, change.new, change.silent_s)
        return bool(changes)

    def watch_liveness(
        self, stop: threading.Event, interval_ms: int | None = None, active: threading.Event | None = None
    ) -> None:
        """The liveness thread: :meth:`poll_liveness` every ``interval_ms`` until ``stop``, while
        ``active`` is set (the Kubernetes controller's lease); wakes a waiting round (``wake``) when a
        broker changed state. Only after this controller's first round: that lists the brokers."""
        interval_s = (LIVENESS_INTERVAL_MS if interval_ms is None else interval_ms) / 1000
        unreachable = False
        while not stop.wait(interval_s):
            if not self.rounds or (active is not None and not active.is_set()):
                continue
            try:
                if self.poll_liveness():
                    self.wake.set()
                unreachable = False
            except ControllerFenced:
                continue  # a newer controller: the round sees it too, and stops (or stands down)
            except StoreUnavailable as exc:  # the round says so too; said once here
                if not unreachable:
                    log.warning("publishing liveness failed, the metadata store is unreachable: %s", exc)
                unreachable = True
            except Exception:
                log.exception("polling liveness failed; trying again")

    def _observe_log_dirs(self, failures: dict[int, str]) -> None:
        for broker_id in sorted(failures.keys() | self.log_dir_failures.keys()):
            before, now = self.log_dir_failures.get(broker_id, ""), failures.get(broker_id, "")
            if before == now:
                continue
            if now:
                log.warning(
                    "broker %d's log directory is offline (%s): fenced like a dead broker, its partitions move",
                    broker_id,
                    now,
                )
            else:
                log.info("broker %d's log directory is back online", broker_id)
            if self.on_log_dir is not None:
                try:
                    self.on_log_dir(broker_id, now)
                except Exception:
                    log.exception("reporting broker %d's log directory failed", broker_id)
        self.log_dir_failures = failures

    def _observe_space(self, brokers: list[BrokerDocument]) -> None:
        low = {b.broker_id for b in brokers if b.log_dir_low_space}
        for b in brokers:
            if (b.broker_id in low) == (b.broker_id in self.low_space):
                continue
            if b.log_dir_low_space:
                mib = 1024 * 1024
                log.warning(
                    "broker %d's data volume is low on space: %.1f MiB free of %.1f MiB",
                    b.broker_id,
                    b.log_dir_free_bytes / mib,
                    b.log_dir_size_bytes / mib,
                )
            else:
                log.info("broker %d's data volume has space again", b.broker_id)
            if self.on_log_dir_space is not None:
                try:
                    self.on_log_dir_space(b.broker_id, b.log_dir_low_space, b.log_dir_free_bytes, b.log_dir_size_bytes)
                except Exception:
                    log.exception("reporting broker %d's free space failed", b.broker_id)
        self.low_space = low

    def _publish(self, registered: list[BrokerDocument] | None) -> None:
        """Write the controller document if liveness changed; ``registered`` (a round's) may also open
        partition change records (None: the liveness thread, which never does, so no round sees
        ``partition_changes`` change under it). Called with ``_liveness_lock`` held."""
        live, dead = self._current_liveness()
        # Partition change records, once every registered broker reads them: a broker of older code
        # reads only the topic documents, which would then stop changing. Never closed again (a
        # broker of older code that registers later must be upgraded: its view would be stale).
        records = self.partition_changes or (
            bool(registered) and all(METADATA_PARTITION_CHANGES in b.metadata_features for b in registered or ())
        )
        if self._published == (live, dead) and records == self.partition_changes:
            return

        def write(current: ControllerDocument | None) -> ControllerDocument:
            epoch = 0 if current is None else current.epoch
            if epoch > self.epoch:
                raise ControllerFenced(f"controller epoch {epoch} took over from {self.epoch}")
            return ControllerDocument(
                -1,
                self.epoch,
                sorted(live),
                sorted(dead),
                self.clock_ms(),
                isr_requests=True,
                partition_changes=records,
            )

        documents.update_document(self.store, keys.CONTROLLER, ControllerDocument, write)
        if records and not self.partition_changes:
            log.info("every registered broker reads partition change records: partition states are written as records")
        self._published = (live, dead)
        self.partition_changes = records

    # -- one round ------------------------------------------------------------------------------

    def registration(self, broker_id: int) -> Document | None:
        """Broker ``broker_id``'s ``brokers/<id>`` document as of the last round (None: not registered)."""
        doc = self._watched.get(keys.broker(broker_id))
        return None if doc is None or doc.value is None else doc

    def registered_brokers(self) -> dict[int, str]:
        self._refresh_watched()
        return {b.broker_id: b.address for b in self._broker_documents()}

    def _broker_documents(self) -> list[BrokerDocument]:
        """The registered brokers, as of the last ``_refresh_watched``."""
        out: list[BrokerDocument] = []
        for key, doc in sorted(self._watched.items()):
            if not key.startswith(keys.BROKERS) or doc.value is None:
                continue
            try:
                out.append(BrokerDocument.from_json(doc.value))
            except (KeyError, ValueError, TypeError):
                log.warning("ignoring malformed broker document %s: %r", doc.key, doc.value)
        return out

    def run_round(self) -> int:
        """One round: check liveness, reconcile every topic. Returns the number of documents written."""
        with metrics.controller_round():
            self._refresh_watched()
            self._check_epoch()
            registered = self._broker_documents()
            with self._liveness_lock:
                self.brokers = {b.broker_id: b.address for b in registered}
                self._poll()
                self._observe_log_dirs({b.broker_id: b.log_dir_failure for b in registered if b.log_dir_failure})
                self._observe_space(registered)
                self._publish(registered)
                self._round_liveness = self._current_liveness()
                settled = self.detector.alive_for(self.preferred_leader_delay_s) - self.log_dir_failures.keys()
                self._settled = settled if self.preferred_leaders else None
            metrics.brokers_seen(self.live, self.dead)
            written = 0
            self._collect_requests()
            docs = self.topic_documents()
            if self.partition_changes:
                # a topic still without states_in_records is switched first, with this round's decision
                written = sum(self.reconcile_topic(d, switch=True) for d in docs if not d.value.states_in_records)
                written += self._reconcile_as_record([d for d in docs if d.value.states_in_records])
                self._fold_if_due()
            else:
                for doc in docs:
                    written += self.reconcile_topic(doc)
            metrics.round_listed(d.key for d in docs)
            self.rounds += 1
            return written

    def _collect_requests(self) -> None:
        """Group the leaders' ISR requests (``isr_requests/<broker>``, as of ``_refresh_watched``) by topic.

        A request stays in its broker's document until the broker writes the next one; it is
        decided again only when its document or its topic's changed (``_Inputs``), and once the
        partition moved past the epoch it names it is refused for good (:mod:`sluice.metadata.isr`).
        """
        by_topic: dict[str, list[tuple[int, int, IsrRequest]]] = {}
        for key, doc in self._watched.items():
            if not key.startswith(keys.ISR_REQUESTS) or doc.value is None:
                continue
            cached = self._requests_decoded.get(key)
            if cached is None or cached[0] != doc.revision:
                try:
                    cached = (doc.revision, IsrRequestsDocument.from_json(doc.value))
                except (KeyError, ValueError, TypeError):
                    log.warning("ignoring malformed ISR requests %s: %r", key, doc.value)
                    cached = (doc.revision, None)
                self._requests_decoded[key] = cached
            requests = cached[1]
            if requests is None:
                continue
            for request in requests.requests:
                by_topic.setdefault(keys.topic(request.topic), []).append((doc.revision, requests.broker_id, request))
        for key in [k for k in self._requests_decoded if k not in self._watched]:
            del self._requests_decoded[key]
        self._requests = by_topic

    def _apply_requests(self, topic: TopicDocument, key: str) -> TopicDocument | None:
        """``topic`` with the ISR requests it can take (None: none), each logged as the leader's change."""
        by_leader: dict[int, list[IsrChange]] = {}
        dead = self.dead
        for _revision, broker_id, r in self._requests.get(key, ()):
            if r.topic_id and r.topic_id != topic.topic_id:
                continue  # a request for a topic of the same name that was deleted
            if broker_id in dead:
                # a leader this controller holds dead is losing its leaderships in this very decision;
                # a zombie's request (its ISR shrunk to itself, cut off from its followers) is not taken
                continue
            change = IsrChange(r.partition, r.leader_epoch, tuple(r.base), tuple(r.isr), r.partition_epoch)
            by_leader.setdefault(broker_id, []).append(change)
        new = topic
        for leader, changes in sorted(by_leader.items()):
            new, outcomes = apply_isr_changes(new, leader, changes)
            taken = [c for c in changes if outcomes.get(c.partition) is IsrOutcome.WRITTEN]
            if len(taken) == 1:
                c = taken[0]
                log.info(
                    "ISR of %s-%d: %s -> %s (asked by broker %d)",
                    topic.name,
                    c.partition,
                    list(c.base),
                    list(c.isr),
                    leader,
                )
            elif taken:  # a returning broker is re-admitted to many partitions of a leader at once
                log.info(
                    "ISRs of %d partitions of %s changed as their leader, broker %d, asked: %s",
                    len(taken),
                    topic.name,
                    leader,
                    ", ".join(f"{c.partition}: {list(c.base)} -> {list(c.isr)}" for c in taken[:8])
                    + (" ..." if len(taken) > 8 else ""),
                )
        return None if new is topic else new

    def topic_documents(self) -> list[Versioned[TopicDocument]]:
        """Every topic, composed (:class:`~sluice.metadata.topic_view.TopicView`), with its declaration's
        version; a malformed document is logged and left alone, not fatal to the round.

        Kept up to date from the store's changes since the last round (``changes_since``, deleted
        topics included as tombstones), so an idle round neither reads nor decodes a document. The
        ``revision`` of each is that of the last document that changed it.
        """
        for name in self.topics.catch_up():
            key = keys.topic(name)
            # (a change need not move the topic's revision: folded states read after a gap are older)
            self._unchanged.pop(key, None)
            self._held_inputs.pop(key, None)
            if self.topics.view.topic(name) is None:
                self._forget_hold(key)
        view = self.topics.view
        return [
            Versioned(keys.topic(name), topic, view.declaration_version(name) or 0, view.revision(name))
            for name, topic in sorted(view.topics().items())
        ]

    def reconcile_topic(self, doc: Versioned[TopicDocument] | None, *, switch: bool = False) -> int:
        """Apply the rules to one topic document with compare-and-set; 1 if it was written.

        The way before partition change records (``partition_changes`` closed): the state is in the
        topic document, written whole. ``switch``: also set the document's ``states_in_records`` (the
        per-topic switch to records, sluice.metadata.topic_view), whether the rules change anything
        or not; a writer that read the document before fails its compare-and-set and reads it."""
        key = "?" if doc is None else doc.key
        for _ in range(CAS_ATTEMPTS):
            if doc is None:
                return 0
            decision = self._decide(doc)
            if decision is None and not switch:
                return 0
            requested, new = decision if decision is not None else (None, doc.value)
            if switch:
                new = dataclasses.replace(new, states_in_records=True)
            try:
                documents.replace(self.store, doc.key, new, doc.version)
            except VersionConflict:
                doc = documents.read(self.store, doc.key, TopicDocument)
                if doc is not None and doc.value.states_in_records:
                    return 0  # switched meanwhile (or created so): decided as records, next round
                continue
            if decision is not None:
                self._written(doc.key, doc.value, requested, new)
            if switch:
                log.info("%s: partition states change by records from now on", doc.value.name)
            return 1
        log.warning("%s kept changing under the controller; trying again next round", key)
        return 0

    def _reconcile_as_record(self, docs: list[Versioned[TopicDocument]]) -> int:
        """Apply the rules to every topic and write what changed as one partition change record.

        A failover's elections and ISR fencing over all topics are then one small write (each changed
        partition's state, about 100 bytes) instead of every topic document whole. A conflict means
        another writer appended a record this view has not seen: nothing is written, the next round
        decides again from the view that includes it. Returns the number of topics changed."""
        decided: dict[str, tuple[TopicDocument, TopicDocument | None, TopicDocument]] = {}
        for doc in docs:
            decision = self._decide(doc)
            if decision is not None:
                decided[doc.key] = (doc.value, *decision)
        if not decided:
            return 0
        changes = {
            key[len(keys.TOPICS) :]: changed_partitions(current, new) for key, (current, _, new) in decided.items()
        }
        try:
            written = append_changes(self.store, self.topics.view, changes, "controller", self.clock_ms())
        except VersionConflict:
            log.info("a partition change record was appended meanwhile; deciding again next round")
            return 0
        self.topics.wrote(written)
        for key, (current, requested, new) in decided.items():
            self._written(key, current, requested, new)
        return len(decided)

    def _decide(self, doc: Versioned[TopicDocument]) -> tuple[TopicDocument | None, TopicDocument] | None:
        """The rules applied to one topic: None (nothing to write), else (with the requests taken, new)."""
        live, dead = self.live, self.dead
        current = doc.value
        settled = self._settled
        requests_revision = max((r[0] for r in self._requests.get(doc.key, ())), default=0)
        inputs: _Inputs = (doc.revision, live, dead, settled, requests_revision)
        if self._unchanged.get(doc.key) == inputs:
            return None
        if self._held_inputs.get(doc.key) == inputs and not self._hold_over(doc.key):
            return None  # held with these very inputs: only the end of the hold can change the answer
        # The leadership gauges: an unchanged topic was observed when it was decided last. Observing
        # every topic on every round cost a third of an idle round at 100,000 partitions (py-spy).
        metrics.topic_read(doc.key, current)
        # The leaders' requests first: the rules then see the ISRs they asked for (and fence a
        # broker that died meanwhile out of them again).
        requested = self._apply_requests(current, doc.key)
        elected = elect_leaders(requested or current, live, dead, default_unclean=self.default_unclean)
        new = elected or requested
        if settled is not None:
            preferred = restore_preferred_leaders(new or current, settled)
            if preferred is not None and new is None and self._hold_preferred(doc.key, preferred, settled):
                self._held_inputs[doc.key] = inputs
                return None
            new = preferred or new
        if new == current:
            new = None  # a request the rules undid (a dead broker asked back): nothing to write
        if new is None:
            self._forget_hold(doc.key)
            self._unchanged[doc.key] = inputs
            return None
        return requested, new

    def _written(self, key: str, current: TopicDocument, requested: TopicDocument | None, new: TopicDocument) -> None:
        """Log, count and report one topic's decision once it is written."""
        live, dead = self.live, self.dead
        self._forget_hold(key)
        # the requested ISR changes are logged as such (_apply_requests), not as fencing
        for line in describe_changes(requested or current, new, live, dead):
            log.info("%s", line)
        metrics.topic_written(key, current, new, dead)
        if self.on_change is not None:
            try:
                self.on_change(key, current, new, live, dead)
            except Exception:
                log.exception("reporting the change of %s failed", key)

    def _write_state(self, state: TopicStateDocument) -> None:
        """Write a folded state, never over one folded further (a deposed controller's late fold).

        The state there is checked by its ``topic_id`` and ``seq`` only, not decoded whole (1,000
        partitions a topic, and a fold writes every topic's): ``documents.update_document`` would
        decode it and :func:`sluice.metadata.store.update` deep-copy it (5 and 7 ms a topic)."""
        key = keys.topic_state(state.name)
        for _ in range(CAS_ATTEMPTS):
            current = self.store.get(key)
            value = None if current is None else current.value
            if value is not None and value.get("topic_id") == state.topic_id and int(value.get("seq", -1)) >= state.seq:
                return
            try:
                self.store.compare_and_set(key, state.to_json(), None if current is None else current.version)
                return
            except VersionConflict:
                continue
        raise VersionConflict(f"{key} kept changing under the fold")

    def _fold_if_due(self) -> None:
        """Fold the partition change records into ``topic_states/`` once enough wait (``fold_records``,
        ``fold_changes``: sluice.metadata.topic_view.FOLD_RECORDS ...).

        Each topic a record names gets its composed states written with the last record folded; then
        ``partition_changes_fold`` says so, and the folded records are deleted. The states are not
        watched, so a fold sends nothing to the brokers but the records' deletions (module docstring
        of :mod:`sluice.metadata.topic_view`). A failure leaves it for a later round: what is folded
        and what is not are the same states.

        The states are written ``FOLD_TOPICS_PER_ROUND`` topics a round, the mark once all are, and
        the folded records deleted ``FOLD_DELETES_PER_ROUND`` a round after it (:meth:`_delete_folded`): a
        fold of 100 topics of 1,000 partitions in one round held that round (and any failover it
        should have decided) for seconds. A state written a few rounds after the fold was chosen may
        hold changes of later records too; composition takes the newest state of each partition, so
        reading those records over it again changes nothing."""
        self._delete_folded()
        view = self.topics.view
        if self._folding is None:
            if not view.fold_due(self.fold_records, self.fold_changes):
                return
            fold = max(view.records)
            names = sorted(set().union(*(r.topics for r in view.records.values())))
            self._folding = (fold, names)
        fold, names = self._folding
        for name in names[:FOLD_TOPICS_PER_ROUND]:
            topic = view.topic(name)
            if topic is not None:
                self._write_state(TopicStateDocument(name, topic.topic_id, fold, list(topic.partitions)))
        del names[:FOLD_TOPICS_PER_ROUND]
        if names:
            return
        self._folding = None

        def advance(current: FoldDocument | None) -> FoldDocument | None:
            if current is not None and current.seq >= fold:
                return None
            return FoldDocument(fold, self.clock_ms())

        documents.update_document(self.store, keys.PARTITION_CHANGES_FOLD, FoldDocument, advance)
        # every record up to the fold there is, from the store's changes (a fold that failed halfway
        # left some, which the view forgot when it saw its mark), deleted a few a round from now on
        self._to_delete = [
            doc
            for doc in self.store.changes_since(0, keys.PARTITION_CHANGES)
            if doc.value is not None and 0 < record_seq(doc.key) <= fold
        ]
        log.info("folded partition change records up to %d; %d to delete", fold, len(self._to_delete))
        self._delete_folded()

    def _delete_folded(self) -> None:
        """Delete up to ``FOLD_DELETES_PER_ROUND`` records the last fold folded.

        Each is an API request: the thousand records of steady ISR churn deleted in one round held it
        (and any failover due in it) for 26 s in the metadata simulation at 100 brokers. Nobody
        applies a record at or below the fold, so one that waits a few rounds for its deletion
        costs only its bytes in a LIST."""
        for doc in self._to_delete[:FOLD_DELETES_PER_ROUND]:
            with contextlib.suppress(VersionConflict):  # gone already (another controller's fold)
                self.store.delete(doc.key, doc.version)
        del self._to_delete[:FOLD_DELETES_PER_ROUND]

    def _hold_preferred(self, key: str, topic: TopicDocument, settled: frozenset[int]) -> bool:
        """Whether the preferred-leader moves of ``topic`` (the document with them made) wait this round.

        They wait while a partition's settled preferred replica is still catching up under a live
        leader, so that the moves become one write when the last of them is in the ISR, and at
        most ``preferred_leader_hold_s`` from the first round that held them (module docstring).
        """
        live = self.live
        catching_up = any(
            p.replicas
            and p.replicas[0] in settled
            and p.replicas[0] not in p.isr
            and p.leader != NO_LEADER
            and p.leader in live
            for p in topic.partitions
        )
        if not catching_up:
            return False
        self._held_since.setdefault(key, self.clock_ms())
        return not self._hold_over(key)

    def _hold_over(self, key: str) -> bool:
        since = self._held_since.get(key)
        return since is None or self.clock_ms() - since >= self.preferred_leader_hold_s * 1000

    def _forget_hold(self, key: str) -> None:
        self._held_since.pop(key, None)
        self._held_inputs.pop(key, None)

    def run(self, stop: threading.Event, interval_ms: int = DEFAULT_INTERVAL_MS) -> None:
        """Rounds every ``interval_ms`` until ``stop`` is set (or a newer controller fences this one)."""
        if self.epoch < 0:
            self.claim()
        stop_liveness = threading.Event()
        liveness = threading.Thread(
            target=self.watch_liveness, args=(stop_liveness,), name="sluice-liveness", daemon=True
        )
        liveness.start()
        try:
            self._run(stop, interval_ms)
        finally:
            stop_liveness.set()
            liveness.join(timeout=5)

    def _run(self, stop: threading.Event, interval_ms: int) -> None:
        unreachable_since: float | None = None
        while not stop.is_set():
            started = time.monotonic()
            try:
                self.run_round()
                if unreachable_since is not None:
                    log.warning("metadata store reachable again after %.1f s", started - unreachable_since)
                    unreachable_since = None
            except ControllerFenced as exc:
                log.warning("stopping: %s", exc)
                return
            except StoreUnavailable as exc:  # no decision without the store; said once per outage
                if unreachable_since is None:
                    unreachable_since = started
                    log.warning("metadata store unreachable, no elections until it is back: %s", exc)
            except Exception:
                log.exception("controller round failed; trying again")
            self.wait_for_next_round(interval_ms / 1000 - (time.monotonic() - started))

    def wait_for_next_round(self, seconds: float) -> None:
        """Wait until the next round is due: ``seconds``, or less once the liveness thread saw a broker
        change state (``wake``), so that the round deciding the failover starts at once."""
        self.wake.wait(max(0.0, seconds))
        self.wake.clear()
