"""The Sluice consumer: fetch from partition leaders, track positions, commit offsets.

Design:

* State is per assigned partition: the *position* (the next offset to
  return), unknown until it is looked up. A position comes from the
  group's committed offset (OffsetFetch with ``require_stable`` for
  read_committed consumers, so offsets of an open transaction are never used
  half-done: UNSTABLE_OFFSET_COMMIT is retried), else from
  ``auto_offset_reset`` (ListOffsets: earliest -2, latest -1, none: an error).
* The parts, each in its own module: the
  :class:`~sluice.client.consumer.subscription_state.SubscriptionState`
  (assignment, positions), the :class:`~sluice.client.consumer.fetcher.Fetcher`
  (at most one Fetch in flight per partition, the record buffer with its
  prefetch, ListOffsets), and the group side in
  :mod:`~sluice.client.consumer.coordinator` (committed offsets, and the
  :class:`~sluice.client.consumer.coordinator.GroupMember` heartbeat thread,
  ConsumerGroupHeartbeat in the KIP-848 shape). This class ties them
  together: ``poll()`` applies a pending group assignment, looks up unknown
  positions, drains the buffer and keeps fetches going.
* ``subscribe()`` hands membership to the GroupMember thread; ``assign()``
  sets the assignment by hand. One lock (this class's, shared with the
  fetcher) guards the state; no network call is made while it is held,
  except the commit of revoked partitions' positions during a rebalance
  (with auto-commit).
* As in Kafka, what the application sees of the group changes only inside
  ``poll()``: the heartbeat thread leaves a new target assignment (and its
  member epoch) pending, and the next ``poll()`` applies it before it
  returns records. Between two polls, ``assignment()``, ``position()`` and
  ``group_metadata()`` describe exactly the records the last poll returned,
  so a consume-transform-produce loop that commits "the positions of my
  assignment" with ``send_offsets_to_transaction`` commits the offsets of
  what it processed, under the member epoch it had (a zombie's commit is
  then fenced), never a smaller set because a partition was revoked in the
  background meanwhile. A revoked partition stays owned (reported in
  heartbeats) until that poll; lost ones (the member was fenced or expired)
  are given up at once, since another member may own them already.
* Rebalance callbacks (confluent-kafka's shape): ``subscribe(topics,
  on_assign=fn, on_revoke=fn, on_lost=fn)``, each called as
  ``fn(consumer, partitions)`` from inside ``poll()``, on the application's
  thread, with the consumer's lock *not* held (a callback may commit, seek or
  flush a producer; the heartbeat thread keeps going meanwhile). Per applied
  assignment, in this order: ``on_revoke`` with the partitions moving away,
  *before* they are dropped, while they can still be committed (auto-commit
  commits their positions just before it); or ``on_lost`` with every
  partition when the member was fenced or its session expired (they may be
  owned by another member already: nothing can be committed; without an
  ``on_lost``, ``on_revoke`` is called instead, as confluent-kafka does); then
  ``on_assign`` with the partitions added (incremental, as in KIP-848: never
  the ones kept). ``close()`` and ``unsubscribe()`` call ``on_revoke`` with
  what is still assigned before leaving. A callback that raises has its
  exception raised by ``poll()``, after the assignment was applied. A
  coordinator failover calls nothing: the member keeps its id, epoch and
  partitions (the coordinator persists them).
* Errors: retriable ones (leader moved, coordinator moved or loading, a
  broker down) are retried inside, with metadata refreshes; fatal ones are
  raised by the next ``poll()`` (or by the call that hit them) as the
  :mod:`sluice.errors` class of their code.

Kafka's defaults differ in two places, deliberately: isolation_level is
read_committed (Kafka: read_uncommitted), and auto-commit is off
(``enable_auto_commit=False``; Kafka: on), since a Sluice user is usually
after exactly-once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType

from sluice import errors
from sluice.api.v1 import records_pb2
from sluice.client import tracing as _tracing
from sluice.client._network import Cluster, Deadline
from sluice.client._network.security import ClientSecurity
from sluice.client.consumer.coordinator import GroupMember, commit_offsets, fetch_committed
from sluice.client.consumer.fetcher import EARLIEST, LATEST, FetchConfig, Fetcher
from sluice.client.consumer.subscription_state import PartitionState, SubscriptionState
from sluice.client.types import ConsumerRecord, GroupMetadata, OffsetAndTimestamp, TopicPartition

log = logging.getLogger("sluice.client.consumer")
MISSING_TOPICS_CHECK_S = 3.0  # this long after subscribe(), poll() checks once that its topics exist

#: on_assign / on_revoke / on_lost: ``fn(consumer, partitions)``, partitions sorted.
RebalanceCallback = Callable[["Consumer", list[TopicPartition]], None]

ISOLATION_LEVELS = {
    "read_committed": records_pb2.READ_COMMITTED,
    "read_uncommitted": records_pb2.READ_UNCOMMITTED,
}


class Consumer:
    """Reads records from Sluice topics, alone (``assign``) or in a group (``subscribe``).

    Arguments (Kafka's consumer configs, in Python spelling):

    * ``group_id``: the consumer group; needed for ``subscribe``, ``commit``,
      ``committed`` and ``group_metadata``. None: a standalone consumer.
    * ``isolation_level``: "read_committed" (the default here; Kafka's default
      is "read_uncommitted") reads up to the last stable offset and never
      returns aborted records; "read_uncommitted" reads up to the high
      watermark, aborted records included.
    * ``auto_offset_reset``: where a partition without a committed offset
      starts: "earliest" (the default here), "latest", or "none" (raise
      OffsetOutOfRangeError).
    * ``enable_auto_commit``: commit positions every ``auto_commit_interval_ms``
      (in ``poll()``), before partitions are revoked, and on ``close()``. Off by default.
    * ``max_poll_records``: at most this many records per ``poll()``.
    * ``session_timeout_ms``, ``rebalance_timeout_ms``: group membership.
      ``heartbeat_interval_ms``: the coordinator sets the heartbeat interval
      (KIP-848, group.consumer.heartbeat.interval.ms); a value here can only
      shorten it (faster rebalances, more heartbeats).
    * ``fetch_max_wait_ms``, ``fetch_min_bytes``, ``fetch_max_bytes``,
      ``max_partition_fetch_bytes``: the long poll of each Fetch request.

    Not thread-safe, like Kafka's consumer: use it from one thread (the
    heartbeat runs on its own thread internally).
    """

    def __init__(
        self,
        bootstrap_servers: str | list[str],
        *,
        group_id: str | None = None,
        isolation_level: str = "read_committed",
        auto_offset_reset: str = "earliest",
        enable_auto_commit: bool = False,
        max_poll_records: int = 500,
        auto_commit_interval_ms: int = 5_000,
        session_timeout_ms: int = 45_000,
        heartbeat_interval_ms: int | None = None,
        rebalance_timeout_ms: int = 300_000,
        fetch_max_wait_ms: int = 500,
        fetch_min_bytes: int = 1,
        fetch_max_bytes: int = 52_428_800,
        max_partition_fetch_bytes: int = 1_048_576,
        request_timeout_ms: int = 30_000,
        security_protocol: str = "PLAINTEXT",
        ssl_cafile: str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
        sasl_mechanism: str | None = None,
        sasl_oauthbearer_token_file: str | None = None,
        client_id: str | None = None,
    ) -> None:
        if isolation_level not in ISOLATION_LEVELS:
            raise ValueError(f"isolation_level must be 'read_committed' or 'read_uncommitted', not {isolation_level!r}")
        if auto_offset_reset not in ("earliest", "latest", "none"):
            raise ValueError(f"auto_offset_reset must be 'earliest', 'latest' or 'none', not {auto_offset_reset!r}")
        if max_poll_records < 1:
            raise ValueError("max_poll_records must be at least 1")
        if group_id is not None and not group_id:
            raise ValueError("group_id must not be empty (use None for no group)")
        self.client_id = client_id or "sluice-consumer"
        self.group_id = group_id
        self.isolation_level = isolation_level
        self._isolation = ISOLATION_LEVELS[isolation_level]
        self.auto_offset_reset = auto_offset_reset
        self.enable_auto_commit = enable_auto_commit and group_id is not None
        self._auto_commit_interval = auto_commit_interval_ms / 1000.0
        self._next_auto_commit = time.monotonic() + self._auto_commit_interval
        self._max_poll_records = max_poll_records
        self._session_timeout_ms = session_timeout_ms
        self._heartbeat_interval_ms = heartbeat_interval_ms
        self._rebalance_timeout_ms = rebalance_timeout_ms
        self._request_timeout = request_timeout_ms / 1000.0
        self._cluster = Cluster(
            bootstrap_servers,
            request_timeout_ms=request_timeout_ms,
            client_id=self.client_id,
            security=ClientSecurity.build(
                security_protocol,
                ssl_cafile,
                ssl_certfile,
                ssl_keyfile,
                sasl_mechanism=sasl_mechanism,
                sasl_oauthbearer_token_file=sasl_oauthbearer_token_file,
            ),
        )
        # One lock for the subscription state and the fetcher's buffer (see the fetcher's docstring).
        self._lock = threading.RLock()
        self._subscriptions = SubscriptionState()
        self._fetcher = Fetcher(
            self._cluster,
            self._subscriptions,
            self._lock,
            FetchConfig(
                isolation=self._isolation,
                auto_offset_reset=auto_offset_reset,
                max_poll_records=max_poll_records,
                fetch_max_wait_ms=fetch_max_wait_ms,
                fetch_min_bytes=fetch_min_bytes,
                fetch_max_bytes=fetch_max_bytes,
                max_partition_fetch_bytes=max_partition_fetch_bytes,
                request_timeout=self._request_timeout,
            ),
        )
        self._member: GroupMember | None = None
        # when subscribe() was called, and whether poll() has since checked that its topics exist
        self._subscribed_at = 0.0
        self._topics_checked = True
        self._closed = False
        self._on_assign: RebalanceCallback | None = None
        self._on_revoke: RebalanceCallback | None = None
        self._on_lost: RebalanceCallback | None = None

    # ------------------------------------------------------------------ assignment

    def _require_group(self, action: str) -> str:
        if self.group_id is None:
            raise errors.InvalidGroupIdError(f"{action} needs a group_id (the consumer was created without one)")
        return self.group_id

    def _check_open(self) -> None:
        if self._closed:
            raise errors.IllegalStateError("the consumer is closed")

    def subscribe(
        self,
        topics: Iterable[str] | str,
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
        on_lost: RebalanceCallback | None = None,
    ) -> None:
        """Join the group and consume the partitions the coordinator assigns from ``topics``.

        ``on_assign``, ``on_revoke``, ``on_lost``: rebalance callbacks, each called as
        ``fn(consumer, partitions)`` from inside ``poll()`` (the module docstring
        says when and in which order). A new ``subscribe()`` replaces them.
        """
        self._check_open()
        group_id = self._require_group("subscribe()")
        for name, fn in (("on_assign", on_assign), ("on_revoke", on_revoke), ("on_lost", on_lost)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be a callable fn(consumer, partitions) or None, not {type(fn).__name__}")
        names = [topics] if isinstance(topics, str) else list(topics)
        if not names:
            self.unsubscribe()
            return
        self._on_assign, self._on_revoke, self._on_lost = on_assign, on_revoke, on_lost
        with self._lock:
            subs = self._subscriptions
            if subs.subscription is None and subs.assignment:
                raise errors.IllegalStateError("subscribe() and assign() cannot be mixed: call unsubscribe() first")
            subs.subscription = sorted(set(names))
            member = self._member
            self._subscribed_at, self._topics_checked = time.monotonic(), False
        if member is None:
            member = GroupMember(
                self._cluster,
                group_id,
                list(names),
                owned=self._owned,
                on_assignment=self._on_assignment,
                session_timeout_ms=self._session_timeout_ms,
                rebalance_timeout_ms=self._rebalance_timeout_ms,
                heartbeat_interval_ms=self._heartbeat_interval_ms,
                name=f"{self.client_id}-heartbeat",
            )
            with self._lock:
                self._member = member
            member.start()
        else:
            member.set_subscription(list(names))

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Consume exactly ``partitions`` (no group membership; positions of kept partitions are kept)."""
        self._check_open()
        # a TopicPartition, or a (topic, partition) pair
        tps = {
            given if isinstance(given, TopicPartition) else TopicPartition(given[0], given[1]) for given in partitions
        }
        with self._lock:
            if self._subscriptions.subscription is not None:
                raise errors.IllegalStateError("subscribe() and assign() cannot be mixed: call unsubscribe() first")
            for tp in self._subscriptions.assign(tps):
                self._fetcher.forget(tp)

    def unsubscribe(self) -> None:
        """Leave the group (or drop the manual assignment); on_revoke is told what is given up."""
        error = self._revoke_all_before_leaving() if self._member is not None else None
        with self._lock:
            member, self._member = self._member, None
            self._subscriptions.subscription = None
        if member is not None:
            if self.enable_auto_commit:
                self._commit_quietly(None)
            member.leave()
        with self._lock:
            self._subscriptions.clear()
            self._fetcher.clear()
        self._on_assign = self._on_revoke = self._on_lost = None
        if error is not None:
            raise error

    def _revoke_all_before_leaving(self) -> BaseException | None:
        """on_revoke with everything still assigned (not lost), before a leave; returns what it raised."""
        with self._lock:
            pending = self._subscriptions.pending_assignment
            lost = pending is not None and pending.lost
            assigned = sorted(self._subscriptions.assignment)
        if not assigned or lost:
            return None
        try:
            self._call(self._on_revoke, assigned)
        except Exception as exc:  # the leave goes on; the caller raises it after
            return exc
        return None

    def _call(self, callback: RebalanceCallback | None, partitions: list[TopicPartition]) -> None:
        if callback is not None and partitions:
            callback(self, partitions)

    def assignment(self) -> set[TopicPartition]:
        with self._lock:
            return set(self._subscriptions.assignment)

    def subscription(self) -> set[str]:
        with self._lock:
            return set(self._subscriptions.subscription or ())

    def _owned(self) -> list[TopicPartition]:
        with self._lock:
            return sorted(self._subscriptions.owned_partitions)

    def _on_assignment(self, target: frozenset[TopicPartition], lost: bool) -> None:
        """Called by the heartbeat thread with the coordinator's target: kept for the next poll()."""
        member = self._member
        metadata = member.metadata() if member is not None else GroupMetadata(self.group_id or "", "", -1)
        with self._lock:
            if self._closed:
                return
            self._subscriptions.leave_pending(target, lost, metadata)

    def _apply_pending_assignment(self) -> None:
        """In poll(): take on the assignment the heartbeat thread left pending (see the module docstring).

        Three steps, the lock released around the callbacks: what is given up
        (on_revoke before it is dropped, or on_lost), the new assignment, then
        on_assign with what was added. A callback's exception is raised once
        the assignment is applied, so the consumer's state never stays half-way.
        """
        with self._lock:
            subs = self._subscriptions
            pending, subs.pending_assignment = subs.pending_assignment, None
            if pending is None or self._closed or subs.subscription is None:
                return
            target, lost = pending.target, pending.lost
            # Commits from here on (auto-commit and on_revoke's) carry the newest epoch of this member:
            # the coordinator accepts an older one only for partitions it saw held since then, and a
            # partition taken on just before a rebalance may not have been reported yet.
            subs.metadata = self._newest_metadata(pending.metadata)
            assignment = subs.assignment
            # a lost member's partitions are all gone, even one the rejoin gave back: its position is stale
            given_up = sorted(assignment) if lost else sorted(tp for tp in assignment if tp not in target)
            if given_up and not lost and self.enable_auto_commit:
                offsets = {tp: st.position for tp in given_up if (st := assignment[tp]).position is not None}
                if offsets:
                    self._commit_quietly(offsets, timeout=min(5.0, self._request_timeout))
        error: BaseException | None = None
        try:
            if lost:
                self._call(self._on_lost or self._on_revoke, given_up)
            else:
                self._call(self._on_revoke, given_up)  # still assigned: the application may commit them
        except Exception as exc:
            error = exc
        with self._lock:
            if self._closed or subs.subscription is None:
                if error is not None:
                    raise error
                return
            assignment = subs.assignment
            for tp in given_up:
                assignment.pop(tp, None)
                self._fetcher.forget(tp)
            added = sorted(tp for tp in target if tp not in assignment)
            for tp in added:
                assignment[tp] = PartitionState()
            subs.owned_partitions = frozenset(assignment)
        member = self._member
        if given_up and member is not None:
            member.heartbeat_now()  # tell the coordinator they are free
        if given_up or added:
            log.info(
                "group %r: assignment now %s (%s %s)",
                self.group_id,
                sorted(map(str, target)),
                "lost" if lost else "revoked",
                sorted(map(str, given_up)),
            )
        try:
            self._call(self._on_assign, added)
        except Exception as exc:
            error = error or exc
        if error is not None:
            raise error

    def _newest_metadata(self, pending: GroupMetadata) -> GroupMetadata:
        """``pending``, or the heartbeat thread's metadata if it is the same member at a later epoch."""
        member = self._member
        if member is None:
            return pending
        live = member.metadata()
        if live.member_id == pending.member_id and live.member_epoch > pending.member_epoch:
            return live
        return pending

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        with self._lock:
            for tp in partitions:
                self._subscriptions.state(tp, "pause").paused = True

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        with self._lock:
            for tp in partitions:
                self._subscriptions.state(tp, "resume").paused = False

    def paused(self) -> set[TopicPartition]:
        with self._lock:
            return self._subscriptions.paused()

    # ------------------------------------------------------------------ positions

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Make ``offset`` the next offset poll() returns for ``partition``."""
        if offset < 0:
            raise ValueError("offset must be >= 0")
        with self._lock:
            st = self._subscriptions.state(partition, "seek")
            st.position = int(offset)
            st.reset_pending = False
            self._fetcher.forget(partition)

    def seek_to_beginning(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        self._seek_to(partitions, EARLIEST)

    def seek_to_end(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        self._seek_to(partitions, LATEST)

    def _seek_to(self, partitions: Iterable[TopicPartition] | None, timestamp: int) -> None:
        tps = list(partitions) if partitions is not None else sorted(self.assignment())
        with self._lock:
            for tp in tps:
                self._subscriptions.state(tp, "seek")
        offsets = self._fetcher.list_offsets(tps, timestamp, Deadline(self._request_timeout))
        for tp, off in offsets.items():
            if off is not None:
                self.seek(tp, off)

    def position(self, partition: TopicPartition, timeout: float | None = None) -> int:
        """The offset of the next record poll() returns for ``partition`` (looked up if not known yet)."""
        self._check_open()
        with self._lock:
            st = self._subscriptions.state(partition, "get the position of")
            if st.position is not None:
                return st.position
        self._update_positions(Deadline(self._request_timeout if timeout is None else timeout), raise_errors=True)
        with self._lock:
            position = self._subscriptions.state(partition, "get the position of").position
        if position is None:
            raise errors.KafkaTimeoutError(f"the position of {partition} could not be determined in time")
        return position

    def _update_positions(self, deadline: Deadline, raise_errors: bool) -> None:
        """Look up positions that are not known: committed offset, else auto_offset_reset."""
        with self._lock:
            need = self._subscriptions.missing_positions()
        if not need:
            return
        try:
            positions: dict[TopicPartition, int] = {}
            use_committed = [tp for tp, reset in need.items() if not reset]
            if self.group_id is not None and use_committed:
                committed = fetch_committed(
                    self._cluster, self.group_id, use_committed, deadline, self._isolation == records_pb2.READ_COMMITTED
                )
                positions.update({tp: off for tp, off in committed.items() if off is not None})
            rest = [tp for tp in need if tp not in positions]
            if rest:
                if self.auto_offset_reset == "none":
                    raise errors.OffsetOutOfRangeError(
                        f"no committed offset (or an out-of-range one) for {', '.join(map(str, sorted(rest)))} "
                        "and auto_offset_reset='none'"
                    )
                stamp = EARLIEST if self.auto_offset_reset == "earliest" else LATEST
                for tp, off in self._fetcher.list_offsets(rest, stamp, deadline).items():
                    if off is not None:
                        positions[tp] = off
        except errors.SluiceError as exc:
            if raise_errors or not exc.retriable:
                raise
            log.debug("positions not known yet: %s", exc)
            return
        with self._lock:
            self._subscriptions.set_positions(positions)

    # ------------------------------------------------------------------ poll

    def poll(self, timeout: float = 1.0, max_records: int | None = None) -> list[ConsumerRecord]:
        """Records from the assigned partitions, waiting up to ``timeout`` seconds for some.

        Returns at most ``max_records`` (default max_poll_records), possibly
        none. Raises a fatal error of the group or of a fetch.
        """
        if _tracing.tracer is None:
            return self._poll(timeout, max_records)
        return list(_tracing.polled(self._poll, timeout, max_records))  # a span (sluice.client.tracing)

    def _poll(self, timeout: float, max_records: int | None) -> list[ConsumerRecord]:
        self._check_open()
        deadline = Deadline(max(0.0, timeout))
        limit = max_records or self._max_poll_records
        self._maybe_auto_commit()
        while True:
            self._raise_pending()
            self._apply_pending_assignment()
            with self._lock:
                assigned = bool(self._subscriptions.assignment)
                subscribed = self._subscriptions.subscription is not None
            if not self._topics_checked and time.monotonic() > self._subscribed_at + MISSING_TOPICS_CHECK_S:
                self._warn_missing_topics()
            if not assigned:
                if not subscribed:
                    raise errors.IllegalStateError(
                        "poll(): the consumer is not subscribed to topics or assigned partitions"
                    )
                if deadline.expired():
                    return []
                member = self._member
                if member is not None:
                    with member.assignment_changed:
                        member.assignment_changed.wait(min(0.1, deadline.remaining()))
                continue
            self._update_positions(Deadline(max(deadline.remaining(), 1.0)), raise_errors=False)
            records = self._fetcher.drain(limit)
            if records:
                self._fetcher.collect_fetches()
                self._fetcher.send_fetches(deadline)  # prefetch what follows, while the application works
                return records
            sent = self._fetcher.send_fetches(deadline)
            self._fetcher.wait_fetches(deadline, sent)
            records = self._fetcher.drain(limit)
            if records:
                return records
            if deadline.expired():
                self._raise_pending()
                return []

    def _warn_missing_topics(self) -> None:
        """A while after subscribe(): say which subscribed topics do not exist (once per subscribe()).

        The group assigns only partitions of topics that exist, so a misspelt or not yet created
        topic made poll() return nothing forever, without a word.
        """
        self._topics_checked = True
        with self._lock:
            names = list(self._subscriptions.subscription or [])
        if not names:  # unsubscribed since (and no names would ask for every topic)
            return
        try:
            response = self._cluster.refresh(names, timeout=2.0)
        except errors.SluiceError:
            return  # no answer now: the group's own errors will say more
        missing = sorted(t.name for t in response.topics if t.error_code == records_pb2.UNKNOWN_TOPIC_OR_PARTITION)
        if missing:
            log.warning(
                "subscribed to topic(s) that do not exist: %s; poll() returns nothing from them until they are "
                "created (sluice topics create NAME)",
                ", ".join(repr(n) for n in missing),
            )

    def _raise_pending(self) -> None:
        member = self._member
        if member is not None and member.fatal_error is not None:
            raise member.fatal_error
        exc = self._fetcher.take_error()
        if exc is not None:
            raise exc

    # ------------------------------------------------------------------ offsets

    def committed(
        self, partitions: Iterable[TopicPartition], timeout: float | None = None
    ) -> dict[TopicPartition, int | None]:
        """The group's committed offsets (next offset to read) for ``partitions``; None where there is none.

        With isolation_level="read_committed" (the default), a partition whose
        offsets an open transaction is committing has no stable offset yet:
        this waits for that transaction to end (require_stable, retrying
        UNSTABLE_OFFSET_COMMIT until ``timeout``), as Kafka's Java consumer
        does. Answering the older offset at once would let a consume-
        transform-produce loop that rewinds after an abort copy again what a
        previous owner of the partition is committing. read_uncommitted
        answers at once with the last committed offsets.
        """
        self._check_open()
        tps = list(partitions)
        deadline = Deadline(self._request_timeout if timeout is None else timeout)
        return fetch_committed(
            self._cluster,
            self._require_group("committed offsets"),
            tps,
            deadline,
            require_stable=self._isolation == records_pb2.READ_COMMITTED,
        )

    def commit(self, offsets: Mapping[TopicPartition, int] | None = None, timeout: float | None = None) -> None:
        """Commit ``offsets`` (next offset to read per partition), or the positions of every assigned partition.

        Synchronous. A member that lost its partitions in a rebalance gets
        UnknownMemberIdError / FencedMemberEpochError.
        """
        self._check_open()
        group_id = self._require_group("commit()")
        if offsets is None:
            with self._lock:
                offsets = self._subscriptions.positions()
        if not offsets:
            return
        commit_offsets(
            self._cluster,
            group_id,
            self._group_metadata(group_id),
            offsets,
            Deadline(self._request_timeout if timeout is None else timeout),
        )

    def _commit_quietly(self, offsets: Mapping[TopicPartition, int] | None, timeout: float | None = None) -> None:
        try:
            self.commit(offsets, timeout)
        except errors.SluiceError as exc:
            log.warning("auto-commit of group %r failed: %s", self.group_id, exc)

    def _maybe_auto_commit(self) -> None:
        if not self.enable_auto_commit:
            return
        now = time.monotonic()
        if now >= self._next_auto_commit:
            self._next_auto_commit = now + self._auto_commit_interval
            self._commit_quietly(None)

    def group_metadata(self) -> GroupMetadata:
        """The group id, member id and member epoch, for Producer.send_offsets_to_transaction()."""
        return self._group_metadata(self._require_group("group_metadata()"))

    def _group_metadata(self, group_id: str) -> GroupMetadata:
        """As of the assignment the last poll() applied (the live one before any poll)."""
        member = self._member
        if member is None:
            return GroupMetadata(group_id, "", -1)
        with self._lock:
            metadata = self._subscriptions.metadata
        return metadata if metadata is not None else member.metadata()

    def beginning_offsets(
        self, partitions: Iterable[TopicPartition], timeout: float | None = None
    ) -> dict[TopicPartition, int]:
        """The first offset of each partition (its log start offset)."""
        return self._offsets(partitions, EARLIEST, timeout)

    def end_offsets(
        self, partitions: Iterable[TopicPartition], timeout: float | None = None
    ) -> dict[TopicPartition, int]:
        """The end of each partition: the last stable offset for read_committed, else the high watermark."""
        return self._offsets(partitions, LATEST, timeout)

    def _offsets(
        self, partitions: Iterable[TopicPartition], timestamp: int, timeout: float | None
    ) -> dict[TopicPartition, int]:
        self._check_open()
        deadline = Deadline(self._request_timeout if timeout is None else timeout)
        found = self._fetcher.list_offsets(partitions, timestamp, deadline)
        return {tp: (off if off is not None else 0) for tp, off in found.items()}

    def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int], timeout: float | None = None
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """Per partition, the earliest offset whose timestamp is >= the given one (ms), with that
        record's timestamp; None where no record is that recent (Kafka's offsetsForTimes)."""
        self._check_open()
        for tp, stamp in timestamps.items():
            if stamp < 0:
                raise ValueError(f"the timestamp for {tp} must be >= 0")
        deadline = Deadline(self._request_timeout if timeout is None else timeout)
        found = self._fetcher.list_offsets_at(dict(timestamps), deadline)
        return {tp: OffsetAndTimestamp(off, ts) if off is not None else None for tp, (off, ts) in found.items()}

    def list_topics(self) -> list[str]:
        """Names of the cluster's (non-internal) topics."""
        response = self._cluster.refresh()
        return sorted(t.name for t in response.topics if not t.internal and t.error_code == records_pb2.NONE)

    def partitions_for_topic(self, topic: str) -> list[int]:
        info = self._cluster.wait_for_topic(topic, Deadline(self._request_timeout))
        return sorted(info.partitions)

    # ------------------------------------------------------------------ lifecycle

    def close(self, timeout: float | None = None) -> None:
        """Commit (with auto-commit), leave the group, stop. Idempotent."""
        if self._closed:
            return
        error = self._revoke_all_before_leaving() if self._member is not None else None
        if self.enable_auto_commit:
            self._commit_quietly(None, timeout)
        with self._lock:
            self._closed = True
            member, self._member = self._member, None
        if member is not None:
            member.leave(5.0 if timeout is None else timeout)
        self._fetcher.close()
        self._cluster.close()
        if error is not None:
            raise error

    def __enter__(self) -> Consumer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Consumer(group_id={self.group_id!r}, isolation_level={self.isolation_level!r})"


__all__ = ["Consumer"]
