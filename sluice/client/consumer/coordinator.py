"""The consumer's side of its group coordinator: membership, and committed offsets.

Committed offsets: :func:`fetch_committed` (OffsetFetch) and
:func:`commit_offsets` (OffsetCommit), through
:meth:`~sluice.client._network.cluster.Cluster.coordinator_call`, which
finds the group's coordinator and retries while it moves or loads.

Membership, one heartbeat RPC and server-side assignment (the shape of
KIP-848): a :class:`GroupMember` is a background thread that keeps a
consumer in its group:

* It joins with ``member_epoch`` 0 and a member id of its own (a fresh
  uuid4 per join, as KIP-1082 has clients choose it), so a join retried after
  a lost or late answer (the coordinator answers only once the group state is
  replicated) replaces its first attempt instead of adding a second member
  that would hold partitions until its session expired. The coordinator
  answers with the member id, an epoch, the heartbeat interval and the
  member's complete *target* assignment.
* Every ``heartbeat_interval_ms`` it heartbeats with its epoch, its
  subscription and the partitions it *owns*, i.e. the ones the consumer has
  actually taken on (or still holds). The coordinator hands a partition to
  a new owner only once the previous owner stopped reporting it, so two
  members never consume one partition at once.
* When the target differs from what is owned, the member tells the consumer
  (``on_assignment``): the consumer drops revoked partitions (committing
  their positions first when auto-commit is on) and takes on new ones. The
  member heartbeats again right away, so revoked partitions are released
  without waiting a whole interval.
* UNKNOWN_MEMBER_ID / FENCED_MEMBER_EPOCH: the coordinator no longer counts
  this member (its session expired, or it fell behind). Its partitions are
  *lost*: dropped without committing, since another member may own them
  already. It rejoins with epoch 0. The same happens when no heartbeat
  succeeded for a whole session timeout.
* The coordinator moved or is loading (NOT_COORDINATOR,
  COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS, or it does not
  answer): the member keeps its id, epoch and partitions and retries. The
  coordinator persists membership, so after a failover the new one knows the
  member as it was and nothing is revoked.
* Leaving (close or unsubscribe) is a heartbeat with epoch -1.

Reconciliation runs on this thread rather than in ``poll()``: a consumer
that is busy between polls still releases partitions promptly, and
rebalances do not wait for the application.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping

from sluice import errors
from sluice.api.v1 import broker_pb2, records_pb2
from sluice.client._network import (
    COORDINATOR_MOVED_CODES,
    GROUP,
    Backoff,
    Cluster,
    Deadline,
    first_error,
    response_error,
)
from sluice.client._network import rpc as rpcs
from sluice.client.types import GroupMetadata, TopicPartition

log = logging.getLogger("sluice.client.consumer")

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
_REJOIN_CODES = frozenset({records_pb2.UNKNOWN_MEMBER_ID, records_pb2.FENCED_MEMBER_EPOCH})

#: on_assignment(target, lost): ``lost`` is True when partitions are taken away without a
#: chance to commit (the member was fenced or its session expired).
AssignmentCallback = Callable[[frozenset[TopicPartition], bool], None]


class GroupMember(threading.Thread):
    """Heartbeats a consumer's membership in a group. Thread-safe accessors."""

    def __init__(
        self,
        cluster: Cluster,
        group_id: str,
        topics: list[str],
        *,
        owned: Callable[[], list[TopicPartition]],
        on_assignment: AssignmentCallback,
        session_timeout_ms: int = 45_000,
        rebalance_timeout_ms: int = 300_000,
        heartbeat_interval_ms: int | None = None,
        name: str = "sluice-consumer-heartbeat",
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.cluster = cluster
        self.group_id = group_id
        self._topics = sorted(set(topics))
        self._owned = owned
        self._on_assignment = on_assignment
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        # The coordinator says how often to heartbeat (KIP-848); a client setting only shortens it.
        self._max_interval = heartbeat_interval_ms / 1000.0 if heartbeat_interval_ms else None
        self._interval = self._max_interval or 3.0
        self._lock = threading.Lock()
        self._member_id = ""
        self._join_id = str(uuid.uuid4())  # the id the next join asks for (until it is answered)
        self._member_epoch = JOIN_EPOCH
        self._target: frozenset[TopicPartition] | None = None
        self._fatal: errors.SluiceError | None = None
        self._wake_event = threading.Event()
        self._stop_event = threading.Event()
        self._joined = threading.Event()
        self._last_success = time.monotonic()
        self._backoff = Backoff(0.05, 1.0)
        self.assignment_changed = threading.Condition()

    # ------------------------------------------------------------------ accessors

    @property
    def member_id(self) -> str:
        with self._lock:
            return self._member_id

    @property
    def member_epoch(self) -> int:
        with self._lock:
            return self._member_epoch

    def metadata(self) -> GroupMetadata:
        with self._lock:
            return GroupMetadata(self.group_id, self._member_id, self._member_epoch)

    @property
    def fatal_error(self) -> errors.SluiceError | None:
        with self._lock:
            return self._fatal

    def wait_joined(self, timeout: float) -> bool:
        """Wait until the first heartbeat gave this member an assignment."""
        return self._joined.wait(timeout)

    def set_subscription(self, topics: list[str]) -> None:
        with self._lock:
            self._topics = sorted(set(topics))
        self.heartbeat_now()

    def heartbeat_now(self) -> None:
        self._wake_event.set()

    def fenced(self) -> None:
        """A commit was refused (UNKNOWN_MEMBER_ID / FENCED_MEMBER_EPOCH): rejoin."""
        self._lose_partitions("a commit was refused as coming from a stale member")
        self.heartbeat_now()

    # ------------------------------------------------------------------ loop

    def run(self) -> None:
        while not self._stop_event.is_set():
            try:
                again = self._heartbeat()
            except Exception:  # keep heartbeating whatever happens; the error is logged
                log.exception("consumer group heartbeat failed unexpectedly")
                again = False
            if self.fatal_error is not None:
                return
            if again:
                continue
            self._wake_event.wait(self._delay())
            self._wake_event.clear()

    def _delay(self) -> float:
        with self._lock:
            joined = self._member_epoch > 0
        return self._interval if joined else 0.1

    def _heartbeat(self) -> bool:
        """One heartbeat; True when another should follow immediately."""
        now = time.monotonic()
        if now - self._last_success > self.session_timeout_ms / 1000.0:
            self._lose_partitions("no successful heartbeat within the session timeout")
            self._last_success = now
        owned = self._owned()
        with self._lock:
            member_id, epoch, topics = self._member_id, self._member_epoch, list(self._topics)
            if epoch == JOIN_EPOCH:
                member_id = self._join_id
        request = broker_pb2.ConsumerGroupHeartbeatRequest(
            group_id=self.group_id,
            member_id=member_id,
            member_epoch=epoch,
            rebalance_timeout_ms=self.rebalance_timeout_ms,
            subscribed_topic_names=topics,
            subscription_unchanged=False,
            owned_partitions=[records_pb2.TopicPartition(topic=tp.topic, partition=tp.partition) for tp in owned],
            session_timeout_ms=self.session_timeout_ms,
        )
        deadline = Deadline(min(self.cluster.request_timeout, max(1.0, self._interval)))
        try:
            _node, addr = self.cluster.find_coordinator(self.group_id, GROUP, deadline)
            response: broker_pb2.ConsumerGroupHeartbeatResponse = self.cluster.call(
                addr, rpcs.CONSUMER_GROUP_HEARTBEAT, request, deadline.timeout(self.cluster.request_timeout)
            )
        except errors.SluiceError as exc:
            if not exc.retriable:
                self._set_fatal(exc)
                return False
            self.cluster.forget_coordinator(self.group_id, GROUP)
            log.debug("heartbeat of group %r failed: %s", self.group_id, exc)
            self._sleep(self._backoff.next())
            return True
        code = response.error_code
        if code == records_pb2.NONE:
            self._backoff.reset()
            self._last_success = time.monotonic()
            return self._apply(response, owned)
        err = errors.error_for(code, response.error_message)
        if code in _REJOIN_CODES:
            log.info("group %r: %s; rejoining", self.group_id, err.code_name)
            self._lose_partitions(err.message)
            return True
        if code in COORDINATOR_MOVED_CODES:
            self.cluster.forget_coordinator(self.group_id, GROUP)
        if err.retriable:
            self._sleep(self._backoff.next())
            return True
        self._set_fatal(err)
        return False

    def _sleep(self, seconds: float) -> None:
        self._stop_event.wait(seconds)

    def _apply(self, response: broker_pb2.ConsumerGroupHeartbeatResponse, owned: list[TopicPartition]) -> bool:
        # response.assignment holds wire (records_pb2) TopicPartitions: made client TopicPartitions here
        target = frozenset(TopicPartition(assigned.topic, assigned.partition) for assigned in response.assignment)
        with self._lock:
            self._member_id = response.member_id or self._member_id
            self._member_epoch = response.member_epoch
            if response.heartbeat_interval_ms > 0:
                self._interval = response.heartbeat_interval_ms / 1000.0
                if self._max_interval is not None:
                    self._interval = min(self._interval, self._max_interval)
            self._target = target
        changed = target != frozenset(owned)
        if changed:
            self._on_assignment(target, False)
        self._joined.set()
        with self.assignment_changed:
            self.assignment_changed.notify_all()
        return changed

    def _lose_partitions(self, why: str) -> None:
        with self._lock:
            self._member_epoch = JOIN_EPOCH
            self._member_id = ""
            self._join_id = str(uuid.uuid4())  # a new member: the old id may still be in the group
            self._target = None
        log.info("group %r: partitions lost (%s)", self.group_id, why)
        self._on_assignment(frozenset(), True)

    def _set_fatal(self, exc: errors.SluiceError) -> None:
        log.error("group %r: fatal heartbeat error: %s", self.group_id, exc)
        with self._lock:
            self._fatal = exc
        self._joined.set()
        with self.assignment_changed:
            self.assignment_changed.notify_all()

    # ------------------------------------------------------------------ leave

    def leave(self, timeout: float = 5.0) -> None:
        """Stop heartbeating and leave the group (epoch -1) so partitions move at once."""
        self._stop_event.set()
        self._wake_event.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout)
        with self._lock:
            member_id, epoch = self._member_id, self._member_epoch
            self._member_epoch = LEAVE_EPOCH
        if not member_id or epoch <= 0:
            return
        request = broker_pb2.ConsumerGroupHeartbeatRequest(
            group_id=self.group_id, member_id=member_id, member_epoch=LEAVE_EPOCH
        )
        try:
            self.cluster.coordinator_call(
                self.group_id,
                GROUP,
                rpcs.CONSUMER_GROUP_HEARTBEAT,
                request,
                response_error,
                Deadline(timeout),
            )
        except errors.SluiceError as exc:
            log.debug("leaving group %r: %s", self.group_id, exc)


# ---------------------------------------------------------------------- committed offsets


def fetch_committed(
    cluster: Cluster, group_id: str, tps: list[TopicPartition], deadline: Deadline, require_stable: bool
) -> dict[TopicPartition, int | None]:
    """The group's committed offsets for ``tps``; None where there is none.

    With ``require_stable``, UNSTABLE_OFFSET_COMMIT (an open transaction is
    committing offsets of the partition) is retried until ``deadline``.
    """
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

    response = cluster.coordinator_call(group_id, GROUP, rpcs.OFFSET_FETCH, request, error_of, deadline)
    out: dict[TopicPartition, int | None] = dict.fromkeys(tps)
    for x in response.partitions:
        tp = TopicPartition(x.topic, x.partition)
        if tp in out and x.error_code == records_pb2.NONE:
            out[tp] = x.committed_offset if x.committed_offset >= 0 else None
    return out


def commit_offsets(
    cluster: Cluster,
    group_id: str,
    metadata: GroupMetadata,
    offsets: Mapping[TopicPartition, int],
    deadline: Deadline,
) -> None:
    """Commit ``offsets`` (next offset to read per partition) as the member ``metadata`` describes.

    A member without a member id commits as a non-member (epoch -1).
    """
    by_topic: dict[str, list[broker_pb2.OffsetCommitPartition]] = {}
    for tp, offset in offsets.items():
        if offset < 0:
            raise ValueError(f"cannot commit a negative offset for {tp}")
        by_topic.setdefault(tp.topic, []).append(
            broker_pb2.OffsetCommitPartition(
                partition=tp.partition, committed_offset=int(offset), committed_leader_epoch=-1
            )
        )
    request = broker_pb2.OffsetCommitRequest(
        group_id=group_id,
        member_id=metadata.member_id,
        member_epoch=metadata.member_epoch if metadata.member_id else -1,
        topics=[broker_pb2.OffsetCommitTopic(name=t, partitions=ps) for t, ps in by_topic.items()],
    )
    cluster.coordinator_call(
        group_id,
        GROUP,
        rpcs.OFFSET_COMMIT,
        request,
        lambda r: first_error((x.error_code, x.error_message) for x in r.results),
        deadline,
    )
