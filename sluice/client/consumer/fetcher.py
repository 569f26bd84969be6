"""Fetching records for a consumer: Fetch requests to partition leaders, the record buffer, ListOffsets.

Design (the consumer module's docstring has the consumer-wide picture):

* At most one Fetch request is in flight per partition (``grpc.Future``\\s
  that survive between polls; a leader may have several, so a long poll for
  partitions at their end never holds up the others).
* A response's batches are decoded with
  :func:`sluice.records.decode_record_tuples` into a per-partition buffer;
  :meth:`Fetcher.drain` hands out at most ``max_poll_records`` records,
  round-robin over partitions. Once no more than ``max_poll_records`` records
  of a partition are buffered, the next fetch for it is sent (a prefetch,
  from the end of what is buffered), so records are there when the
  application asks. Control batches and records below the position are
  skipped; once a fetched range is used up the position moves to the
  response's ``next_fetch_offset``, which steps over aborted and control
  batches the broker filtered out.
* A fetch response is used only if the partition is still assigned and its
  position (or, for a prefetch, the end of its buffer) is still the offset
  that was fetched: a ``seek()`` or a rebalance while the fetch was in flight
  simply discards it.
* Retriable errors make the partition wait a little (and forget its leader
  when it moved); a fatal one is kept and raised by the next ``poll()``
  (:meth:`Fetcher.take_error`).
* :meth:`Fetcher.list_offsets_at` asks the leaders for offsets by timestamp
  (earliest -2, latest -1, or a time), retrying until the deadline
  (:func:`list_offsets_at`, which the Admin client uses too; the per-leader
  loop is :func:`sluice.client._network.leaders.call_leaders`). Every retriable
  error is retried, OFFSET_NOT_AVAILABLE included: a leader just elected
  answers it to ``latest`` until its high watermark has caught up with what
  its predecessor may have shown (KIP-207), so an end offset never goes back.

The fetcher holds the consumer's lock (shared with the subscription state)
whenever it reads or changes positions or the buffer, and never while it
waits for the network.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import CancelledError
from dataclasses import dataclass

import grpc

from sluice import errors
from sluice.api.v1 import broker_pb2, records_pb2
from sluice.client._network import METADATA_REFRESH_CODES, Cluster, Deadline, map_rpc_error
from sluice.client._network import rpc as rpcs
from sluice.client._network.leaders import Answer, call_leaders
from sluice.client.consumer.subscription_state import SubscriptionState
from sluice.client.types import ConsumerRecord, TopicPartition, consumer_record
from sluice.records import RecordDecodeError, decode_record_tuples

log = logging.getLogger("sluice.client.consumer")

EARLIEST = -2
LATEST = -1


@dataclass(frozen=True, slots=True)
class FetchConfig:
    """The consumer's settings the fetcher uses (see the Consumer's arguments)."""

    isolation: records_pb2.IsolationLevel  # READ_COMMITTED or READ_UNCOMMITTED
    auto_offset_reset: str
    max_poll_records: int
    fetch_max_wait_ms: int
    fetch_min_bytes: int
    fetch_max_bytes: int
    max_partition_fetch_bytes: int
    request_timeout: float  # seconds


@dataclass(slots=True)
class _Fetched:
    records: list[ConsumerRecord]
    index: int
    next_fetch_offset: int


@dataclass(slots=True)
class InFlightFetch:
    addr: str
    offsets: dict[TopicPartition, int]
    future: grpc.Future[broker_pb2.FetchResponse]


class Fetcher:
    """Fetches the assigned partitions' records into a buffer and hands them out."""

    def __init__(
        self, cluster: Cluster, subscriptions: SubscriptionState, lock: threading.RLock, config: FetchConfig
    ) -> None:
        self._cluster = cluster
        self._subscriptions = subscriptions
        self._lock = lock
        self._config = config
        self._buffer: dict[TopicPartition, _Fetched] = {}
        # Fetches under way, by a serial number: at most one per partition, any number per leader
        # (a long poll for partitions at their end must not hold up the others).
        self._fetches: dict[int, InFlightFetch] = {}
        self._fetch_serial = 0
        self._fetch_event = threading.Event()
        self._pending_error: errors.SluiceError | None = None

    def forget(self, tp: TopicPartition) -> None:
        """Drop what is buffered for ``tp`` (sought, or no longer assigned). Called with the lock held."""
        self._buffer.pop(tp, None)

    def clear(self) -> None:
        """Drop every buffered record. Called with the lock held."""
        self._buffer.clear()

    def take_error(self) -> errors.SluiceError | None:
        """The fatal error a fetch met since the last call, if any (raised by poll())."""
        with self._lock:
            exc, self._pending_error = self._pending_error, None
        return exc

    def close(self) -> None:
        """Cancel the fetches in flight."""
        with self._lock:
            fetches = list(self._fetches.values())
            self._fetches.clear()
        for f in fetches:
            f.future.cancel()

    def drain(self, limit: int) -> list[ConsumerRecord]:
        """Up to ``limit`` buffered records at the positions, round-robin over partitions; moves the positions."""
        out: list[ConsumerRecord] = []
        with self._lock:
            for tp in list(self._buffer):
                if len(out) >= limit:
                    break
                fetched = self._buffer[tp]
                st = self._subscriptions.assignment.get(tp)
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

    def send_fetches(self, deadline: Deadline) -> int:
        """Start a Fetch to each leader for its fetchable partitions (none in flight); how many are in flight."""
        now = time.monotonic()
        by_leader: dict[str, dict[TopicPartition, tuple[int, int]]] = {}
        unknown: set[str] = set()
        with self._lock:
            busy = {tp for f in self._fetches.values() for tp in f.offsets}
            for tp, st in self._subscriptions.assignment.items():
                if st.position is None or st.paused or st.retry_at > now or tp in busy:
                    continue
                offset = st.position
                buffered = self._buffer.get(tp)
                if buffered is not None:
                    # Prefetch: once few buffered records are left, fetch what follows them, so the
                    # next records are already here when these are used up.
                    if len(buffered.records) - buffered.index > self._config.max_poll_records:
                        continue
                    offset = buffered.next_fetch_offset
                leader = self._cluster.leader(tp.topic, tp.partition)
                if leader is None:
                    unknown.add(tp.topic)
                    continue
                addr, epoch = leader
                by_leader.setdefault(addr, {})[tp] = (offset, epoch)
        if unknown:  # bounded: a poll must not outlive its timeout on a broker that does not answer
            self._cluster.refresh_if_stale(unknown, min_age=0.1, timeout=deadline.timeout(self._config.request_timeout))
        max_wait = int(min(self._config.fetch_max_wait_ms, deadline.remaining() * 1000))
        for addr, parts in by_leader.items():
            if self._cluster.throttled_for(addr) > 0:
                continue  # the broker's last answer said to wait (throttle_time_ms, KIP-219)
            topics: dict[str, list[broker_pb2.FetchPartition]] = {}
            for tp, (offset, epoch) in parts.items():
                topics.setdefault(tp.topic, []).append(
                    broker_pb2.FetchPartition(
                        partition=tp.partition,
                        fetch_offset=offset,
                        partition_max_bytes=self._config.max_partition_fetch_bytes,
                        current_leader_epoch=epoch if epoch >= 0 else -1,
                    )
                )
            request = broker_pb2.FetchRequest(
                max_wait_ms=max(0, max_wait),
                min_bytes=self._config.fetch_min_bytes,
                max_bytes=self._config.fetch_max_bytes,
                isolation_level=self._config.isolation,
                topics=[broker_pb2.FetchTopic(name=t, partitions=ps) for t, ps in topics.items()],
                replica_id=-1,
                kafka_v2_records=True,  # decode_record_tuples reads what Kafka clients produced, as stored
            )
            try:
                future = self._cluster.call_future(
                    addr, rpcs.FETCH, request, max_wait / 1000.0 + self._config.request_timeout
                )
            except Exception as exc:
                log.debug("fetch to %s could not start: %s", addr, exc)
                continue
            fetch = InFlightFetch(addr, {tp: off for tp, (off, _e) in parts.items()}, future)
            with self._lock:
                self._fetch_serial += 1
                self._fetches[self._fetch_serial] = fetch
            future.add_done_callback(lambda _f: self._fetch_event.set())
        with self._lock:
            return len(self._fetches)

    def wait_fetches(self, deadline: Deadline, in_flight: int) -> None:
        if in_flight == 0:
            time.sleep(min(0.05, deadline.remaining()))
            return
        self._fetch_event.wait(deadline.remaining())
        self._fetch_event.clear()
        self.collect_fetches()

    def collect_fetches(self) -> None:
        """Handle the fetches that came back (without waiting)."""
        with self._lock:
            done = [(serial, f) for serial, f in self._fetches.items() if f.future.done()]
            for serial, _f in done:
                del self._fetches[serial]
        for _serial, f in done:
            self._handle_fetch(f)

    def _handle_fetch(self, fetch: InFlightFetch) -> None:
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
                    st = self._subscriptions.assignment.get(tp)
                    if st is not None:
                        st.retry_at = retry_at
            return
        if response.throttle_time_ms > 0:  # over its quota: no fetch to this broker until it is over
            self._cluster.throttle(fetch.addr, response.throttle_time_ms)
        now = time.monotonic()
        for topic in response.topics:
            for p in topic.partitions:
                tp = TopicPartition(topic.name, p.partition)
                fetch_offset = fetch.offsets.get(tp)
                if fetch_offset is None:
                    continue
                with self._lock:
                    st = self._subscriptions.assignment.get(tp)
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
                        if self._config.auto_offset_reset == "none":
                            self._pending_error = errors.OffsetOutOfRangeError(
                                f"offset {fetch_offset} of {tp} is out of range and auto_offset_reset='none': "
                                f"{p.error_message}"
                            )
                        else:
                            log.info(
                                "offset %d of %s out of range: resetting to %s",
                                fetch_offset,
                                tp,
                                self._config.auto_offset_reset,
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
            st = self._subscriptions.assignment.get(tp)
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

    def list_offsets(
        self, tps: Iterable[TopicPartition], timestamp: int, deadline: Deadline
    ) -> dict[TopicPartition, int | None]:
        """ListOffsets at the partitions' leaders; offset None where no record matches ``timestamp``."""
        found = self.list_offsets_at(dict.fromkeys(tps, timestamp), deadline)
        return {tp: off for tp, (off, _ts) in found.items()}

    def list_offsets_at(
        self, wanted: dict[TopicPartition, int], deadline: Deadline
    ) -> dict[TopicPartition, tuple[int | None, int]]:
        """(offset or None, timestamp) per partition, from ListOffsets at each leader."""
        return list_offsets_at(self._cluster, wanted, self._config.isolation, self._config.request_timeout, deadline)


def list_offsets_at(
    cluster: Cluster,
    wanted: dict[TopicPartition, int],
    isolation: records_pb2.IsolationLevel,
    request_timeout: float,
    deadline: Deadline,
) -> dict[TopicPartition, tuple[int | None, int]]:
    """(offset or None, timestamp) per partition, from ListOffsets at each leader, retried until ``deadline``.

    ``wanted`` maps each partition to earliest (-2), latest (-1), max timestamp
    (-3) or a timestamp. Retriable errors (a moved leader, OFFSET_NOT_AVAILABLE
    from a new leader ...) are retried with a backoff; the last one is raised
    when the deadline passes, a fatal one at once.
    """

    def request_of(group: Sequence[TopicPartition]) -> broker_pb2.ListOffsetsRequest:
        topics: dict[str, list[broker_pb2.ListOffsetsPartition]] = {}
        for tp in group:
            topics.setdefault(tp.topic, []).append(
                broker_pb2.ListOffsetsPartition(partition=tp.partition, timestamp=wanted[tp])
            )
        return broker_pb2.ListOffsetsRequest(
            isolation_level=isolation,
            topics=[broker_pb2.ListOffsetsTopic(name=t, partitions=ps) for t, ps in topics.items()],
        )

    def answers_of(response: broker_pb2.ListOffsetsResponse) -> Iterator[Answer[tuple[int | None, int]]]:
        for t in response.topics:
            for p in t.partitions:
                found = (p.offset if p.offset >= 0 else None, p.timestamp)
                yield TopicPartition(t.name, p.partition), p.error_code, p.error_message, found

    return call_leaders(
        cluster, wanted, rpcs.LIST_OFFSETS, request_of, answers_of, request_timeout, deadline, "offsets"
    )
