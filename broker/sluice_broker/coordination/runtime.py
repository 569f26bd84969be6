"""One runtime for the partitions of a coordinator's internal topic.

Both coordinators keep their state in an internal, compacted topic:
the transaction coordinator in ``__transaction_state``, the group coordinator
in ``__consumer_offsets``. The coordinator of a key (a transactional id, a
group id) is the leader of partition ``crc32(key) % n``, and it serves that
key from memory, rebuilt by replaying the partition. What happens around that
replay is the same for both, so it lives here once (the split follows Kafka's
CoordinatorRuntime and CoordinatorShard):

* the **runtime** (:class:`CoordinatorRuntime`) follows leadership of the
  topic's partitions (a ``ReplicaManager`` leadership listener). Becoming
  leader at leader epoch E creates a :class:`CoordinatorPartition` with
  coordinator epoch E and starts loading it; requests for its keys answer
  COORDINATOR_LOAD_IN_PROGRESS (retriable) until the replay reached the log
  end. Losing leadership (or a new epoch) unloads it: its tasks are cancelled
  and requests answer NOT_COORDINATOR. A load that fails (a storage read error,
  a bug in a shard's replay) is retried with a bounded exponential back-off
  for as long as this broker leads the partition, so one failure never leaves a
  partition unavailable until a restart. The replay yields to the event loop
  every :data:`LOAD_YIELD_EVERY` batches, so a long load never stalls requests
  for other partitions. The runtime measures each load once:
  :attr:`CoordinatorPartition.load_ms`, and :attr:`CoordinatorRuntime.last_load_ms`
  per partition, for metrics.
* a **shard** (:class:`CoordinatorShard`) knows its topic's records: it makes
  an empty state, replays batches into it, and is told when a partition became
  active (``on_loaded``, called in the same synchronous step as the end of the
  replay, so nothing appended meanwhile can fall between the two) and when an
  active partition is unloaded.

Writes go through the runtime too (:meth:`CoordinatorRuntime.append`,
:meth:`CoordinatorRuntime.wait_committed`, :meth:`CoordinatorRuntime.write`):
a shard's records are appended to its partition only while this broker leads
it at the coordinator epoch the state was loaded at (a deposed coordinator
writes nothing), its answer waits until the high watermark passes them (acks=all
for our own log), and a failure is answered through one table,
:func:`coordinator_error` (Kafka's mapping in its coordinators): the leader
moved or its disk failed -> NOT_COORDINATOR, too few replicas or a timeout ->
COORDINATOR_NOT_AVAILABLE. Both coordinators and group administration answer
the same errors for the same failures.

Partition states: LOADING -> ACTIVE, LOADING -> FAILED -> LOADING (the retry),
and any of them -> UNLOADED, which is final: regaining leadership makes a new
:class:`CoordinatorPartition`, so work started under an old epoch can tell it
is stale (:meth:`CoordinatorRuntime.is_current`).

Test-only hooks (broker config ``sluice.test.hooks``, never set in production,
inert unless named there), so that fault tests can make a real broker's load
fail or be slow: :data:`HOOK_LOAD_FAIL` fails every load attempt made in the
first :data:`HOOK_LOAD_WINDOW_S` seconds after this broker became leader of a
partition (the retry then succeeds), :data:`HOOK_LOAD_SLOW` makes the first
attempt of every load wait that long before it replays, inside the measured
load time. Both apply to both coordinators' topics.

Concurrency: one asyncio loop. Leadership is told synchronously; a load is a
task. When leadership is told outside a running loop (a synchronous metadata
refresh), the partition waits in LOADING without a task and the runtime's
supervisor task starts its load.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from sluice import errors
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.cluster import ClusterView, coordinator_partition
from sluice.broker.config import BrokerConfig
from sluice.broker.replica_manager import ReplicaManager
from sluice.errors import SluiceError
from sluice.records import RecordBatch

log = logging.getLogger(__name__)

StateT = TypeVar("StateT")

LOAD_YIELD_EVERY = 64  # batches replayed between yields to the event loop
LOAD_RETRY_INITIAL_S = 0.2  # the first retry of a failed load; doubled per failure ...
LOAD_RETRY_MAX_S = 10.0  # ... up to this
SUPERVISE_INTERVAL_S = 0.5  # how often loads told outside the loop are picked up

WRITE_TIMEOUT_S = 30.0  # a coordinator write not replicated by then answers COORDINATOR_NOT_AVAILABLE

# A failed write of a coordinator's own partition, as the coordinator answers it. The partition's
# leader moved or its log directory failed: NOT_COORDINATOR, the client looks the coordinator up
# again. Too few in-sync replicas, a replication timeout, the partition missing: COORDINATOR_NOT_
# AVAILABLE, retried as it is. A batch the log refuses as too large: a bug, UNKNOWN_SERVER_ERROR.
# Anything else is answered as it is.
WRITE_ERRORS: dict[int, int] = {
    pb.NOT_LEADER_OR_FOLLOWER: pb.NOT_COORDINATOR,
    pb.KAFKA_STORAGE_ERROR: pb.NOT_COORDINATOR,
    pb.NOT_ENOUGH_REPLICAS: pb.COORDINATOR_NOT_AVAILABLE,
    pb.NOT_ENOUGH_REPLICAS_AFTER_APPEND: pb.COORDINATOR_NOT_AVAILABLE,
    pb.REQUEST_TIMED_OUT: pb.COORDINATOR_NOT_AVAILABLE,
    pb.UNKNOWN_TOPIC_OR_PARTITION: pb.COORDINATOR_NOT_AVAILABLE,
    pb.MESSAGE_TOO_LARGE: pb.UNKNOWN_SERVER_ERROR,
    pb.RECORD_LIST_TOO_LARGE: pb.UNKNOWN_SERVER_ERROR,
    pb.INVALID_FETCH_SIZE: pb.UNKNOWN_SERVER_ERROR,
}


def coordinator_error(exc: SluiceError, what: str) -> SluiceError:
    """``exc``, raised by a write of ``what`` to a coordinator's partition, as the coordinator answers it."""
    code = WRITE_ERRORS.get(exc.code)
    if code is None:
        return exc
    return errors.error_for(code, f"cannot write {what}: {exc.message}")


HOOK_LOAD_FAIL = "coordinator.load.fail_first_3s"
HOOK_LOAD_SLOW = "coordinator.load.slow_3s"
HOOK_LOAD_WINDOW_S = 3.0


class LoadStatus(enum.Enum):
    LOADING = "loading"  # the replay is running (or about to)
    ACTIVE = "active"  # loaded: requests are served from the shard's state
    FAILED = "failed"  # the last attempt failed; the next one is scheduled
    UNLOADED = "unloaded"  # leadership lost, or the runtime stopped (final)


@dataclass(eq=False)
class CoordinatorPartition(Generic[StateT]):
    """One partition of the internal topic that this broker leads (or is loading)."""

    partition: int
    coordinator_epoch: int  # the leader epoch of the internal partition; markers carry it
    status: LoadStatus = LoadStatus.LOADING
    attempts: int = 0  # load attempts so far (1 after a load that succeeded at once)
    last_error: str = ""  # why the last failed attempt failed
    load_ms: float | None = None  # how long the successful load took
    tasks: set[asyncio.Task[None]] = field(default_factory=set)  # cancelled on unload
    load_task: asyncio.Task[None] | None = None
    led_since: float = field(default_factory=time.monotonic)  # when this broker became its leader
    _state: StateT | None = None

    @property
    def active(self) -> bool:
        return self.status is LoadStatus.ACTIVE

    @property
    def state(self) -> StateT:
        """The shard's state; only once the partition has been ACTIVE."""
        if self._state is None:
            raise RuntimeError(f"partition {self.partition} is not loaded ({self.status.value})")
        return self._state


class CoordinatorShard(Protocol[StateT]):
    """What a coordinator tells the runtime about its internal topic's records."""

    def new_state(self, partition: int, coordinator_epoch: int) -> StateT:
        """An empty state for one load attempt."""
        ...

    def replay(self, state: StateT, partition: int, batch: RecordBatch) -> None:
        """Apply one stored batch (control batches included) in log order.

        Raising fails the attempt (it is retried); a shard that can skip a
        batch it cannot decode should log and skip it instead.
        """
        ...

    def on_loaded(self, loaded: CoordinatorPartition[StateT]) -> None:
        """The replay reached the log end and the partition is ACTIVE (same synchronous step)."""
        ...

    def on_unloaded(self, unloaded: CoordinatorPartition[StateT]) -> None:
        """An ACTIVE partition is being unloaded (its tasks are cancelled right after)."""
        ...

    def summary(self, state: StateT) -> str:
        """What a load found, for the log line (e.g. "12 transactional id(s)")."""
        ...


class CoordinatorRuntime(Generic[StateT]):
    """Loads, serves and unloads the partitions of ``topic`` that this broker leads, for ``shard``."""

    def __init__(
        self,
        topic: str,
        shard: CoordinatorShard[StateT],
        replicas: ReplicaManager,
        cluster: ClusterView,
        config: BrokerConfig,
        *,
        retry_initial_s: float = LOAD_RETRY_INITIAL_S,
        retry_max_s: float = LOAD_RETRY_MAX_S,
    ) -> None:
        self.topic = topic
        self.shard = shard
        self.replicas = replicas
        self.cluster = cluster
        self.config = config
        self.retry_initial_s = retry_initial_s
        self.retry_max_s = max(retry_max_s, retry_initial_s)
        self.last_load_ms: dict[int, float] = {}  # partition -> duration of its last successful load
        self._partitions: dict[int, CoordinatorPartition[StateT]] = {}
        self._running = False
        self._supervisor: asyncio.Task[None] | None = None

    # -- writes -----------------------------------------------------------------------------------

    def append(self, partition: int, coordinator_epoch: int, batch: RecordBatch, what: str) -> int:
        """Append a shard's ``batch`` to ``partition`` as its leader at ``coordinator_epoch``; the base offset.

        Synchronous, so a caller can change its state in the same step, once
        the log has the records. Raises the coordinator error (:func:`coordinator_error`).
        """
        try:
            return self.replicas.append_internal(self.topic, partition, batch, leader_epoch=coordinator_epoch)
        except SluiceError as exc:
            raise coordinator_error(exc, what) from exc
        except Exception as exc:  # not a SluiceError: the storage failed in a way nobody classified
            log.exception("writing %s to %s-%d failed", what, self.topic, partition)
            raise coordinator_error(errors.KafkaStorageError(str(exc)), what) from exc

    async def wait_committed(self, partition: int, what: str, end_offset: int | None = None) -> None:
        """Wait until the HW of ``partition`` reaches ``end_offset`` (None: the log end); raises as :meth:`append`."""
        part = self.replicas.partitions.get((self.topic, partition))
        if part is None:
            raise coordinator_error(
                errors.NotLeaderOrFollowerError(f"{self.topic}-{partition} is not on this broker"), what
            )
        end = part.log_end_offset if end_offset is None else end_offset
        if part.high_watermark >= end:
            return
        try:
            await self.replicas.wait_replicated(self.topic, partition, end, WRITE_TIMEOUT_S)
        except SluiceError as exc:
            raise coordinator_error(exc, what) from exc

    async def write(self, partition: int, coordinator_epoch: int, batch: RecordBatch, what: str) -> int:
        """:meth:`append`, then :meth:`wait_committed` for it: the base offset, once the ISR has the records."""
        base = self.append(partition, coordinator_epoch, batch, what)
        await self.wait_committed(partition, what, base + batch.record_count)
        return base

    # -- life cycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        self._running = True
        self.replicas.leadership_listeners.append(self.on_leadership)
        # Partitions led before we listened (a caller that refreshed metadata first).
        for topic, partition in sorted(self.replicas.leader_of):
            if topic == self.topic:
                self.on_leadership(topic, partition, True, self.replicas.partitions[(topic, partition)].leader_epoch)
        self._supervisor = asyncio.create_task(self._supervise(), name=f"coordinator-runtime-{self.topic}")

    async def stop(self) -> None:
        self._running = False
        with contextlib.suppress(ValueError):
            self.replicas.leadership_listeners.remove(self.on_leadership)
        tasks: list[asyncio.Task[None]] = []
        if self._supervisor is not None:
            self._supervisor.cancel()
            tasks.append(self._supervisor)
        for cpart in list(self._partitions.values()):
            tasks.extend(self._unload(cpart))
        await asyncio.gather(*tasks, return_exceptions=True)
        self._supervisor = None

    def is_ready(self) -> bool:
        """Every partition of the topic this broker leads is loaded."""
        for topic, partition in self.replicas.leader_of:
            if topic == self.topic:
                cpart = self._partitions.get(partition)
                if cpart is None or not cpart.active:
                    return False
        return True

    # -- lookups ----------------------------------------------------------------------------------

    def partition_for(self, key: str) -> int | None:
        """The partition that coordinates ``key`` (None while the topic does not exist)."""
        info = self.cluster.topics.get(self.topic)
        if info is None or not info.partitions:
            return None
        return coordinator_partition(key, len(info.partitions))

    def get(self, partition: int) -> CoordinatorPartition[StateT] | None:
        """This broker's current entry for ``partition`` (loading, active or failed), if it leads it."""
        return self._partitions.get(partition)

    def active(self, partition: int, what: str) -> CoordinatorPartition[StateT]:
        """The loaded partition, or the error a client should see for ``what`` (e.g. "group 'g'")."""
        if (self.topic, partition) not in self.replicas.leader_of:
            raise errors.NotCoordinatorError(
                f"broker {self.config.broker_id} is not the coordinator of {what} ({self.topic}-{partition})"
            )
        cpart = self._partitions.get(partition)
        if cpart is None or not cpart.active:
            raise errors.CoordinatorLoadInProgressError(self.loading_message(partition))
        return cpart

    def loading_message(self, partition: int) -> str:
        message = f"broker {self.config.broker_id} is loading {self.topic}-{partition}"
        cpart = self._partitions.get(partition)
        if cpart is not None and cpart.last_error:
            message += f" (attempt {cpart.attempts} failed: {cpart.last_error}; retrying)"
        return message

    def is_current(self, cpart: CoordinatorPartition[StateT]) -> bool:
        """Whether ``cpart`` is still active and still this broker's entry for its partition."""
        return cpart.active and self._partitions.get(cpart.partition) is cpart

    def active_partitions(self) -> list[CoordinatorPartition[StateT]]:
        return [c for _, c in sorted(self._partitions.items()) if c.active]

    def all_partitions(self) -> list[CoordinatorPartition[StateT]]:
        """Every partition this broker leads, loaded or not, by partition number."""
        return [c for _, c in sorted(self._partitions.items())]

    def spawn(self, cpart: CoordinatorPartition[StateT], coro: Awaitable[None], what: str) -> None:
        """Run ``coro`` as a task of ``cpart``: cancelled when the partition is unloaded."""

        async def run() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s failed (%s-%d)", what, self.topic, cpart.partition)

        task = asyncio.get_running_loop().create_task(run())
        cpart.tasks.add(task)
        task.add_done_callback(cpart.tasks.discard)

    # -- leadership -------------------------------------------------------------------------------

    def on_leadership(self, topic: str, partition: int, is_leader: bool, leader_epoch: int) -> None:
        """The ReplicaManager's leadership listener (called synchronously)."""
        if topic != self.topic:
            return
        old = self._partitions.get(partition)
        if old is not None:
            if is_leader and old.coordinator_epoch == leader_epoch:
                return  # told again: the load (or the loaded state) stands
            self._unload(old)
            log.info("no longer coordinator of %s-%d at epoch %d: unloaded", topic, partition, old.coordinator_epoch)
        if not is_leader or not self._running:
            return
        cpart: CoordinatorPartition[StateT] = CoordinatorPartition(partition, leader_epoch)
        self._partitions[partition] = cpart
        self._start_load(cpart)

    def _start_load(self, cpart: CoordinatorPartition[StateT]) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # told outside the loop: the supervisor starts it
        cpart.load_task = loop.create_task(self._load(cpart), name=f"load-{self.topic}-{cpart.partition}")

    def _unload(self, cpart: CoordinatorPartition[StateT]) -> list[asyncio.Task[None]]:
        """Unload ``cpart``; returns the tasks it cancelled (for a caller that awaits them)."""
        was_active = cpart.active
        cpart.status = LoadStatus.UNLOADED
        if self._partitions.get(cpart.partition) is cpart:
            del self._partitions[cpart.partition]
        if was_active:
            try:
                self.shard.on_unloaded(cpart)
            except Exception:
                log.exception("unloading %s-%d failed", self.topic, cpart.partition)
        tasks = list(cpart.tasks)
        if cpart.load_task is not None:
            tasks.append(cpart.load_task)
        for task in tasks:
            task.cancel()
        return tasks

    async def _supervise(self) -> None:
        while True:
            await asyncio.sleep(SUPERVISE_INTERVAL_S)
            for cpart in list(self._partitions.values()):
                if cpart.load_task is None:
                    self._start_load(cpart)

    # -- loading ----------------------------------------------------------------------------------

    def _current(self, cpart: CoordinatorPartition[StateT]) -> bool:
        return cpart.status is not LoadStatus.UNLOADED and self._partitions.get(cpart.partition) is cpart

    async def _test_faults(self, cpart: CoordinatorPartition[StateT]) -> None:
        """The test-only load faults (see the module docstring); nothing unless a hook is named."""
        hook = getattr(self.config, "hook", None)
        if hook is None:
            return
        if hook(HOOK_LOAD_SLOW) and cpart.attempts == 1:
            log.warning(
                "test hook %s: the load of %s-%d waits %.0f s",
                HOOK_LOAD_SLOW,
                self.topic,
                cpart.partition,
                HOOK_LOAD_WINDOW_S,
            )
            await asyncio.sleep(HOOK_LOAD_WINDOW_S)
        if hook(HOOK_LOAD_FAIL) and time.monotonic() - cpart.led_since < HOOK_LOAD_WINDOW_S:
            raise OSError(f"test hook {HOOK_LOAD_FAIL}: injected failure reading {self.topic}-{cpart.partition}")

    async def _load(self, cpart: CoordinatorPartition[StateT]) -> None:
        """Replay the partition until it loads, retrying failed attempts while it is still ours."""
        backoff = self.retry_initial_s
        while self._current(cpart):
            cpart.attempts += 1
            cpart.status = LoadStatus.LOADING
            started = time.monotonic()
            try:
                await self._test_faults(cpart)
                if not self._current(cpart):
                    return
                state = self.shard.new_state(cpart.partition, cpart.coordinator_epoch)
                count = 0
                for batch in self.replicas.iter_batches(self.topic, cpart.partition):
                    self.shard.replay(state, cpart.partition, batch)
                    count += 1
                    if count % LOAD_YIELD_EVERY == 0:
                        await asyncio.sleep(0)
                        if not self._current(cpart):
                            return
                # No await from the end of the replay to here: nothing appended can fall in between.
                cpart._state = state
                cpart.status = LoadStatus.ACTIVE
                try:
                    self.shard.on_loaded(cpart)
                except BaseException:
                    cpart.status = LoadStatus.LOADING
                    with contextlib.suppress(Exception):
                        self.shard.on_unloaded(cpart)
                    raise
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not self._current(cpart):
                    return
                cpart.status = LoadStatus.FAILED
                cpart.last_error = f"{type(exc).__name__}: {exc}"
                log.exception(
                    "loading %s-%d (coordinator epoch %d, attempt %d) failed; retrying in %.1f s",
                    self.topic,
                    cpart.partition,
                    cpart.coordinator_epoch,
                    cpart.attempts,
                    backoff,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.retry_max_s)
                continue
            cpart.load_ms = (time.monotonic() - started) * 1000
            cpart.last_error = ""
            self.last_load_ms[cpart.partition] = cpart.load_ms
            log.info(
                "loaded %s-%d (coordinator epoch %d): %d batches, %s, in %.0f ms (attempt %d)",
                self.topic,
                cpart.partition,
                cpart.coordinator_epoch,
                count,
                self.shard.summary(state),
                cpart.load_ms,
                cpart.attempts,
            )
            return
