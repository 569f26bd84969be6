"""Connections, cluster metadata and coordinators: the state every client shares.

Design:

* One gRPC channel per broker address, created lazily and kept for the life
  of the client (:class:`Cluster`). gRPC channels are thread-safe and multiplex
  calls, so the producer's sender thread, the consumer's heartbeat thread and
  the application's threads all share them. Channels allow large messages
  (:data:`MAX_MESSAGE_BYTES`) and reconnect quickly after a broker restart
  (gRPC's default reconnect backoff grows to two minutes, far too long for a
  failover).
* Calls are typed: each names an :class:`~sluice.client._network.rpc.Rpc`
  descriptor, and its request and response types follow from it. The gRPC
  callable of a (channel, RPC) pair is made once and kept; looking it up
  takes no lock (dictionary reads are atomic), since the produce and fetch
  paths make one call per request.
* gRPC status codes become :mod:`sluice.errors` exceptions in one place
  (:func:`~sluice.client._network.error_mapping.map_rpc_error`).
* The metadata cache (brokers, topics, partition leaders and epochs) is
  refreshed on demand: when a topic is unknown, after NOT_LEADER_OR_FOLLOWER,
  UNKNOWN_TOPIC_OR_PARTITION or FENCED_LEADER_EPOCH, and when a leader does
  not answer. Refreshes are rate limited so a storm of errors costs one RPC.
* Coordinators (transaction and group) are found with FindCoordinator, cached
  per key, and forgotten on NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE or when
  the broker does not answer. :meth:`Cluster.coordinator_call` wraps that
  loop so producer, consumer and admin code only state the request and how to
  read the error out of its response.
* Retries wait with :class:`~sluice.client._network.retry.Backoff` until a
  :class:`~sluice.client._network.retry.Deadline`.
* Every call is bounded by a deadline, metadata refreshes and bootstrap calls
  included, and no lock is held while a call waits: a broker that stopped
  answering (a paused process, a partition) costs a caller at most its own
  timeout and never blocks another thread. A request any broker can answer
  (:meth:`Cluster.call_any`) tries the brokers in order of health, as Kafka's
  least-loaded-node choice does: one that did not answer lately (a timeout or
  an unavailable connection) is tried last for :data:`UNRESPONSIVE_PENALTY_S`.
  A read-only one (Metadata, FindCoordinator, describes) is also sent to the
  next broker when the first has not answered within :data:`HEDGE_AFTER_S`,
  and the first answer wins, so one paused broker costs a metadata refresh
  about a second, not the request timeout. Requests that change something
  (InitProducerId, CreateTopics ...) go to one broker at a time.
* When nothing listens at any address the client knows (every connection
  refused) and it never reached a broker, :meth:`Cluster.call_any` raises
  :class:`~sluice.errors.NoBrokersAvailableError` at once, naming the
  addresses: a wrong address or a stopped cluster, which waiting cannot fix.
  Once a broker answered, the same failure is a retriable
  BrokerNotAvailableError (brokers restart).
* A partition the metadata answers LEADER_NOT_AVAILABLE (every in-sync replica down) is waited for,
  as Kafka's clients do; :meth:`Cluster.offline_reason` says why, for the final error of that wait
  (an expired batch, an offsets lookup), which names the partition and its replicas.
* A response's ``throttle_time_ms`` (a quota, KIP-219) is recorded per broker
  (:meth:`Cluster.throttle`); the producer and the consumer send that broker
  nothing more until it is over (:meth:`Cluster.throttled_for`).
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
from sluice.api.v1 import broker_pb2, records_pb2
from sluice.client._network import probe
from sluice.client._network import rpc as rpcs
from sluice.client._network.error_mapping import COORDINATOR_MOVED_CODES, map_rpc_error
from sluice.client._network.retry import Backoff, Deadline, retry
from sluice.client._network.rpc import Rpc, client_id_metadata
from sluice.client._network.security import PLAINTEXT, ClientSecurity

log = logging.getLogger("sluice.client")

RequestT = TypeVar("RequestT")
ResponseT = TypeVar("ResponseT")

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

GROUP = broker_pb2.GROUP
TRANSACTION = broker_pb2.TRANSACTION

# A broker that timed out or could not be reached is tried last for this long.
UNRESPONSIVE_PENALTY_S = 10.0
# A read-only request any broker can answer goes to the next broker too when unanswered this long.
HEDGE_AFTER_S = 1.0
# Requests that only read, safe to send to two brokers at once (the first answer is used).
READ_ONLY: frozenset[Rpc[Any, Any]] = frozenset(
    {
        rpcs.METADATA,
        rpcs.DESCRIBE_TOPICS,
        rpcs.FIND_COORDINATOR,
        rpcs.DESCRIBE_ACLS,
        rpcs.LIST_TRANSACTIONS,
        rpcs.LIST_GROUPS,
        rpcs.DESCRIBE_CLIENT_QUOTAS,
    }
)
# What gRPC says when nothing listens at an address (or the name does not resolve).
PROBE_TIMEOUT_S = 1.0  # how long a port that failed a gRPC call gets to say what it speaks (probe.py)
_NOTHING_LISTENS = ("connection refused", "dns resolution failed", "name or service not known", "no address")


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
        security: ClientSecurity = PLAINTEXT,
        client_id: str = "",
    ) -> None:
        self.bootstrap = parse_bootstrap(bootstrap_servers)
        self.client_id = client_id
        self._metadata = client_id_metadata(client_id)  # sent with every call: client-id quota entities
        self.security = security
        self.request_timeout = request_timeout_ms / 1000.0
        self.metadata_max_age = metadata_max_age_ms / 1000.0
        self.retry_backoff = retry_backoff_ms / 1000.0
        self._lock = threading.RLock()
        self._unresponsive: dict[str, float] = {}  # address -> until when it is tried last
        self._throttled: dict[str, float] = {}  # address -> until when it asked not to be sent to
        self._reached = False  # some broker answered once: later failures are retriable
        self._probed: dict[str, tuple[probe.Listener, bytes]] = {}  # what listens where (_not_grpc)
        self._warned_unknown: set[str] = set()  # topics whose absence was logged (_warn_unknown)
        self._channels: dict[str, grpc.Channel] = {}
        # address -> descriptor -> the channel's callable for it; read without the lock (see _callable)
        self._callables: dict[str, dict[Rpc[Any, Any], grpc.UnaryUnaryMultiCallable[Any, Any]]] = {}
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

    def _callable(self, addr: str, rpc: Rpc[RequestT, ResponseT]) -> grpc.UnaryUnaryMultiCallable[RequestT, ResponseT]:
        """The gRPC callable of ``rpc`` on the channel to ``addr``, made on first use.

        The hot path is two dictionary reads without the lock: entries are only
        ever added under the lock, and close() swaps in an empty dictionary, so a
        miss falls through to the locked path that checks the client is open.
        """
        by_rpc = self._callables.get(addr)
        if by_rpc is not None:
            fn = by_rpc.get(rpc)
            if fn is not None:
                return fn
        with self._lock:
            if self._closed:
                raise errors.IllegalStateError("the client is closed")
            channel = self._channels.get(addr)
            if channel is None:
                channel = self.security.channel(addr, CHANNEL_OPTIONS)
                self._channels[addr] = channel
            by_rpc = self._callables.setdefault(addr, {})
            fn = by_rpc.get(rpc)
            if fn is None:
                # _registered_method: as the generated stubs do (gRPC registers the method once
                # per channel instead of passing its name with every call); missing from grpc-stubs.
                fn = channel.unary_unary(  # type: ignore[call-arg]
                    rpc.path,
                    request_serializer=rpc.request_serializer,
                    response_deserializer=rpc.response_deserializer,
                    _registered_method=True,
                )
                by_rpc[rpc] = fn
            return fn

    def call(
        self, addr: str, rpc: Rpc[RequestT, ResponseT], request: RequestT, timeout: float | None = None
    ) -> ResponseT:
        """One unary RPC to ``addr``; gRPC failures raise :mod:`sluice.errors` exceptions."""
        fn = self._callable(addr, rpc)
        try:
            response = fn(
                request, timeout=self.request_timeout if timeout is None else timeout, metadata=self._metadata
            )
        except grpc.RpcError as exc:
            err = map_rpc_error(exc, addr, rpc.name)
            self._note_failure(addr, err)
            raise err from None
        self._note_answer(addr)
        return response

    def call_future(
        self, addr: str, rpc: Rpc[RequestT, ResponseT], request: RequestT, timeout: float | None = None
    ) -> grpc.Future[ResponseT]:
        """Start an RPC without waiting; the caller maps errors with :func:`map_rpc_error`.

        The producer sends Produce requests it serialized itself with
        :data:`~sluice.client._network.rpc.PRODUCE_SERIALIZED`.
        """
        return self._callable(addr, rpc).future(
            request, timeout=self.request_timeout if timeout is None else timeout, metadata=self._metadata
        )

    # ------------------------------------------------------------------ broker health and throttling

    def _note_answer(self, addr: str) -> None:
        self._reached = True
        if addr in self._unresponsive:  # read without the lock: the common case costs nothing
            with self._lock:
                self._unresponsive.pop(addr, None)

    def _note_failure(self, addr: str, exc: errors.SluiceError) -> None:
        if isinstance(exc, errors.BrokerNotAvailableError | errors.RequestTimedOutError):
            with self._lock:
                self._unresponsive[addr] = time.monotonic() + UNRESPONSIVE_PENALTY_S

    def throttle(self, addr: str, throttle_time_ms: int) -> None:
        """``addr`` answered with a throttle time (it is over a quota): send it nothing until it is over."""
        until = time.monotonic() + throttle_time_ms / 1000.0
        with self._lock:
            if until > self._throttled.get(addr, 0.0):
                self._throttled[addr] = until

    def throttled_for(self, addr: str) -> float:
        """Seconds until ``addr`` may be sent to again (0.0: now)."""
        until = self._throttled.get(addr)
        if until is None:
            return 0.0
        left = until - time.monotonic()
        if left <= 0:
            with self._lock:
                if self._throttled.get(addr) == until:
                    del self._throttled[addr]
            return 0.0
        return left

    def candidates(self) -> list[str]:
        """Addresses to try for a request any broker can answer: known brokers, then bootstrap, in
        random order, except that those that did not answer lately come last (longest ago first)."""
        now = time.monotonic()
        with self._lock:
            known = list(self.brokers.values())
            penalized = {a: t for a, t in self._unresponsive.items() if t > now}
        random.shuffle(known)
        boot = list(self.bootstrap)
        random.shuffle(boot)
        seen: set[str] = set()
        out = []
        for addr in known + boot:
            if addr not in seen:
                seen.add(addr)
                out.append(addr)
        out.sort(key=lambda a: penalized.get(a, 0.0))  # stable: the healthy keep their random order
        return out

    def call_any(self, rpc: Rpc[RequestT, ResponseT], request: RequestT, timeout: float | None = None) -> ResponseT:
        """An RPC any broker can answer, within ``timeout`` (default: the request timeout) in all.

        Brokers are tried in :meth:`candidates` order, one at a time, each for at most half of
        what is left of the timeout while others remain; a read-only RPC is also sent to the
        next broker when the first has not answered within :data:`HEDGE_AFTER_S` (see the
        module docstring).
        """
        deadline = Deadline(self.request_timeout if timeout is None else timeout)
        addrs = self.candidates()
        if rpc in READ_ONLY and len(addrs) > 1:
            return self._hedged(addrs, rpc, request, deadline)
        failures: list[tuple[str, errors.SluiceError]] = []
        for i, addr in enumerate(addrs):
            if failures and deadline.expired():
                break
            # one at a time (it changes something); while others are left, at most half of what
            # remains, so a broker that does not answer leaves the next one a chance
            cap = self.request_timeout if i == len(addrs) - 1 else max(1.0, deadline.remaining() / 2)
            try:
                return self.call(addr, rpc, request, deadline.timeout(min(self.request_timeout, cap)))
            except (errors.BrokerNotAvailableError, errors.RequestTimedOutError) as exc:
                failures.append((addr, exc))
        raise self._none_answered(rpc, addrs, failures)

    def _hedged(
        self, addrs: list[str], rpc: Rpc[RequestT, ResponseT], request: RequestT, deadline: Deadline
    ) -> ResponseT:
        """Send to ``addrs[0]``, then to each next one when nothing answered for HEDGE_AFTER_S or the
        previous failed; the first answer wins. Waits on futures with timeouts only: no lock held."""
        done = threading.Event()
        pending: list[tuple[str, grpc.Future[ResponseT]]] = []
        failures: list[tuple[str, errors.SluiceError]] = []
        waiting = list(addrs)
        next_at = 0.0
        try:
            while True:
                now = time.monotonic()
                if waiting and (now >= next_at or not pending) and not deadline.expired():
                    addr = waiting.pop(0)
                    future = self.call_future(addr, rpc, request, deadline.timeout(self.request_timeout))
                    future.add_done_callback(lambda _f: done.set())
                    pending.append((addr, future))
                    next_at = now + HEDGE_AFTER_S
                for addr, future in [p for p in pending if p[1].done()]:
                    pending.remove((addr, future))
                    try:
                        response = future.result()
                    except grpc.RpcError as exc:
                        err = map_rpc_error(exc, addr, rpc.name)
                        self._note_failure(addr, err)
                        if not isinstance(err, errors.BrokerNotAvailableError | errors.RequestTimedOutError):
                            raise err from None
                        failures.append((addr, err))
                        continue
                    self._note_answer(addr)
                    return response
                if not pending and (not waiting or deadline.expired()):
                    raise self._none_answered(rpc, addrs, failures)
                wait = deadline.remaining() if not waiting else min(deadline.remaining(), max(0.0, next_at - now))
                done.wait(max(wait, 0.001))
                done.clear()
        finally:
            for _addr, future in pending:
                future.cancel()

    def _none_answered(
        self, rpc: Rpc[Any, Any], addrs: list[str], failures: list[tuple[str, errors.SluiceError]]
    ) -> errors.SluiceError:
        """The error of a call no broker answered: NoBrokersAvailableError when nothing listens anywhere."""
        tried = [addr for addr, _exc in failures]
        nothing_listens = (
            bool(failures)
            and len(tried) == len(addrs)
            and all(any(text in str(exc).lower() for text in _NOTHING_LISTENS) for _addr, exc in failures)
        )
        if nothing_listens and not self._reached:
            return errors.NoBrokersAvailableError(
                f"no broker listens at {', '.join(tried)} (connection refused at every address): "
                "is the cluster running, and are these its client addresses (bootstrap_servers)?"
            )
        if not self._reached and failures and len(tried) == len(addrs):
            wrong = self._not_grpc(tried)
            if wrong is not None:
                return errors.NoBrokersAvailableError(wrong)
        detail = "; ".join(f"{addr}: {exc}" for addr, exc in failures[-3:]) or "no broker to ask"
        untried = len(addrs) - len(tried)
        more = f" ({untried} not tried before the deadline)" if untried else ""
        return errors.BrokerNotAvailableError(f"no broker answered {rpc.name}{more}: {detail}")

    def _not_grpc(self, addrs: list[str]) -> str | None:
        """Why none of ``addrs`` can be a Sluice broker's gRPC port, or None when one may be.

        Asked only before any broker answered, when every address accepted a connection and failed
        the call (a Kafka port fails a gRPC call as a restarting broker does); each address is probed
        once per client (probe.py), so a cluster that is merely starting costs one probe each.
        """
        found: list[tuple[str, probe.Listener, bytes]] = []
        for addr in addrs:
            known = self._probed.get(addr)
            if known is None:
                known = self._probed[addr] = probe.probe(addr, PROBE_TIMEOUT_S)
            found.append((addr, *known))
        if not found or any(kind not in (probe.Listener.KAFKA, probe.Listener.OTHER) for _a, kind, _d in found):
            return None
        kafka = [addr for addr, kind, _data in found if kind == probe.Listener.KAFKA]
        if kafka:
            verb = "speaks" if len(kafka) == 1 else "speak"
            return (
                f"{', '.join(kafka)} {verb} Kafka's protocol, not Sluice's gRPC: a Kafka "
                "listener (a Sluice broker's Kafka port, or a Kafka broker). Sluice's clients and the sluice CLI "
                "need the brokers' gRPC address (`sluice dev up` prints both: 127.0.0.1:9092 for Sluice clients, "
                "127.0.0.1:19092 for Kafka clients); Kafka clients (kcat, confluent-kafka, Java) use this one"
            )
        answered = "; ".join(f"{addr} answered {data[:16]!r}" for addr, _kind, data in found)
        return f"nothing at {', '.join(addrs)} speaks gRPC ({answered}): are these a Sluice cluster's client addresses?"

    def call_all(
        self, rpc: Rpc[RequestT, ResponseT], request: RequestT, timeout: float | None = None
    ) -> list[tuple[int, ResponseT]]:
        """The same RPC to every known broker (after a metadata refresh), all at once, within
        ``timeout``; (broker id, response) pairs of those that answered."""
        deadline = Deadline(self.request_timeout if timeout is None else timeout)
        self.refresh(timeout=deadline.timeout(self.request_timeout))
        with self._lock:
            brokers = dict(self.brokers)
        futures = [
            (broker_id, addr, self.call_future(addr, rpc, request, deadline.timeout(self.request_timeout)))
            for broker_id, addr in sorted(brokers.items())
        ]
        out: list[tuple[int, ResponseT]] = []
        last: errors.SluiceError | None = None
        for broker_id, addr, future in futures:
            try:
                out.append((broker_id, future.result()))
                self._note_answer(addr)
            except grpc.RpcError as exc:
                last = map_rpc_error(exc, addr, rpc.name)
                self._note_failure(addr, last)
                if not isinstance(last, errors.BrokerNotAvailableError | errors.RequestTimedOutError):
                    raise last from None
        if not out:
            raise errors.BrokerNotAvailableError(f"no broker answered {rpc.name}: {last}")
        return out

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channels = list(self._channels.values())
            self._channels.clear()
            self._callables = {}  # a new dictionary: readers without the lock see all or nothing
        for channel in channels:
            channel.close()

    # ------------------------------------------------------------------ metadata

    def refresh(self, topics: Iterable[str] | None = None, timeout: float | None = None) -> broker_pb2.MetadataResponse:
        """Fetch metadata (for ``topics``, or every topic) from any broker, within ``timeout``
        (default: the request timeout), and update the cache. No lock is held while it waits."""
        wanted = sorted(set(topics)) if topics is not None else []
        request = broker_pb2.MetadataRequest(topics=wanted)
        response = self.call_any(rpcs.METADATA, request, timeout)
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
                old = self._topics.get(t.name)
                for p in t.partitions:
                    known = old.partitions.get(p.partition) if old is not None and old.topic_id == t.topic_id else None
                    if known is not None and known.leader_epoch > p.leader_epoch:
                        # an answer older than what is cached (refreshes run concurrently): keep the newer
                        info.partitions[p.partition] = known
                        continue
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

    def refresh_if_stale(
        self, topics: Iterable[str], min_age: float | None = None, timeout: float | None = None
    ) -> None:
        """Refresh ``topics`` (within ``timeout``) unless they were refreshed less than ``min_age`` s ago.

        Many threads hitting NOT_LEADER_OR_FOLLOWER at once cause one refresh, not many: the
        topics count as refreshed from the moment one starts, so the others go on with what is
        cached and look again after ``min_age``, rather than queue behind a slow broker.
        """
        min_age = self.retry_backoff if min_age is None else min_age
        now = time.monotonic()
        with self._lock:
            stale = [t for t in topics if now - self._topic_refreshed.get(t, 0.0) >= min_age]
            for t in stale:
                self._topic_refreshed[t] = now
        if stale:
            try:
                self.refresh(stale, timeout)
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

    def offline_reason(self, topic: str, partition: int) -> str | None:
        """Why the partition cannot be written or read now, when the metadata says it has no leader.

        For the final error of a wait on it (a send's delivery_timeout_ms, an offsets lookup), which
        would otherwise say only that time ran out, or what the last broker it asked failed with.
        Only the brokers' word counts (LEADER_NOT_AVAILABLE), not a leader this client forgot.
        """
        with self._lock:
            info = self._topics.get(topic)
            p = info.partitions.get(partition) if info is not None else None
        if p is None or p.error_code != records_pb2.LEADER_NOT_AVAILABLE:
            return None
        return (
            f"{topic}-{partition} is offline: it has no leader (replicas {list(p.replicas)}, in sync "
            f"{list(p.isr)}: none of them alive to lead it; LEADER_NOT_AVAILABLE)"
        )

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
        unknown = f"topic {name!r} not present in metadata"
        while True:
            try:
                response = self.refresh([name], deadline.timeout(self.request_timeout))
                last = None
            except errors.SluiceError as exc:
                if not exc.retriable:
                    raise
                last = exc
            else:
                for t in response.topics:  # not allowed to Describe it: waiting would not help
                    if t.name == name and t.error_code == records_pb2.TOPIC_AUTHORIZATION_FAILED:
                        raise errors.TopicAuthorizationFailedError(t.error_message)
                    if t.name == name and t.error_code == records_pb2.UNKNOWN_TOPIC_OR_PARTITION:
                        unknown = t.error_message or unknown  # the broker's: says how topics get created
                        self._warn_unknown(name, unknown, deadline)
            info = self.topic(name)
            if info is not None and info.partitions:
                return info
            if deadline.expired():
                if last is not None:
                    raise errors.KafkaTimeoutError(f"no metadata for topic {name!r}: {last}")
                raise errors.UnknownTopicOrPartitionError(unknown)
            backoff.sleep(deadline)

    def _warn_unknown(self, name: str, why: str, deadline: Deadline) -> None:
        """Say once per topic why a call is waiting: Kafka's clients wait silently for a topic that may be created."""
        with self._lock:
            if name in self._warned_unknown:
                return
            self._warned_unknown.add(name)
        log.warning("%s; waiting up to %.0f s for it to be created", why, deadline.remaining())

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
            response = self.call_any(rpcs.FIND_COORDINATOR, request, timeout)
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
        rpc: Rpc[RequestT, ResponseT],
        request: RequestT,
        error_of: Callable[[ResponseT], tuple[int, str]],
        deadline: Deadline,
        *,
        retry_codes: frozenset[int] = frozenset(),
    ) -> ResponseT:
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
                response = self.call(addr, rpc, request, deadline.timeout(self.request_timeout))
            except (errors.BrokerNotAvailableError, errors.RequestTimedOutError) as exc:
                self.forget_coordinator(key, key_type)
                if deadline.expired():
                    raise
                log.debug("%s for %r: %s", rpc.name, key, exc)
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
            log.debug("%s for %r: retrying after %s", rpc.name, key, exc2.code_name)
            backoff.sleep(deadline)
