"""Topics composed from their declarations, folded states and partition change records.

A topic's metadata has two parts that change at very different rates. Its *declaration* (id,
config, partition count: ``topics/<name>``) changes when a user changes the topic. Its partitions'
*states* (leader, epochs, ISR, a reassignment) change on every failover, for every topic with a
partition on the broker concerned. When states lived only inside the declarations, a failover
rewrote every topic document whole (100 topics of 1,000 partitions: 9 MB), and every broker's
watch received all of it (issue 28 measured 853 MB for one failover at 100 brokers).

Since the controller writes every leader and ISR (leaders ask it, Kafka's AlterPartition), state
changes can go where KRaft puts them, in small records of one sequence:

* ``partition_changes/<seq>`` (:class:`~sluice.metadata.documents.PartitionChangesDocument`):
  one decision's new partition states, whole (about 100 bytes each), for any number of topics.
  A writer creates the record numbered one past the last it has seen, with compare-and-set: if
  that number exists, it missed a record, reads it and decides again. So every writer (the
  controller, a reassignment's start, a leader's fallback ISR write) is ordered by one sequence.
* ``topic_states/<name>`` (:class:`~sluice.metadata.documents.TopicStateDocument`): the
  controller's *fold* of the records up to a number into each topic's states, after which it
  writes ``partition_changes_fold`` and deletes the folded records. The Kubernetes store's watch
  leaves this family out: a fold changes no state, and every broker receiving each folded topic
  whole again is exactly the fan-out the records avoid. A view reads them (a LIST) when it starts
  and when it finds a gap (the fold passed records it never saw: its watch was re-listed).
* Writing records is gated, twice. Cluster-wide (``ControllerDocument.partition_changes``): until
  every registered broker reads records (``BrokerDocument.metadata_features``), states are written
  into the declarations as before. Then per topic (``TopicDocument.states_in_records``): the
  controller sets it in each declaration with compare-and-set (a creator that knows the gate is
  open sets it at creation). A writer reads the declaration first and writes a record if it is
  set, else the declaration itself with compare-and-set on the version it read: a writer that read
  the declaration before the switch fails its compare-and-set and reads the switch. So no state is
  ever written into a declaration once records may exist for its topic, and nothing is converted:
  the declaration's states at the switch are where the records start from.

**Composition is a maximum, so it does not depend on the order things are seen in.** Every change
of a partition's state counts one more partition epoch (Kafka's; ``TopicDocument.with_partitions``
counts it for every writer), and every writer decides from a view that includes every earlier
record. So of all the states a view has seen for a partition (the declaration's, a folded state,
records), the newest is the one with the highest partition epoch, and between a record and a
folded state of the same epoch, the one of the higher number (a folded state is numbered by the
last record it folds); a declaration's state loses every tie. What a view holds is thus the same
for everyone who has seen the same documents, whatever their order (a watch, a LIST at start, a
LIST after a gap), and deleting a folded record changes nothing in a view that saw it. That includes
a record seen before its topic's declaration: a collapsed read (a LIST, or a store's changes since
a revision, the broker's poll and the controller's catch-up: each document once, at its last
write) has a declaration rewritten after records (a config change, partitions added) after them;
the view keeps the states it cannot place yet (of a topic, or of partitions, it does not hold)
until the declaration arrives. A
declaration without ``states_in_records`` is its topic's state, whole: no record exists for it,
and brokers of code from before the partition epoch changed ISRs without counting it. A record
numbered at or below the fold is never applied: a writer far behind can re-create a number the
fold deleted, and :func:`append_changes` then finds the fold past it, deletes it and reports a
conflict, so that writer decides again. A view notices a gap
(records it never saw, gone to a fold while its watch was re-listed) when a record skips a number
or the fold passes its last record, and then reads the folded states.

Every reader of topics uses :class:`TopicView` (the broker's ClusterView, the controller, the
operator's status projection and rebalance planner, LocalCluster), and every writer of partition
states :func:`append_changes` once the gate is open.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from sluice.metadata import keys
from sluice.metadata.documents import (
    FoldDocument,
    PartitionChangesDocument,
    PartitionState,
    TopicChanges,
    TopicDocument,
    TopicStateDocument,
)
from sluice.metadata.store import Document, MetadataStore, VersionConflict

log = logging.getLogger(__name__)

__all__ = [
    "FOLD_PARTITION_CHANGES",
    "FOLD_RECORDS",
    "RecordInfo",
    "TopicView",
    "Updated",
    "WatchedTopics",
    "append_changes",
    "changed_partitions",
    "delete_topic_state",
    "fresh_documents",
    "is_topic_key",
    "read_topic",
    "record_seq",
    "records_enabled",
    "update_partitions",
]

# The controller folds once this many records, or records of this many partition changes, wait. A
# failover at 100 brokers and 100,000 partitions is one record of about 3,000 changes (0.3 MB), so
# about ten failovers; steady ISR churn makes records of a change or a few (a round's), so a
# thousand of them. A reader that starts LISTs what waits (a few MB at most); a fold writes the
# state of every topic the records name (into etcd, to nobody's watch), so it must not come often.
FOLD_RECORDS = 1_000
FOLD_PARTITION_CHANGES = 30_000

_FAMILIES = (keys.TOPICS, keys.PARTITION_CHANGES, keys.TOPIC_STATES)


def is_topic_key(key: str) -> bool:
    """Whether a document at ``key`` is one a :class:`TopicView` composes."""
    return key.startswith(_FAMILIES) or key == keys.PARTITION_CHANGES_FOLD


_DECLARED = -1  # the "number" of a state from a declaration: below every record and folded state


@dataclass(frozen=True)
class RecordInfo:
    """What a view keeps of a record it applied, until a fold covers it: what the fold needs."""

    topics: frozenset[str]
    changes: int  # partition states in it
    version: int  # for deleting it


@dataclass
class _Topic:
    """One topic as a view holds it: its declaration and the newest state of each partition."""

    declaration: TopicDocument
    version: int  # the declaration's, for a compare-and-set of it
    partitions: list[PartitionState]
    sources: list[int]  # per partition, the number of the record or folded state it is from (_DECLARED)
    revision: int  # the store revision of the last document that changed this topic
    # A record or folded state of this topic was seen: from then on a declaration's state counts only
    # when its partition epoch is higher (module docstring); before, the declaration is the state.
    recorded: bool = False
    composed: TopicDocument | None = None  # built on demand, dropped on change

    def topic(self) -> TopicDocument:
        if self.composed is None:
            self.composed = dataclasses.replace(self.declaration, partitions=list(self.partitions))
        return self.composed


@dataclass
class TopicView:
    """The composed topics of one reader, fed the store's documents in revision order (:meth:`apply`).

    ``head`` is the highest record number this view has seen (or the fold's): a writer appends
    ``head + 1``. ``gap`` is set when a fold passed records this view never saw (its watch was
    re-listed meanwhile): the owner then reads ``topic_states/`` (:meth:`load_states`).
    """

    head: int = 0
    fold_seq: int = 0
    gap: bool = False
    _topics: dict[str, _Topic] = field(default_factory=dict)
    # Record numbers above the last fold this view knows of, with the topics each names and its
    # number of partition changes: what the controller's fold covers.
    records: dict[int, RecordInfo] = field(default_factory=dict)
    # States this view cannot place yet, by topic name, then (topic id, number, from a folded state):
    # of a topic it does not hold, or of partitions its declaration does not have. A collapsed read (a
    # LIST, or a store's changes since a revision: each document once, at its last write) has a
    # declaration rewritten after records (partitions added, a config change) after them. The name's
    # next declaration takes those of its id and drops the rest; the name's deletion drops them. A
    # record's are dropped with the record too: the declaration of a topic it names comes in the same
    # read as the record (its last write is later than the view's previous read), so a record's states
    # still waiting after that read are of a deleted topic. Not a folded state's: the LIST after a gap
    # may be ahead of the watch. Keyed by number, so reading the same records again adds nothing.
    _pending: dict[str, dict[tuple[str, int, bool], dict[int, PartitionState]]] = field(default_factory=dict)

    # -- reading ----------------------------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        return sorted(self._topics)

    def topic(self, name: str) -> TopicDocument | None:
        held = self._topics.get(name)
        return None if held is None else held.topic()

    def topics(self) -> dict[str, TopicDocument]:
        return {name: held.topic() for name, held in self._topics.items()}

    def declaration_version(self, name: str) -> int | None:
        held = self._topics.get(name)
        return None if held is None else held.version

    def revision(self, name: str) -> int:
        """The store revision of the last document that changed ``name`` here (0: not held)."""
        held = self._topics.get(name)
        return 0 if held is None else held.revision

    # -- feeding ----------------------------------------------------------------------------------

    def apply(self, doc: Document, *, own: bool = False) -> set[str]:
        """Take one document of the families this view composes; returns the topics it may have changed.

        ``own``: a document this view's owner wrote or read itself (read-your-writes, before its watch
        delivers it): its states are taken, but it neither moves ``head`` nor counts as a gap, since
        the records before it may not have arrived yet; the watch delivers it again in order (a fold
        mark so read is left to the watch). Raises
        (KeyError, ValueError, TypeError) for a malformed document, after counting a malformed
        record's number as seen (a writer must still append past it)."""
        key = doc.key
        if key.startswith(keys.TOPICS):
            return self._declaration(key[len(keys.TOPICS) :], doc)
        if key.startswith(keys.PARTITION_CHANGES):
            seq = record_seq(key)
            if doc.value is None:
                self.records.pop(seq, None)  # folded: its states are held already
                self._forget_pending(seq)
                return set()
            if seq <= self.fold_seq:
                return set()  # a number re-created after the fold deleted it: never applied
            if own:
                return self._record(PartitionChangesDocument.from_json(doc.value), doc, own=True)
            if seq > self.head + 1:
                self.gap = True  # a number skipped: records this view never saw went to a fold
            self.head = max(self.head, seq)
            return self._record(PartitionChangesDocument.from_json(doc.value), doc)
        if key.startswith(keys.TOPIC_STATES):
            if doc.value is None:
                return set()
            return self._state(TopicStateDocument.from_json(doc.value), doc.revision, own=own)
        if key == keys.PARTITION_CHANGES_FOLD and doc.value is not None and not own:
            fold = FoldDocument.from_json(doc.value).seq
            if fold > self.head:
                self.gap = True  # records up to the fold may be gone before this view saw them
            self.fold_seq = max(self.fold_seq, fold)
            self.head = max(self.head, fold)
            for seq in [s for s in self.records if s <= fold]:
                del self.records[seq]
        return set()

    def apply_all(self, docs: Iterable[Document]) -> set[str]:
        changed: set[str] = set()
        for doc in docs:
            changed |= self.apply(doc)
        return changed

    def _declaration(self, name: str, doc: Document) -> set[str]:
        held = self._topics.get(name)
        if doc.value is None:
            if held is not None and doc.version < held.version:
                return set()  # older than the declaration this view holds
            self._pending.pop(name, None)
            if held is None:
                return set()
            del self._topics[name]
            return {name}
        if held is not None and doc.version < held.version:
            return set()  # older than one this view applied already (its owner's own write)
        declared = TopicDocument.from_json(doc.value)
        if held is None or held.declaration.topic_id != declared.topic_id:
            parts = list(declared.partitions)
            self._topics[name] = _Topic(declared, doc.version, parts, [_DECLARED] * len(parts), doc.revision)
        else:
            parts, sources = held.partitions, held.sources
            whole = not held.recorded  # before any record or folded state is seen, the declaration is the state
            for i, p in enumerate(declared.partitions):
                if i >= len(parts):
                    parts.append(p)  # partitions added
                    sources.append(_DECLARED)
                elif whole or p.partition_epoch > parts[i].partition_epoch:
                    parts[i], sources[i] = p, _DECLARED
            held.declaration, held.version, held.revision, held.composed = declared, doc.version, doc.revision, None
        for (topic_id, seq, _folded), states in self._pending.pop(name, {}).items():  # (any order: a maximum)
            if topic_id == declared.topic_id:  # (others are of a predecessor under this name)
                self._take(name, topic_id, states.items(), seq, doc.revision, pend=False)
        return {name}

    def _forget_pending(self, seq: int) -> None:
        """Drop what record ``seq`` left waiting (it was deleted: see ``_pending``)."""
        for name in [n for n, entries in self._pending.items() if any(k[1:] == (seq, False) for k in entries)]:
            entries = self._pending[name]
            for key in [k for k in entries if k[1:] == (seq, False)]:
                del entries[key]
            if not entries:
                del self._pending[name]

    def _pend(
        self, name: str, topic_id: str, states: Iterable[tuple[int, PartitionState]], seq: int, folded: bool
    ) -> None:
        entry = self._pending.setdefault(name, {}).setdefault((topic_id, seq, folded), {})
        entry.update(states)

    def _record(self, record: PartitionChangesDocument, doc: Document, *, own: bool = False) -> set[str]:
        if not own:  # (an own record is counted when the watch delivers it)
            self.records[record.seq] = RecordInfo(
                frozenset(t.topic for t in record.topics), sum(len(t.partitions) for t in record.topics), doc.version
            )
        changed: set[str] = set()
        for changes in record.topics:
            if self._take(changes.topic, changes.topic_id, changes.partitions.items(), record.seq, doc.revision):
                changed.add(changes.topic)
        return changed

    def _state(self, state: TopicStateDocument, revision: int, *, own: bool = False) -> set[str]:
        if not own:
            self.head = max(self.head, state.seq)
        taken = self._take(state.name, state.topic_id, enumerate(state.partitions), state.seq, revision, folded=True)
        return {state.name} if taken else set()

    def _take(
        self,
        name: str,
        topic_id: str,
        states: Iterable[tuple[int, PartitionState]],
        seq: int,
        revision: int,
        *,
        folded: bool = False,
        pend: bool = True,
    ) -> bool:
        """Take the states of a record or folded state numbered ``seq`` that are newer than the view's.
        What it cannot place waits for the topic's declaration (``_pending``), unless ``pend`` is
        False: the states the declaration just arrived for, of partitions it does not have either."""
        held = self._topics.get(name)
        if held is None or held.declaration.topic_id != topic_id:
            # Its declaration not seen yet (a collapsed read), or a topic deleted (perhaps created again
            # under its name).
            if pend:
                self._pend(name, topic_id, states, seq, folded)
            return False
        held.recorded = True
        parts, sources = held.partitions, held.sources
        changed = False
        beyond: list[tuple[int, PartitionState]] = []
        for i, p in states:
            if i >= len(parts):
                beyond.append((i, p))  # partitions added by a declaration this view has not seen yet
            elif i >= 0 and (p.partition_epoch, seq) > (parts[i].partition_epoch, sources[i]):
                changed = changed or p != parts[i] or p.partition_epoch != parts[i].partition_epoch
                parts[i], sources[i] = p, seq
        if beyond and pend:
            self._pend(name, topic_id, beyond, seq, folded)
        if changed:
            held.revision, held.composed = max(held.revision, revision), None
        return changed

    # -- loading ----------------------------------------------------------------------------------

    @classmethod
    def load(cls, store: MetadataStore, name: str | None = None) -> TopicView:
        """A view of every topic (or of ``name`` only) from fresh reads: for writers and admin reads that
        must not decide from a watch that lags. One topic costs three GETs and a LIST of the records.

        The order matters: the fold, the records and the folded states, so that records a fold
        deletes between two reads are in the states read after (a fold writes its states before its
        mark, and deletes records after it)."""
        view = cls()
        view.apply_all(fresh_documents(store, name))
        view.gap = False  # every folded state read
        return view

    def load_states(self, store: MetadataStore) -> set[str]:
        """Read every folded state (``topic_states/``, which the Kubernetes store does not watch)."""
        changed = self.apply_all(store.list(keys.TOPIC_STATES))
        self.gap = False
        return changed

    def fold_due(self, records: int = FOLD_RECORDS, changes: int = FOLD_PARTITION_CHANGES) -> bool:
        """Whether enough records wait for the controller to fold them: ``records`` of them, or records
        of ``changes`` partition changes in all."""
        return len(self.records) >= records or sum(r.changes for r in self.records.values()) >= changes


def fresh_documents(store: MetadataStore, name: str | None = None) -> list[Document]:
    """The documents that make every topic (or ``name`` only) now, read fresh, in the order
    :meth:`TopicView.load` explains: declarations, fold mark, records, folded states."""
    if name is None:
        found: list[Document | None] = [*store.list(keys.TOPICS)]
    else:
        found = [store.get(keys.topic(name))]
    found.append(store.get(keys.PARTITION_CHANGES_FOLD))
    found += store.list(keys.PARTITION_CHANGES)
    if name is None:
        found += store.list(keys.TOPIC_STATES)
    else:
        found.append(store.get(keys.topic_state(name)))
    return [d for d in found if d is not None]


class WatchedTopics:
    """A :class:`TopicView` kept current from one store's changes (``changes_since``: over Kubernetes,
    the store's watch cache, so catching up reads no object from the API server unless a gap needs
    the folded states). For readers that watch only topics: the controller, the status projection."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self.view = TopicView()
        self.revision = 0  # the store revision the view is current to

    def catch_up(self) -> set[str]:
        """Apply the changes since the last call; returns the topics that may have changed."""
        docs = [doc for doc in self.store.changes_since(self.revision) if is_topic_key(doc.key)]  # in store order
        changed: set[str] = set()
        for doc in docs:
            self.revision = max(self.revision, doc.revision)
            try:
                changed |= self.view.apply(doc)
            except (KeyError, ValueError, TypeError):
                log.warning("ignoring malformed topic metadata %s: %r", doc.key, doc.value)
        if self.view.gap:  # the fold passed records the watch never delivered (a re-list)
            changed |= self.view.load_states(self.store)
        return changed

    def wrote(self, doc: Document) -> set[str]:
        """Apply a record this process wrote (read-your-writes). The revision the view is current to
        stays: what others wrote between the last catch-up and this write has a lower revision, and the
        next catch-up must still deliver it (this record comes again with it, and changes nothing)."""
        return self.view.apply(doc, own=True)


def read_topic(store: MetadataStore, name: str) -> TopicDocument | None:
    """Topic ``name`` composed now, for reads that only report it (a resource's status): its declaration
    and folded state read fresh, the records from the store's changes (the watch cache, no LIST)."""
    view = TopicView()
    view.apply_all(d for d in (store.get(keys.topic(name)),) if d is not None)
    view.apply_all(store.changes_since(0, keys.PARTITION_CHANGES_FOLD))
    view.apply_all(store.changes_since(0, keys.PARTITION_CHANGES))
    view.apply_all(d for d in (store.get(keys.topic_state(name)),) if d is not None)
    return view.topic(name)


def record_seq(key: str) -> int:
    """The number of the record at ``key`` (``partition_changes/<seq>``); -1 when it is not one."""
    try:
        return int(key[len(keys.PARTITION_CHANGES) :])
    except ValueError:
        return -1


def changed_partitions(old: TopicDocument, new: TopicDocument) -> dict[int, PartitionState]:
    """The partitions of ``new`` whose state differs from ``old``'s (``new`` made by ``with_partitions``)."""
    before = old.partitions
    return {
        i: p
        for i, p in enumerate(new.partitions)
        if i >= len(before)
        or (p is not before[i] and (p != before[i] or p.partition_epoch != before[i].partition_epoch))
    }


def append_changes(
    store: MetadataStore,
    view: TopicView,
    changes: Mapping[str, Mapping[int, PartitionState]],
    writer: str,
    now_ms: int,
) -> Document:
    """Write ``changes`` (topic name -> partition -> new state) as the record after ``view.head``.

    Raises VersionConflict when that number exists: the writer missed a record, so its view is
    behind; it catches up and decides again. The caller applies the returned document to its view
    (read-your-writes), and does not call this with nothing to write.
    """
    topics = []
    for name, parts in sorted(changes.items()):
        held = view.topic(name)
        if held is None or not parts:
            continue
        topics.append(TopicChanges(name, held.topic_id, dict(parts)))
    if not topics:
        raise ValueError("no partition changes to write")
    seq = view.head + 1
    record = PartitionChangesDocument(seq, topics, writer, now_ms)
    written = store.compare_and_set(keys.partition_changes(seq), record.to_json(), None)
    fold = store.get(keys.PARTITION_CHANGES_FOLD)
    if fold is not None and FoldDocument.from_json(fold.value or {}).seq >= seq:
        # The number was free because a fold deleted it (this writer was that far behind): nobody applies
        # a record at or below the fold, so this one is void. A fold that came after it and covers it
        # folded it in; it is void for this writer either way, which decides again (and finds it so).
        with contextlib.suppress(VersionConflict):
            store.delete(written.key, written.version)
        raise VersionConflict(f"{written.key}: at or below the fold ({fold.value}); the writer was behind")
    return written


@dataclass(frozen=True)
class Updated:
    """What :func:`update_partitions` did: the topic before and after, and the document written (None: none)."""

    before: TopicDocument
    after: TopicDocument
    document: Document | None
    read: Document | None = None  # without records: the topic document ``before`` was read from


def records_enabled(store: MetadataStore) -> bool:
    """Whether the controller says partition states are written as records (a fresh read)."""
    doc = store.get(keys.CONTROLLER)
    return doc is not None and bool((doc.value or {}).get("partition_changes", False))


def update_partitions(
    store: MetadataStore,
    name: str,
    change: Callable[[TopicDocument], TopicDocument],
    *,
    writer: str,
    attempts: int = 20,
    pause: Callable[[int], None] | None = None,
) -> Updated | None:
    """Read-modify-write of one topic's partition states from fresh reads, retried on a conflict.

    ``change`` returns the topic with its new states (made with ``with_partitions``, so the partition
    epochs count), or the topic it was given to write nothing. When the topic's declaration says
    ``states_in_records`` the changed states are appended as a record; otherwise the declaration is
    replaced whole, with compare-and-set on the version read (so a switch to records meanwhile
    fails it, and the next attempt appends). None when the topic does not exist; VersionConflict
    when it kept changing for ``attempts`` tries (``pause(attempt)`` runs between them).
    """
    for attempt in range(attempts):
        doc = store.get(keys.topic(name))
        if doc is None or doc.value is None:
            return None
        declared = TopicDocument.from_json(doc.value)
        if declared.states_in_records:
            view = TopicView.load(store, name)
            before = view.topic(name)
            if before is None:
                return None
            after = change(before)
            parts = changed_partitions(before, after)
            if after is before or not parts:
                return Updated(before, before, None)
            try:
                written = append_changes(store, view, {name: parts}, writer, _now_ms())
            except VersionConflict:
                if pause is not None:
                    pause(attempt)
                continue
            return Updated(before, after, written)
        after = change(declared)
        if after is declared or after == declared:
            return Updated(declared, declared, None, doc)
        try:
            written = store.compare_and_set(doc.key, after.to_json(), doc.version)
        except VersionConflict:
            if pause is not None:
                pause(attempt)
            continue
        return Updated(declared, after, written, doc)
    raise VersionConflict(f"topic {name!r} kept changing: gave up after {attempts} attempts")


def delete_topic_state(store: MetadataStore, name: str) -> None:
    """Remove a deleted topic's folded state (its records name its id, which no declaration has now)."""
    doc = store.get(keys.topic_state(name))
    if doc is not None:
        with contextlib.suppress(VersionConflict):  # written or removed meanwhile: a later delete removes it
            store.delete(doc.key, doc.version)


def _now_ms() -> int:
    return int(time.time() * 1000)
