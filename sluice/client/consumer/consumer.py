"""The Sluice consumer: fetch from partition leaders, track positions, commit offsets.

Design:

* State is per assigned partition: the *position* (the next offset to
  return), unknown until it is looked up. A position comes from the
  group's committed offset (OffsetFetch with ``require_stable`` for
  read_committed consumers, so offsets of an open transaction are never used
  half-done: UNSTABLE_OFFSET_COMMIT is retried), else from
  ``auto_offset_reset`` (ListOffsets: earliest -2, latest -1, none: an error).
* ``poll()`` keeps at most one Fetch request in flight per partition
  (``grpc.Future``s that survive between polls; a leader may have several, so
  a long poll for partitions at their end never holds up the others), decodes
  the batches with :func:`sluice.records.decode_record_tuples` into a
  per-partition buffer, and hands out at most ``max_poll_records`` records,
  round-robin over partitions. Once no more than ``max_poll_records`` records
  of a partition are buffered, the next fetch for it is sent (a prefetch, from
  the end of what is buffered), so records are there when the application
  asks. Control batches and records below the position are
  skipped; once a fetched range is used up the position moves to the
  response's ``next_fetch_offset``, which steps over aborted and control
  batches the broker filtered out.
* A fetch response is used only if the partition is still assigned and its
  position (or, for a prefetch, the end of its buffer) is still the offset
  that was fetched: a ``seek()`` or a rebalance while the fetch was in flight
  simply discards it.
* ``subscribe()`` hands membership to a :class:`~sluice.client.consumer.coordinator.GroupMember`
  thread (ConsumerGroupHeartbeat, KIP-848 shape); ``assign()`` sets the
  assignment by hand. One lock guards the state; no network call is made
  while it is held, except the commit of revoked partitions' positions
  during a rebalance (with auto-commit).
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
from collections.abc import Iterable, Mapping
from concurrent.futures import CancelledError
from dataclasses import dataclass
from types import TracebackType

import grpc

from sluice import errors
from sluice.api.v1 import broker_pb2, records_pb2
from sluice.client._network import (
    GROUP,
    METADATA_REFRESH_CODES,
    Backoff,
    Cluster,
    Deadline,
    first_error,
    map_rpc_error,
)
from sluice.client._network import rpc as rpcs
from sluice.client.consumer.coordinator import GroupMember
from sluice.client.types import (
    ConsumerRecord,
    GroupMetadata,
    OffsetAndTimestamp,
    TopicPartition,
    consumer_record,
)
from sluice.records import RecordDecodeError, decode_record_tuples

log = logging.getLogger("sluice.client.consumer")

ISOLATION_LEVELS = {
    "read_committed": records_pb2.READ_COMMITTED,
    "read_uncommitted": records_pb2.READ_UNCOMMITTED,
}
EARLIEST = -2
LATEST = -1


@dataclass(slots=True)
class _PartitionState:
    position: int | None = None
    reset_pending: bool = False  # use auto_offset_reset, not the committed offset (after OFFSET_OUT_OF_RANGE)
    paused: bool = False
    retry_at: float = 0.0
    high_watermark: int = -1
    last_stable_offset: int = -1


@dataclass(slots=True)
class _Fetched:
    records: list[ConsumerRecord]
    index: int
    next_fetch_offset: int


@dataclass(slots=True)
class _InFlightFetch:
    addr: str
    offsets: dict[TopicPartition, int]
    future: grpc.Future[broker_pb2.FetchResponse]


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
        self._fetch_max_wait_ms = fetch_max_wait_ms
        self._fetch_min_bytes = fetch_min_bytes
        self._fetch_max_bytes = fetch_max_bytes
        self._max_partition_fetch_bytes = max_partition_fetch_bytes
        self._request_timeout = request_timeout_ms / 1000.0
        self._cluster = Cluster(bootstrap_servers, request_timeout_ms=request_timeout_ms)
        self._lock = threading.RLock()
        self._assignment: dict[TopicPartition, _PartitionState] = {}
        self._buffer: dict[TopicPartition, _Fetched] = {}
        # Fetches under way, by a serial number: at most one per partition, any number per leader
        # (a long poll for partitions at their end must not hold up the others).
        self._fetches: dict[int, _InFlightFetch] = {}
        self._fetch_serial = 0
        self._fetch_event = threading.Event()
        self._subscription: list[str] | None = None
        self._member: GroupMember | None = None
        # From the heartbeat thread, applied by the next poll(): (target, lost, member metadata)
        self._pending_assignment: tuple[frozenset[TopicPartition], bool, GroupMetadata] | None = None
        self._owned_partitions: frozenset[TopicPartition] = frozenset()  # reported in heartbeats
        self._metadata: GroupMetadata | None = None  # as of the last applied assignment
        self._pending_error: errors.SluiceError | None = None
        self._closed = False

    # ------------------------------------------------------------------ assignment

    def _require_group(self, action: str) -> str:
        if self.group_id is None:
            raise errors.InvalidGroupIdError(f"{action} needs a group_id (the consumer was created without one)")
        return self.group_id

    def _check_open(self) -> None:
        if self._closed:
            raise errors.IllegalStateError("the consumer is closed")

    def subscribe(self, topics: Iterable[str] | str) -> None:
        """Join the group and consume the partitions the coordinator assigns from ``topics``."""
        self._check_open()
        group_id = self._require_group("subscribe()")
        names = [topics] if isinstance(topics, str) else list(topics)
        if not names:
            self.unsubscribe()
            return
        with self._lock:
            if self._subscription is None and self._assignment:
                raise errors.IllegalStateError("subscribe() and assign() cannot be mixed: call unsubscribe() first")
            self._subscription = sorted(set(names))
            member = self._member
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
        tps = {TopicPartition(tp[0], tp[1]) if not isinstance(tp, TopicPartition) else tp for tp in partitions}
        with self._lock:
            if self._subscription is not None:
                raise errors.IllegalStateError("subscribe() and assign() cannot be mixed: call unsubscribe() first")
            for tp in list(self._assignment):
                if tp not in tps:
                    del self._assignment[tp]
                    self._buffer.pop(tp, None)
            for tp in tps:
                self._assignment.setdefault(tp, _PartitionState())

    def unsubscribe(self) -> None:
        """Leave the group (or drop the manual assignment)."""
        with self._lock:
            member, self._member = self._member, None
            self._subscription = None
        if member is not None:
            if self.enable_auto_commit:
                self._commit_quietly(None)
            member.leave()
        with self._lock:
            self._assignment.clear()
            self._buffer.clear()
            self._pending_assignment = None
            self._owned_partitions = frozenset()
            self._metadata = None

    def assignment(self) -> set[TopicPartition]:
        with self._lock:
            return set(self._assignment)

    def subscription(self) -> set[str]:
        with self._lock:
            return set(self._subscription or ())

    def _owned(self) -> list[TopicPartition]:
        with self._lock:
            return sorted(self._owned_partitions)

    def _on_assignment(self, target: frozenset[TopicPartition], lost: bool) -> None:
        """Called by the heartbeat thread with the coordinator's target: kept for the next poll()."""
        member = self._member
        metadata = member.metadata() if member is not None else GroupMetadata(self.group_id or "", "", -1)
        with self._lock:
            if self._closed:
                return
            if lost:
                self._owned_partitions = frozenset()  # not ours any more, whatever the application holds
            pending = self._pending_assignment
            # a loss not applied yet stays a loss: nothing of those partitions may be committed
            self._pending_assignment = (target, lost or (pending is not None and pending[1]), metadata)

    def _apply_pending_assignment(self) -> None:
        """In poll(): take on the assignment the heartbeat thread left pending (see the module docstring)."""
        with self._lock:
            pending, self._pending_assignment = self._pending_assignment, None
            if pending is None or self._closed or self._subscription is None:
                return
            target, lost, metadata = pending
            self._metadata = metadata
            revoked = [tp for tp in self._assignment if tp not in target]
            added = [tp for tp in target if tp not in self._assignment]
            if revoked and not lost and self.enable_auto_commit:
                offsets = {tp: st.position for tp in revoked if (st := self._assignment[tp]).position is not None}
                if offsets:
                    self._commit_quietly(offsets, timeout=min(5.0, self._request_timeout))
            for tp in revoked:
                del self._assignment[tp]
                self._buffer.pop(tp, None)
            for tp in added:
                self._assignment[tp] = _PartitionState()
            self._owned_partitions = frozenset(self._assignment)
        member = self._member
        if revoked and member is not None:
            member.heartbeat_now()  # tell the coordinator they are free
        if revoked or added:
            log.info(
                "group %r: assignment now %s (revoked %s%s)",
                self.group_id,
                sorted(map(str, target)),
                sorted(map(str, revoked)),
                ", lost" if lost else "",
            )

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        with self._lock:
            for tp in partitions:
                self._state(tp, "pause").paused = True

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        with self._lock:
            for tp in partitions:
                self._state(tp, "resume").paused = False

    def paused(self) -> set[TopicPartition]:
        with self._lock:
            return {tp for tp, st in self._assignment.items() if st.paused}

    def _state(self, tp: TopicPartition, action: str) -> _PartitionState:
        st = self._assignment.get(tp)
        if st is None:
            raise errors.IllegalStateError(f"cannot {action} {tp}: the partition is not assigned to this consumer")
        return st

    # ------------------------------------------------------------------ positions

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Make ``offset`` the next offset poll() returns for ``partition``."""
        if offset < 0:
            raise ValueError("offset must be >= 0")
        with self._lock:
            st = self._state(partition, "seek")
            st.position = int(offset)
            st.reset_pending = False
            self._buffer.pop(partition, None)

    def seek_to_beginning(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        self._seek_to(partitions, EARLIEST)

    def seek_to_end(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        self._seek_to(partitions, LATEST)

    def _seek_to(self, partitions: Iterable[TopicPartition] | None, timestamp: int) -> None:
        tps = list(partitions) if partitions is not None else sorted(self.assignment())
        with self._lock:
            for tp in tps:
                self._state(tp, "seek")
        offsets = self._list_offsets(tps, timestamp, Deadline(self._request_timeout))
        for tp, off in offsets.items():
            if off is not None:
                self.seek(tp, off)

    def position(self, partition: TopicPartition, timeout: float | None = None) -> int:
        """The offset of the next record poll() returns for ``partition`` (looked up if not known yet)."""
        self._check_open()
        with self._lock:
            st = self._state(partition, "get the position of")
            if st.position is not None:
                return st.position
        self._update_positions(Deadline(self._request_timeout if timeout is None else timeout), raise_errors=True)
        with self._lock:
            position = self._state(partition, "get the position of").position
        if position is None:
            raise errors.KafkaTimeoutError(f"the position of {partition} could not be determined in time")
        return position

    def _update_positions(self, deadline: Deadline, raise_errors: bool) -> None:
        """Look up positions that are not known: committed offset, else auto_offset_reset."""
        with self._lock:
            need = {tp: st.reset_pending for tp, st in self._assignment.items() if st.position is None}
        if not need:
            return
        try:
            positions: dict[TopicPartition, int] = {}
            use_committed = [tp for tp, reset in need.items() if not reset]
            if self.group_id is not None and use_committed:
                committed = self._fetch_committed(
                    use_committed, deadline, self._isolation == records_pb2.READ_COMMITTED
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
                for tp, off in self._list_offsets(rest, stamp, deadline).items():
                    if off is not None:
                        positions[tp] = off
        except errors.SluiceError as exc:
            if raise_errors or not exc.retriable:
                raise
            log.debug("positions not known yet: %s", exc)
            return
        with self._lock:
            for tp, off in positions.items():
                st = self._assignment.get(tp)
                if st is not None and st.position is None:
                    st.position = off
                    st.reset_pending = False

    # ------------------------------------------------------------------ poll

    def poll(self, timeout: float = 1.0, max_records: int | None = None) -> list[ConsumerRecord]:
        """Records from the assigned partitions, waiting up to ``timeout`` seconds for some.

        Returns at most ``max_records`` (default max_poll_records), possibly
        none. Raises a fatal error of the group or of a fetch.
        """
        self._check_open()
        deadline = Deadline(max(0.0, timeout))
        limit = max_records or self._max_poll_records
        self._maybe_auto_commit()
        while True:
            self._raise_pending()
            self._apply_pending_assignment()
            with self._lock:
                assigned = bool(self._assignment)
                subscribed = self._subscription is not None
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
            records = self._drain(limit)
            if records:
                self._collect_fetches()
                self._send_fetches(deadline)  # prefetch what follows, while the application works
                return records
            sent = self._send_fetches(deadline)
            self._wait_fetches(deadline, sent)
            records = self._drain(limit)
            if records:
                return records
            if deadline.expired():
                self._raise_pending()
                return []

    def _raise_pending(self) -> None:
        member = self._member
        if member is not None and member.fatal_error is not None:
            raise member.fatal_error
        with self._lock:
            exc, self._pending_error = self._pending_error, None
        if exc is not None:
            raise exc

    def _drain(self, limit: int) -> list[ConsumerRecord]:
        out: list[ConsumerRecord] = []
        with self._lock:
            for tp in list(self._buffer):
                if len(out) >= limit:
                    break
                fetched = self._buffer[tp]
                st = self._assignment.get(tp)
                if st is None or st.position is None:
                    del self._buffer[tp]
                    continue
                if st.paused:
                    continue
                records = fetched.records
                index = fetched.index
                # records are in offset order: skip any below the position, then take a slice
                while index < len(records) and records[index].offset < st.position:
                    index += 1
                take = records[index : index + (limit - len(out))]
                if take:
                    out += take
                    st.position = take[-1].offset + 1
                fetched.index = index + len(take)
                del self._buffer[tp]  # re-inserted at the end: round-robin between partitions
                if fetched.index < len(records):
                    self._buffer[tp] = fetched
                elif fetched.next_fetch_offset > st.position:
                    st.position = fetched.next_fetch_offset
        return out

    def _send_fetches(self, deadline: Deadline) -> int:
        """Start a Fetch to each leader for its fetchable partitions (none in flight); how many are in flight."""
        now = time.monotonic()
        by_leader: dict[str, dict[TopicPartition, tuple[int, int]]] = {}
        unknown: set[str] = set()
        with self._lock:
            busy = {tp for f in self._fetches.values() for tp in f.offsets}
            for tp, st in self._assignment.items():
                if st.position is None or st.paused or st.retry_at > now or tp in busy:
                    continue
                offset = st.position
                buffered = self._buffer.get(tp)
                if buffered is not None:
                    # Prefetch: once few buffered records are left, fetch what follows them, so the
                    # next records are already here when these are used up.
                    if len(buffered.records) - buffered.index > self._max_poll_records:
                        continue
                    offset = buffered.next_fetch_offset
                leader = self._cluster.leader(tp.topic, tp.partition)
                if leader is None:
                    unknown.add(tp.topic)
                    continue
                addr, epoch = leader
                by_leader.setdefault(addr, {})[tp] = (offset, epoch)
        if unknown:
            self._cluster.refresh_if_stale(unknown, min_age=0.1)
        max_wait = int(min(self._fetch_max_wait_ms, deadline.remaining() * 1000))
        for addr, parts in by_leader.items():
            topics: dict[str, list[broker_pb2.FetchPartition]] = {}
            for tp, (offset, epoch) in parts.items():
                topics.setdefault(tp.topic, []).append(
                    broker_pb2.FetchPartition(
                        partition=tp.partition,
                        fetch_offset=offset,
                        partition_max_bytes=self._max_partition_fetch_bytes,
                        current_leader_epoch=epoch if epoch >= 0 else -1,
                    )
                )
            request = broker_pb2.FetchRequest(
                max_wait_ms=max(0, max_wait),
                min_bytes=self._fetch_min_bytes,
                max_bytes=self._fetch_max_bytes,
                isolation_level=self._isolation,
                topics=[broker_pb2.FetchTopic(name=t, partitions=ps) for t, ps in topics.items()],
                replica_id=-1,
            )
            try:
                future = self._cluster.call_future(addr, rpcs.FETCH, request, max_wait / 1000.0 + self._request_timeout)
            except Exception as exc:
                log.debug("fetch to %s could not start: %s", addr, exc)
                continue
            fetch = _InFlightFetch(addr, {tp: off for tp, (off, _e) in parts.items()}, future)
            with self._lock:
                self._fetch_serial += 1
                self._fetches[self._fetch_serial] = fetch
            future.add_done_callback(lambda _f: self._fetch_event.set())
        with self._lock:
            return len(self._fetches)

    def _wait_fetches(self, deadline: Deadline, in_flight: int) -> None:
        if in_flight == 0:
            time.sleep(min(0.05, deadline.remaining()))
            return
        self._fetch_event.wait(deadline.remaining())
        self._fetch_event.clear()
        self._collect_fetches()

    def _collect_fetches(self) -> None:
        """Handle the fetches that came back (without waiting)."""
        with self._lock:
            done = [(serial, f) for serial, f in self._fetches.items() if f.future.done()]
            for serial, _f in done:
                del self._fetches[serial]
        for _serial, f in done:
            self._handle_fetch(f)

    def _handle_fetch(self, fetch: _InFlightFetch) -> None:
        try:
            response: broker_pb2.FetchResponse = fetch.future.result()
        except CancelledError:
            return
        except grpc.RpcError as rpc_exc:
            exc = map_rpc_error(rpc_exc, fetch.addr, rpcs.FETCH.name)
            if not exc.retriable:
                with self._lock:
                    self._pending_error = exc
                return
            log.debug("fetch from %s failed: %s", fetch.addr, exc)
            retry_at = time.monotonic() + 0.1
            with self._lock:
                for tp in fetch.offsets:
                    self._cluster.forget_leader(tp.topic, tp.partition)
                    st = self._assignment.get(tp)
                    if st is not None:
                        st.retry_at = retry_at
            return
        now = time.monotonic()
        for topic in response.topics:
            for p in topic.partitions:
                tp = TopicPartition(topic.name, p.partition)
                fetch_offset = fetch.offsets.get(tp)
                if fetch_offset is None:
                    continue
                with self._lock:
                    st = self._assignment.get(tp)
                    buffered = self._buffer.get(tp)
                    prefetch = buffered is not None and buffered.next_fetch_offset == fetch_offset
                    if st is None or (st.position != fetch_offset and not prefetch):
                        continue  # revoked or sought while the fetch was in flight
                code = p.error_code
                if prefetch and code != records_pb2.NONE:
                    continue  # the buffered records are still good; the next fetch meets the error again
                if code == records_pb2.NONE:
                    self._accept(tp, fetch_offset, p)
                    continue
                err = errors.error_for(code, p.error_message)
                with self._lock:
                    if code == records_pb2.OFFSET_OUT_OF_RANGE:
                        if self.auto_offset_reset == "none":
                            self._pending_error = errors.OffsetOutOfRangeError(
                                f"offset {fetch_offset} of {tp} is out of range and auto_offset_reset='none': "
                                f"{p.error_message}"
                            )
                        else:
                            log.info(
                                "offset %d of %s out of range: resetting to %s",
                                fetch_offset,
                                tp,
                                self.auto_offset_reset,
                            )
                            st.position = None
                            st.reset_pending = True
                    elif code in METADATA_REFRESH_CODES:
                        self._cluster.forget_leader(tp.topic, tp.partition)
                        st.retry_at = now + 0.05
                    elif err.retriable:
                        st.retry_at = now + 0.1
                    else:
                        self._pending_error = err

    def _accept(self, tp: TopicPartition, fetch_offset: int, p: broker_pb2.FetchPartitionResponse) -> None:
        records: list[ConsumerRecord] = []
        end = p.next_fetch_offset
        topic, partition = tp.topic, tp.partition
        try:
            for batch in p.batches:
                last = batch.base_offset + batch.record_count
                if last > end:
                    end = last
                if batch.control or last <= fetch_offset:
                    continue
                # the per-record hot path: tuples from the decoder, one record object each
                records += [
                    consumer_record(topic, partition, offset, key, value, headers, timestamp)
                    for offset, timestamp, key, value, headers in decode_record_tuples(batch, fetch_offset)
                ]
        except RecordDecodeError as exc:
            with self._lock:
                self._pending_error = errors.CorruptMessageError(f"{tp} at offset {fetch_offset}: {exc}")
            return
        with self._lock:
            st = self._assignment.get(tp)
            if st is None:
                return
            buffered = self._buffer.get(tp)
            if buffered is not None and buffered.next_fetch_offset == fetch_offset:
                # a prefetch: what follows the buffered records (dropping those already returned)
                buffered.records = buffered.records[buffered.index :] + records
                buffered.index = 0
                buffered.next_fetch_offset = max(end, fetch_offset)
            elif st.position != fetch_offset or buffered is not None:
                return  # sought, or the buffer was replaced, while the fetch was in flight
            elif records:
                self._buffer[tp] = _Fetched(records, 0, end)
            elif end > fetch_offset:
                st.position = end
            st.high_watermark = p.high_watermark
            st.last_stable_offset = p.last_stable_offset

    # ------------------------------------------------------------------ offsets

    def _fetch_committed(
        self, tps: list[TopicPartition], deadline: Deadline, require_stable: bool
    ) -> dict[TopicPartition, int | None]:
        group_id = self._require_group("committed offsets")
        request = broker_pb2.OffsetFetchRequest(
            group_id=group_id,
            partitions=[records_pb2.TopicPartition(topic=tp.topic, partition=tp.partition) for tp in tps],
            require_stable=require_stable,
        )

        def error_of(r: broker_pb2.OffsetFetchResponse) -> tuple[int, str]:
            wanted = set(tps)
            return first_error(
                [(r.error_code, r.error_message)]
                + [
                    (x.error_code, x.error_message)
                    for x in r.partitions
                    if TopicPartition(x.topic, x.partition) in wanted
                    and x.error_code != records_pb2.UNKNOWN_TOPIC_OR_PARTITION
                ]
            )

        response: broker_pb2.OffsetFetchResponse = self._cluster.coordinator_call(
            group_id, GROUP, rpcs.OFFSET_FETCH, request, error_of, deadline
        )
        out: dict[TopicPartition, int | None] = dict.fromkeys(tps)
        for x in response.partitions:
            tp = TopicPartition(x.topic, x.partition)
            if tp in out and x.error_code == records_pb2.NONE:
                out[tp] = x.committed_offset if x.committed_offset >= 0 else None
        return out

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
        return self._fetch_committed(tps, deadline, require_stable=self._isolation == records_pb2.READ_COMMITTED)

    def commit(self, offsets: Mapping[TopicPartition, int] | None = None, timeout: float | None = None) -> None:
        """Commit ``offsets`` (next offset to read per partition), or the positions of every assigned partition.

        Synchronous. A member that lost its partitions in a rebalance gets
        UnknownMemberIdError / FencedMemberEpochError.
        """
        self._check_open()
        group_id = self._require_group("commit()")
        if offsets is None:
            with self._lock:
                offsets = {tp: st.position for tp, st in self._assignment.items() if st.position is not None}
        if not offsets:
            return
        by_topic: dict[str, list[broker_pb2.OffsetCommitPartition]] = {}
        for tp, offset in offsets.items():
            if offset < 0:
                raise ValueError(f"cannot commit a negative offset for {tp}")
            by_topic.setdefault(tp.topic, []).append(
                broker_pb2.OffsetCommitPartition(
                    partition=tp.partition, committed_offset=int(offset), committed_leader_epoch=-1
                )
            )
        gm = self._group_metadata(group_id)
        request = broker_pb2.OffsetCommitRequest(
            group_id=group_id,
            member_id=gm.member_id,
            member_epoch=gm.member_epoch if gm.member_id else -1,
            topics=[broker_pb2.OffsetCommitTopic(name=t, partitions=ps) for t, ps in by_topic.items()],
        )
        self._cluster.coordinator_call(
            group_id,
            GROUP,
            rpcs.OFFSET_COMMIT,
            request,
            lambda r: first_error((x.error_code, x.error_message) for x in r.results),
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
            metadata = self._metadata
        return metadata if metadata is not None else member.metadata()

    def _list_offsets(
        self, tps: Iterable[TopicPartition], timestamp: int, deadline: Deadline
    ) -> dict[TopicPartition, int | None]:
        """ListOffsets at the partitions' leaders; offset None where no record matches ``timestamp``."""
        found = self._list_offsets_at(dict.fromkeys(tps, timestamp), deadline)
        return {tp: off for tp, (off, _ts) in found.items()}

    def _list_offsets_at(
        self, wanted: dict[TopicPartition, int], deadline: Deadline
    ) -> dict[TopicPartition, tuple[int | None, int]]:
        """(offset or None, timestamp) per partition, from ListOffsets at each leader."""
        remaining = dict(wanted)
        out: dict[TopicPartition, tuple[int | None, int]] = {}
        backoff = Backoff()
        last: errors.SluiceError | None = None
        while remaining:
            by_leader: dict[str, list[TopicPartition]] = {}
            unknown: set[str] = set()
            for tp in remaining:
                leader = self._cluster.leader(tp.topic, tp.partition)
                if leader is None:
                    unknown.add(tp.topic)
                else:
                    by_leader.setdefault(leader[0], []).append(tp)
            if unknown:
                try:
                    for topic in unknown:
                        self._cluster.wait_for_topic(topic, Deadline(min(deadline.remaining(), 1.0)))
                    # known topics whose partition (added since) or leader (moved) the cache lacks
                    self._cluster.refresh_if_stale(unknown, min_age=0.1)
                except errors.SluiceError as exc:
                    last = exc
                    if not exc.retriable and not isinstance(exc, errors.UnknownTopicOrPartitionError):
                        raise
            for addr, group in by_leader.items():
                topics: dict[str, list[broker_pb2.ListOffsetsPartition]] = {}
                for tp in group:
                    topics.setdefault(tp.topic, []).append(
                        broker_pb2.ListOffsetsPartition(partition=tp.partition, timestamp=remaining[tp])
                    )
                request = broker_pb2.ListOffsetsRequest(
                    isolation_level=self._isolation,
                    topics=[broker_pb2.ListOffsetsTopic(name=t, partitions=ps) for t, ps in topics.items()],
                )
                try:
                    response: broker_pb2.ListOffsetsResponse = self._cluster.call(
                        addr, rpcs.LIST_OFFSETS, request, deadline.timeout(self._request_timeout)
                    )
                except errors.SluiceError as exc:
                    if not exc.retriable:
                        raise
                    last = exc
                    for tp in group:
                        self._cluster.forget_leader(tp.topic, tp.partition)
                    continue
                for t in response.topics:
                    for p in t.partitions:
                        tp = TopicPartition(t.name, p.partition)
                        if tp not in remaining:
                            continue
                        if p.error_code == records_pb2.NONE:
                            out[tp] = (p.offset if p.offset >= 0 else None, p.timestamp)
                            del remaining[tp]
                            continue
                        err = errors.error_for(p.error_code, p.error_message)
                        if not err.retriable:
                            raise err
                        last = err
                        if p.error_code in METADATA_REFRESH_CODES:
                            self._cluster.forget_leader(tp.topic, tp.partition)
            if remaining:
                if deadline.expired():
                    if last is not None:
                        raise last
                    raise errors.KafkaTimeoutError(
                        f"offsets of {', '.join(map(str, sorted(remaining)))} not available in time"
                    )
                backoff.sleep(deadline)
        return out

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
        found = self._list_offsets(partitions, timestamp, deadline)
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
        found = self._list_offsets_at(dict(timestamps), deadline)
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
        if self.enable_auto_commit:
            self._commit_quietly(None, timeout)
        with self._lock:
            self._closed = True
            member, self._member = self._member, None
            fetches = list(self._fetches.values())
            self._fetches.clear()
        if member is not None:
            member.leave(5.0 if timeout is None else timeout)
        for f in fetches:
            f.future.cancel()
        self._cluster.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Consumer(group_id={self.group_id!r}, isolation_level={self.isolation_level!r})"


__all__ = ["Consumer"]
