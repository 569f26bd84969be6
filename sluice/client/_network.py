"""Connections, cluster metadata, coordinators and retries: what every client shares.

Design:

* One gRPC channel per broker address, created lazily and kept for the life
  of the client (:class:`Cluster`). gRPC channels are thread-safe and multiplex
  calls, so the producer's sender thread, the consumer's heartbeat thread and
  the application's threads all share them. Channels allow large messages
  (:data:`MAX_MESSAGE_BYTES`) and reconnect quickly after a broker restart
  (gRPC's default reconnect backoff grows to two minutes, far too long for a
  failover).
* gRPC status codes become :mod:`sluice.errors` exceptions in one place
  (:func:`map_rpc_error`): UNAVAILABLE is :class:`~sluice.errors.BrokerNotAvailableError`
  (retriable: try another broker), DEADLINE_EXCEEDED is a retriable
  :class:`~sluice.errors.RequestTimedOutError`, INVALID_ARGUMENT is
  :class:`~sluice.errors.InvalidArgumentError`. Error *codes* inside responses
  are turned into exceptions by the callers, with :func:`sluice.errors.error_for`.
* The metadata cache (brokers, topics, partition leaders and epochs) is
  refreshed on demand: when a topic is unknown, after NOT_LEADER_OR_FOLLOWER,
  UNKNOWN_TOPIC_OR_PARTITION or FENCED_LEADER_EPOCH, and when a leader does
  not answer. Refreshes are rate limited so a storm of errors costs one RPC.
* Coordinators (transaction and group) are found with FindCoordinator, cached
  per key, and forgotten on NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE or when
  the broker does not answer. :meth:`Cluster.coordinator_call` wraps that
  loop so producer, consumer and admin code only state the request and how to
  read the error out of its response.
* Retries wait with :class:`Backoff` (50 ms growing by 1.6x to 1 s, with
  jitter) until a :class:`Deadline`; when it passes, the last retriable error
  is raised as it is, as :mod:`sluice.errors` documents.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc

from sluice import errors
from sluice.api.v1 import broker_pb2, broker_pb2_grpc, records_pb2

log = logging.getLogger("sluice.client")

T = TypeVar("T")

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
]

# Methods Cluster.call_future also accepts as serialized bytes, with their response type.
RAW_REQUEST_METHODS: dict[str, Any] = {"Produce": broker_pb2.ProduceResponse}

GROUP = broker_pb2.GROUP
TRANSACTION = broker_pb2.TRANSACTION

# Codes after which the partition's leader must be looked up again.
METADATA_REFRESH_CODES = frozenset(
    {
        records_pb2.NOT_LEADER_OR_FOLLOWER,
        records_pb2.UNKNOWN_TOPIC_OR_PARTITION,
        records_pb2.LEADER_NOT_AVAILABLE,
        records_pb2.FENCED_LEADER_EPOCH,
        records_pb2.UNKNOWN_LEADER_EPOCH,
        records_pb2.KAFKA_STORAGE_ERROR,
    }
)
# Codes after which the coordinator must be found again.
COORDINATOR_MOVED_CODES = frozenset({records_pb2.NOT_COORDINATOR, records_pb2.COORDINATOR_NOT_AVAILABLE})


def parse_bootstrap(servers: str | Sequence[str]) -> list[str]:
    """``"h1:9092,h2:9092"`` or a list of ``host:port`` strings -> list of addresses."""
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    out = [s.strip() for s in items if s and s.strip()]
    if not out:
        raise ValueError("bootstrap_servers must name at least one host:port")
    for addr in out:
        if ":" not in addr:
            raise ValueError(f"bootstrap server {addr!r} is not host:port")
    return out


def broker_address(host: str, port: int) -> str:
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def map_rpc_error(exc: grpc.RpcError, addr: str, method: str) -> errors.SluiceError:
    """The :mod:`sluice.errors` exception for a failed gRPC call."""
    code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
    details = (exc.details() if isinstance(exc, grpc.Call) else None) or str(exc)
    where = f"{method} to {addr}"
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return errors.InvalidArgumentError(f"{where}: {details}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return errors.RequestTimedOutError(f"{where} timed out: {details}")
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return errors.BrokerNotAvailableError(f"{where}: broker not available: {details}")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return errors.MessageTooLargeError(f"{where}: {details}")
    return errors.UnknownServerError(f"{where} failed with gRPC {code.name}: {details}")


class Deadline:
    """A point in (monotonic) time that operations must finish by."""

    __slots__ = ("at",)

    def __init__(self, seconds: float | None) -> None:
        self.at = float("inf") if seconds is None else time.monotonic() + seconds

    def remaining(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def expired(self) -> bool:
        return time.monotonic() >= self.at

    def timeout(self, cap: float) -> float:
        """A per-call timeout: what remains, at most ``cap``, at least a little."""
        return max(0.05, min(cap, self.remaining()))


class Backoff:
    """Retry delays: ``initial`` growing by ``factor`` to ``maximum``, +-20% jitter."""

    __slots__ = ("_next", "factor", "initial", "maximum")

    def __init__(self, initial: float = 0.05, maximum: float = 1.0, factor: float = 1.6) -> None:
        self.initial = initial
        self.maximum = maximum
        self.factor = factor
        self._next = initial

    def next(self) -> float:
        delay = self._next
        self._next = min(self.maximum, self._next * self.factor)
        return delay * random.uniform(0.8, 1.2)

    def reset(self) -> None:
        self._next = self.initial

    def sleep(self, deadline: Deadline | None = None) -> None:
        delay = self.next()
        if deadline is not None:
            delay = min(delay, deadline.remaining())
        if delay > 0:
            time.sleep(delay)


def retry(fn: Callable[[], T], deadline: Deadline, backoff: Backoff | None = None) -> T:
    """Call ``fn`` until it returns or raises a fatal error; retriable errors wait and retry.

    When the deadline passes, the last retriable error is raised.
    """
    backoff = backoff or Backoff()
    while True:
        try:
            return fn()
        except errors.SluiceError as exc:
            if not exc.retriable or deadline.expired():
                raise
            log.debug("retrying after %s: %s", type(exc).__name__, exc)
            backoff.sleep(deadline)


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    topic: str
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    error_code: int


@dataclass(slots=True)
class TopicInfo:
    name: str
    topic_id: str
    internal: bool
    partitions: dict[int, PartitionInfo] = field(default_factory=dict)
    config: dict[str, str] = field(default_factory=dict)
    replication_factor: int = 0


class Cluster:
    """Channels to brokers, the metadata cache and coordinator lookup. Thread-safe."""

    def __init__(
        self,
        bootstrap_servers: str | Sequence[str],
        *,
        request_timeout_ms: int = 30_000,
        metadata_max_age_ms: int = 300_000,
        retry_backoff_ms: int = 50,
    ) -> None:
        self.bootstrap = parse_bootstrap(bootstrap_servers)
        self.request_timeout = request_timeout_ms / 1000.0
        self.metadata_max_age = metadata_max_age_ms / 1000.0
        self.retry_backoff = retry_backoff_ms / 1000.0
        self._lock = threading.RLock()
        self._refresh_lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, broker_pb2_grpc.BrokerStub] = {}
        self._raw_methods: dict[tuple[str, str], Any] = {}
        self.brokers: dict[int, str] = {}
        self.cluster_id = ""
        self.controller_id = -1
        self._topics: dict[str, TopicInfo] = {}
        self._topic_refreshed: dict[str, float] = {}
        self._coordinators: dict[tuple[int, str], tuple[int, str]] = {}
        self._closed = False
        # Incremented by every change of the metadata cache: the producer rebuilds what it derived from it.
        self.version = 0

    # ------------------------------------------------------------------ channels

    def stub(self, addr: str) -> broker_pb2_grpc.BrokerStub:
        with self._lock:
            if self._closed:
                raise errors.IllegalStateError("the client is closed")
            stub = self._stubs.get(addr)
            if stub is None:
                channel = grpc.insecure_channel(addr, options=CHANNEL_OPTIONS)
                self._channels[addr] = channel
                stub = broker_pb2_grpc.BrokerStub(channel)  # type: ignore[no-untyped-call]
                self._stubs[addr] = stub
            return stub

    def call(self, addr: str, method: str, request: Any, timeout: float | None = None) -> Any:
        """One unary RPC to ``addr``; gRPC failures raise :mod:`sluice.errors` exceptions."""
        fn = getattr(self.stub(addr), method)
        try:
            return fn(request, timeout=self.request_timeout if timeout is None else timeout)
        except grpc.RpcError as exc:
            raise map_rpc_error(exc, addr, method) from None

    def call_future(self, addr: str, method: str, request: Any, timeout: float | None = None) -> grpc.Future[Any]:
        """Start an RPC without waiting; the caller maps errors with :func:`map_rpc_error`.

        ``request`` may be the request message already serialized (bytes), for
        the methods of :data:`RAW_REQUEST_METHODS`: the producer builds Produce
        requests from batches it serialized once.
        """
        fn = self._raw_method(addr, method) if isinstance(request, bytes) else getattr(self.stub(addr), method)
        return fn.future(request, timeout=self.request_timeout if timeout is None else timeout)  # type: ignore[no-any-return]

    def _raw_method(self, addr: str, method: str) -> Any:
        """A unary call of ``method`` on ``addr`` that sends bytes as they are (no request serializer)."""
        key = (addr, method)
        fn = self._raw_methods.get(key)
        if fn is None:
            response_type = RAW_REQUEST_METHODS[method]
            self.stub(addr)  # creates the channel
            with self._lock:
                channel = self._channels.get(addr)
                if channel is None:
                    raise errors.IllegalStateError("the client is closed")
                fn = channel.unary_unary(
                    f"/sluice.v1.Broker/{method}",
                    request_serializer=None,
                    response_deserializer=response_type.FromString,
                )
                self._raw_methods[key] = fn
        return fn

    def candidates(self) -> list[str]:
        """Addresses to try for a request any broker can answer: known brokers, then bootstrap."""
        with self._lock:
            known = list(self.brokers.values())
        random.shuffle(known)
        boot = list(self.bootstrap)
        random.shuffle(boot)
        seen: set[str] = set()
        out = []
        for addr in known + boot:
            if addr not in seen:
                seen.add(addr)
                out.append(addr)
        return out

    def call_any(self, method: str, request: Any, timeout: float | None = None) -> Any:
        """An RPC any broker can answer: try each broker until one responds."""
        last: errors.SluiceError | None = None
        for addr in self.candidates():
            try:
                return self.call(addr, method, request, timeout)
            except (errors.BrokerNotAvailableError, errors.RequestTimedOutError) as exc:
                last = exc
        raise errors.BrokerNotAvailableError(f"no broker answered {method}: {last}")

    def call_all(self, method: str, request: Any, timeout: float | None = None) -> list[tuple[int, Any]]:
        """The same RPC to every known broker (after a metadata refresh); (broker id, response) pairs."""
        self.refresh()
        with self._lock:
            brokers = dict(self.brokers)
        out: list[tuple[int, Any]] = []
        last: errors.SluiceError | None = None
        for broker_id, addr in sorted(brokers.items()):
            try:
                out.append((broker_id, self.call(addr, method, request, timeout)))
            except (errors.BrokerNotAvailableError, errors.RequestTimedOutError) as exc:
                last = exc
        if not out:
            raise errors.BrokerNotAvailableError(f"no broker answered {method}: {last}")
        return out

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channels = list(self._channels.values())
            self._channels.clear()
            self._stubs.clear()
            self._raw_methods.clear()
        for channel in channels:
            channel.close()

    # ------------------------------------------------------------------ metadata

    def refresh(self, topics: Iterable[str] | None = None) -> broker_pb2.MetadataResponse:
        """Fetch metadata (for ``topics``, or every topic) from any broker and update the cache."""
        wanted = sorted(set(topics)) if topics is not None else []
        request = broker_pb2.MetadataRequest(topics=wanted)
        with self._refresh_lock:
            response: broker_pb2.MetadataResponse = self.call_any("Metadata", request)
            self._apply_metadata(response, wanted)
        return response

    def _apply_metadata(self, response: broker_pb2.MetadataResponse, wanted: list[str]) -> None:
        now = time.monotonic()
        with self._lock:
            self.version += 1
            if response.brokers:
                self.brokers = {b.broker_id: broker_address(b.host, b.port) for b in response.brokers}
            self.cluster_id = response.cluster_id
            self.controller_id = response.controller_id
            seen = set()
            for t in response.topics:
                seen.add(t.name)
                self._topic_refreshed[t.name] = now
                if t.error_code != records_pb2.NONE:
                    self._topics.pop(t.name, None)
                    continue
                info = TopicInfo(
                    name=t.name,
                    topic_id=t.topic_id,
                    internal=t.internal,
                    config=dict(t.config),
                    replication_factor=t.replication_factor,
                )
                for p in t.partitions:
                    info.partitions[p.partition] = PartitionInfo(
                        topic=t.name,
                        partition=p.partition,
                        leader=p.leader,
                        leader_epoch=p.leader_epoch,
                        replicas=tuple(p.replicas),
                        isr=tuple(p.isr),
                        error_code=p.error_code,
                    )
                self._topics[t.name] = info
            if wanted:
                for name in wanted:
                    if name not in seen:
                        self._topics.pop(name, None)
                        self._topic_refreshed[name] = now
            else:
                for name in list(self._topics):
                    if name not in seen:
                        del self._topics[name]

    def refresh_if_stale(self, topics: Iterable[str], min_age: float | None = None) -> None:
        """Refresh ``topics`` unless they were refreshed less than ``min_age`` seconds ago.

        Many threads hitting NOT_LEADER_OR_FOLLOWER at once cause one refresh, not many.
        """
        min_age = self.retry_backoff if min_age is None else min_age
        now = time.monotonic()
        with self._lock:
            stale = [t for t in topics if now - self._topic_refreshed.get(t, 0.0) >= min_age]
        if stale:
            try:
                self.refresh(stale)
            except errors.SluiceError as exc:
                log.debug("metadata refresh failed: %s", exc)

    def topic(self, name: str) -> TopicInfo | None:
        with self._lock:
            info = self._topics.get(name)
            age = time.monotonic() - self._topic_refreshed.get(name, 0.0)
        if info is not None and age > self.metadata_max_age:
            self.refresh_if_stale([name])
            with self._lock:
                info = self._topics.get(name)
        return info

    def partition_count(self, name: str) -> int | None:
        info = self.topic(name)
        return len(info.partitions) if info is not None and info.partitions else None

    def leader(self, topic: str, partition: int) -> tuple[str, int] | None:
        """(address, leader epoch) of the partition's leader, or None when unknown."""
        with self._lock:
            info = self._topics.get(topic)
            if info is None:
                return None
            p = info.partitions.get(partition)
            if p is None or p.leader < 0:
                return None
            addr = self.brokers.get(p.leader)
            return None if addr is None else (addr, p.leader_epoch)

    def forget_leader(self, topic: str, partition: int) -> None:
        """Mark a partition's leader unknown (it did not answer or is no longer leader)."""
        with self._lock:
            self.version += 1
            info = self._topics.get(topic)
            p = info.partitions.get(partition) if info else None
            if info is not None and p is not None:
                info.partitions[partition] = PartitionInfo(
                    p.topic, p.partition, -1, p.leader_epoch, p.replicas, p.isr, p.error_code
                )
            self._topic_refreshed.pop(topic, None)

    def wait_for_topic(self, name: str, deadline: Deadline) -> TopicInfo:
        """The topic's metadata, refreshing until it exists (topics appear shortly after creation)."""
        info = self.topic(name)
        if info is not None and info.partitions:
            return info
        backoff = Backoff()
        last: Exception | None = None
        while True:
            try:
                self.refresh([name])
                last = None
            except errors.SluiceError as exc:
                if not exc.retriable:
                    raise
                last = exc
            info = self.topic(name)
            if info is not None and info.partitions:
                return info
            if deadline.expired():
                if last is not None:
                    raise errors.KafkaTimeoutError(f"no metadata for topic {name!r}: {last}")
                raise errors.UnknownTopicOrPartitionError(f"topic {name!r} not present in metadata")
            backoff.sleep(deadline)

    # ------------------------------------------------------------------ coordinators

    def find_coordinator(self, key: str, key_type: int, deadline: Deadline, *, once: bool = False) -> tuple[int, str]:
        """(broker id, address) of the coordinator of a group id or transactional id.

        Retries until ``deadline``; with ``once``, a single attempt with a
        short timeout, for callers (the sender thread) that must not block.
        """
        with self._lock:
            found = self._coordinators.get((key_type, key))
        if found is not None:
            return found

        def attempt() -> tuple[int, str]:
            request = broker_pb2.FindCoordinatorRequest(key=key, key_type=key_type)  # type: ignore[arg-type]
            timeout = min(self.request_timeout, 5.0) if once else deadline.timeout(self.request_timeout)
            response: broker_pb2.FindCoordinatorResponse = self.call_any("FindCoordinator", request, timeout)
            errors.check(response.error_code, response.error_message)
            return response.node_id, broker_address(response.host, response.port)

        found = attempt() if once else retry(attempt, deadline)
        with self._lock:
            self._coordinators[(key_type, key)] = found
        return found

    def forget_coordinator(self, key: str, key_type: int) -> None:
        with self._lock:
            self._coordinators.pop((key_type, key), None)

    def coordinator_call(
        self,
        key: str,
        key_type: int,
        method: str,
        request: Any,
        error_of: Callable[[Any], tuple[int, str]],
        deadline: Deadline,
        *,
        retry_codes: frozenset[int] = frozenset(),
    ) -> Any:
        """Send ``request`` to the coordinator of ``key``, retrying until it succeeds or fails for good.

        ``error_of(response)`` names the response's error (code, message),
        NONE for success. The coordinator is found again after NOT_COORDINATOR,
        COORDINATOR_NOT_AVAILABLE or when it does not answer; retriable codes
        (and ``retry_codes``) wait and retry; anything else is raised.
        """
        backoff = Backoff()
        while True:
            try:
                _node, addr = self.find_coordinator(key, key_type, deadline)
                response = self.call(addr, method, request, deadline.timeout(self.request_timeout))
            except (errors.BrokerNotAvailableError, errors.RequestTimedOutError) as exc:
                self.forget_coordinator(key, key_type)
                if deadline.expired():
                    raise
                log.debug("%s for %r: %s", method, key, exc)
                backoff.sleep(deadline)
                continue
            code, message = error_of(response)
            if code == records_pb2.NONE:
                return response
            exc2 = errors.error_for(code, message)
            if code in COORDINATOR_MOVED_CODES:
                self.forget_coordinator(key, key_type)
            if not (exc2.retriable or code in retry_codes) or deadline.expired():
                raise exc2
            log.debug("%s for %r: retrying after %s", method, key, exc2.code_name)
            backoff.sleep(deadline)


def response_error(response: Any) -> tuple[int, str]:
    """The ``error_of`` of coordinator_call() for responses with one top-level error_code/error_message."""
    return response.error_code, response.error_message


def first_error(codes: Iterable[tuple[int, str]]) -> tuple[int, str]:
    """The error to act on among per-item results: a fatal one first, then a retriable one, else NONE."""
    retriable: tuple[int, str] | None = None
    for code, message in codes:
        if code == records_pb2.NONE:
            continue
        if not errors.error_class(code).retriable:
            return code, message
        if retriable is None:
            retriable = (code, message)
    return retriable or (records_pb2.NONE, "")
