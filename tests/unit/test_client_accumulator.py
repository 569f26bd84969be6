"""The producer's accumulator (batching, sequences, retry order) and the default partitioner."""

from __future__ import annotations

import random
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable

import pytest

from sluice import errors
from sluice.client.producer.accumulator import (
    SEQUENCE_MODULUS,
    AccumulatorConfig,
    RecordAccumulator,
    next_sequence,
    record_size,
)
from sluice.client.producer.partitioner import StickyPartitioner, default_partition, partition_for_key
from sluice.client.types import BatchOutcome, SentRecords, TopicPartition
from sluice.records import decode_records, verify_crc

TP0 = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)
PID, EPOCH = 42, 3


def acc(**overrides: object) -> RecordAccumulator:
    config = AccumulatorConfig(linger_ms=0, retry_backoff_ms=0)
    for k, v in overrides.items():
        setattr(config, k, v)
    return RecordAccumulator(config)


def drain_one(a: RecordAccumulator, tp: TopicPartition = TP0, now: float = 1e12):  # type: ignore[no-untyped-def]
    batches = a.drain([tp], now, PID, EPOCH)
    assert len(batches) == 1
    return batches[0]


# ------------------------------------------------------------------ batching


def test_records_fill_one_batch_until_batch_size() -> None:
    a = acc(batch_size=1000)
    size = record_size(b"k", b"x" * 100, None)
    per_batch = 1000 // size
    for i in range(per_batch * 2 + 1):
        assert a.append(TP0, b"k", b"x" * 100, timestamp=i) is not None
    assert a.queued_count() == 3
    ready, _ = a.ready(0.0)
    assert ready == [TP0]


def test_a_record_larger_than_batch_size_gets_a_batch_of_its_own() -> None:
    a = acc(batch_size=100)
    a.append(TP0, None, b"small")
    a.append(TP0, None, b"x" * 500)
    a.append(TP0, None, b"small")
    assert a.queued_count() == 3


def test_a_record_larger_than_max_request_size_fails_its_future() -> None:
    a = acc(max_request_size=1000)
    future = a.append(TP0, None, b"x" * 2000)
    assert future is not None
    with pytest.raises(errors.MessageTooLargeError):
        future.result(0)
    assert a.queued_count() == 0


def test_linger_holds_a_batch_until_it_is_due_or_full() -> None:
    a = acc(linger_ms=50, batch_size=10_000)
    a.append(TP0, None, b"v")
    created = a.incomplete()[0].created
    ready, wait = a.ready(created + 0.01)
    assert ready == []
    assert wait == pytest.approx(0.04, abs=1e-6)
    ready, _ = a.ready(created + 0.05)
    assert ready == [TP0]


def test_flush_makes_lingering_batches_ready() -> None:
    a = acc(linger_ms=60_000)
    a.append(TP0, None, b"v")
    assert a.ready(a.incomplete()[0].created)[0] == []
    a.begin_flush()
    assert a.ready(a.incomplete()[0].created)[0] == [TP0]
    a.end_flush()


def test_abort_on_new_batch() -> None:
    a = acc()
    assert a.append(TP0, None, b"v", abort_on_new_batch=True) is None
    assert a.append(TP0, None, b"v") is not None
    assert a.append(TP0, None, b"w", abort_on_new_batch=True) is not None  # fits in the open batch


def test_drained_batch_is_a_valid_record_batch_with_futures_resolved_in_order() -> None:
    a = acc()
    futures = [a.append(TP0, b"k%d" % i, b"v%d" % i, [("h", b"1")], 1000 + i) for i in range(3)]
    batch = drain_one(a)
    assert batch.wire is not None
    wire = batch.wire
    assert verify_crc(wire)
    assert (wire.producer_id, wire.producer_epoch, wire.base_sequence, wire.record_count) == (PID, EPOCH, 0, 3)
    wire.base_offset = 100
    records = decode_records(wire)
    assert [(r.offset, r.key, r.value, r.timestamp) for r in records] == [
        (100 + i, b"k%d" % i, b"v%d" % i, 1000 + i) for i in range(3)
    ]
    a.complete(batch, 100)
    metas = [f.result(0) for f in futures if f is not None]
    assert [(m.partition, m.offset, m.timestamp) for m in metas] == [(0, 100 + i, 1000 + i) for i in range(3)]
    assert not a.has_incomplete()


def test_values_appended_in_bulk_make_the_batches_one_by_one_appends_make() -> None:
    """append_values (Producer.send_many) gives the same batches, bytes and futures as append."""
    values = [b"v%d" % i * (i % 7) if i % 5 else None for i in range(200)]
    one, bulk = acc(batch_size=600), acc(batch_size=600)
    singles = [one.append(TP0, None, v, None, 1000) for v in values]
    runs: list[tuple[BatchOutcome, int, int, int]] = []
    start, fills = 0, 0
    while start < len(values):
        start, full = bulk.append_values(bulk.queue_for(TP0), values, start, 1000, False, 0, runs)
        fills += full
    sent = SentRecords(runs)
    assert len(sent) == len(values) and one.queued_count() == bulk.queued_count() == fills + 1 > 2
    offset = 0
    for _ in range(one.queued_count()):
        a, b = drain_one(one), drain_one(bulk)
        assert a.wire_parts == b.wire_parts  # the same records, encoded the same
        one.complete(a, offset)
        bulk.complete(b, offset)
        offset += a.record_count
    sent.wait(timeout=0)
    assert [f.result(0).offset for f in sent] == [f.result(0).offset for f in singles] == list(range(200))
    assert [sent[i].result(0).offset for i in (0, 57, -1)] == [0, 57, 199]
    assert [f.result(0).offset for f in sent[198:]] == [198, 199]
    assert {f.result(0).timestamp for f in sent} == {1000}
    with pytest.raises(IndexError):
        sent[200]


def test_a_bulk_send_waits_for_every_batch_and_raises_the_first_error() -> None:
    a = acc(batch_size=110)
    runs: list[tuple[BatchOutcome, int, int, int]] = []
    start = 0
    while start < 8:
        start, _ = a.append_values(a.queue_for(TP0), [b"x" * 30] * 8, start, 5, False, 0, runs)
    sent = SentRecords(runs)
    assert [count for _o, _first, count, _ts in runs] == [2, 2, 2, 2]  # records of 52 bytes, batches of 110
    batches = [drain_one(a) for _ in range(a.queued_count())]
    a.complete(batches[0], 0)
    with pytest.raises(TimeoutError):
        sent.wait(timeout=0.01)  # the later batches are not done
    for batch in batches[1:]:
        a.fail(batch, errors.NotEnoughReplicasError("test"))
    with pytest.raises(errors.NotEnoughReplicasError):
        sent.wait(timeout=1)
    assert sent[0].result(0).offset == 0 and isinstance(sent[-1].exception(0), errors.NotEnoughReplicasError)


def test_bulk_values_start_a_new_batch_when_the_open_one_cannot_take_the_next() -> None:
    a = acc(batch_size=120)
    a.append(TP0, None, b"x" * 60)
    runs: list[tuple[BatchOutcome, int, int, int]] = []
    start, full = a.append_values(a.queue_for(TP0), [b"y" * 60, b"z"], 0, 7, False, 0, runs)
    assert (start, a.queued_count()) == (2, 2)  # y did not fit beside x: a batch of its own, z joined it
    start, full = a.append_values(a.queue_for(TP0), [b"w" * 500], 0, 7, False, 0, runs)
    assert (start, full, a.queued_count()) == (1, True, 3)  # larger than batch_size: a batch of its own
    a.append(TP1, None, b"t", generation=0)
    start, _ = a.append_values(a.queue_for(TP1), [b"u"], 0, 7, True, 1, runs)
    assert a.queued_count() == 5  # never into a batch of another transaction
    assert [(first, count) for _o, first, count, _ts in runs] == [(0, 2), (0, 1), (0, 1)]
    a.close()
    with pytest.raises(errors.IllegalStateError):
        a.append_values(a.queue_for(TP0), [b"v"], 0, 7, False, 0, runs)


def test_bulk_values_for_the_sticky_partitioner_append_nothing_where_a_new_batch_is_needed() -> None:
    """As append_to with abort_on_new_batch: the producer then sticks to another partition."""
    a = acc(batch_size=120)
    runs: list[tuple[BatchOutcome, int, int, int]] = []
    assert a.append_values(a.queue_for(TP0), [b"v"], 0, 7, False, 0, runs, True) == (0, True)  # no batch yet
    assert (a.queued_count(), runs) == (0, [])
    a.append(TP0, None, b"x" * 60)
    assert a.append_values(a.queue_for(TP0), [b"y", b"z" * 60], 0, 7, False, 0, runs, True) == (1, True)
    assert a.append_values(a.queue_for(TP0), [b"z" * 60], 0, 7, False, 0, runs, True) == (0, True)  # full
    assert a.queued_count() == 1


def test_compression_is_applied_when_sealing() -> None:
    from sluice.api.v1 import records_pb2

    a = acc(compression=records_pb2.COMPRESSION_ZSTD)
    a.append(TP0, None, b"a" * 10_000)
    batch = drain_one(a)
    assert batch.wire is not None
    assert batch.wire.compression == records_pb2.COMPRESSION_ZSTD
    assert len(batch.wire.records) < 1000
    assert decode_records(batch.wire)[0].value == b"a" * 10_000


# ------------------------------------------------------------------ sequences


def test_sequences_start_at_zero_and_advance_by_record_count_per_partition() -> None:
    a = acc(batch_size=record_size(None, b"v", None) * 3)
    for _ in range(7):
        a.append(TP0, None, b"v")
    a.append(TP1, None, b"v")
    seen = []
    for _ in range(3):
        (batch,) = a.drain([TP0], 1e12, PID, EPOCH)
        seen.append((batch.sequence, batch.record_count))
        a.complete(batch, 0)
    assert seen == [(0, 3), (3, 3), (6, 1)]
    assert drain_one(a, TP1).sequence == 0


def test_sequence_wraps_at_2_31() -> None:
    assert next_sequence(SEQUENCE_MODULUS - 1, 1) == 0
    assert next_sequence(SEQUENCE_MODULUS - 2, 5) == 3
    assert next_sequence(10, 5) == 15
    a = acc()
    a.append(TP0, None, b"a")
    a.append(TP0, None, b"b")
    a._parts[TP0].next_sequence = SEQUENCE_MODULUS - 1
    batch = drain_one(a)
    assert batch.sequence == SEQUENCE_MODULUS - 1
    assert a._parts[TP0].next_sequence == 1


def test_no_sequence_without_a_producer_id() -> None:
    a = acc(idempotent=False)
    a.append(TP0, None, b"v")
    (batch,) = a.drain([TP0], 1e12, -1, -1)
    assert batch.sequence == -1
    assert batch.wire is not None and batch.wire.producer_id == -1


# ------------------------------------------------------------------ in flight, retries, order


def test_at_most_max_in_flight_per_partition() -> None:
    a = acc(max_in_flight=2, batch_size=1)
    for _ in range(4):
        a.append(TP0, None, b"v")
    assert len(a.drain([TP0], 1e12, PID, EPOCH)) == 1  # one batch per partition per drain
    assert len(a.drain([TP0], 1e12, PID, EPOCH)) == 1
    assert a.drain([TP0], 1e12, PID, EPOCH) == []
    assert a.ready(1e12)[0] == []
    assert a.in_flight_count(TP0) == 2


def test_retry_keeps_sequence_order_and_bytes_and_sends_one_at_a_time() -> None:
    a = acc(max_in_flight=5, batch_size=1)
    for _ in range(5):
        a.append(TP0, None, b"v")
    sent = [drain_one(a) for _ in range(3)]
    wires = [b.wire for b in sent]
    assert [b.sequence for b in sent] == [0, 1, 2]
    # batch 0 fails (leader moved); 1 and 2 come back OUT_OF_ORDER: all requeued in order
    a.requeue(sent[1], 0.0, errors.OutOfOrderSequenceError())
    a.requeue(sent[0], 0.0, errors.NotLeaderOrFollowerError())
    assert a.earlier_unacknowledged(sent[2])
    # recovery: nothing is sent while a batch is still in flight
    assert a.drain([TP0], 1e12, PID, EPOCH) == []
    a.requeue(sent[2], 0.0, errors.OutOfOrderSequenceError())
    order = []
    while True:
        batches = a.drain([TP0], 1e12, PID, EPOCH)
        if not batches:
            break
        for batch in batches:
            if batch.sequence < 2:
                # one at a time while batches that had a sequence before the failure are resent
                assert a.drain([TP0], 1e12, PID, EPOCH) == []
            order.append(batch.sequence)
            a.complete(batch, batch.sequence * 10)
    assert order == [0, 1, 2, 3, 4]
    assert [b.wire for b in sent] == wires  # retries resend the very same batches


def test_pipelining_resumes_after_recovery() -> None:
    a = acc(max_in_flight=5, batch_size=1)
    for _ in range(4):
        a.append(TP0, None, b"v")
    first = drain_one(a)
    a.requeue(first, 0.0, errors.NotLeaderOrFollowerError())
    again = drain_one(a)
    assert again is first
    a.complete(again, 0)
    assert len(a.drain([TP0], 1e12, PID, EPOCH)) == 1
    assert len(a.drain([TP0], 1e12, PID, EPOCH)) == 1  # two in flight again


def test_retry_backoff_delays_the_retry() -> None:
    a = acc(retry_backoff_ms=100)
    a.append(TP0, None, b"v")
    batch = drain_one(a)
    a.requeue(batch, 10.0, errors.NotLeaderOrFollowerError())
    assert a.drain([TP0], 10.05, PID, EPOCH) == []
    assert a.drain([TP0], 10.11, PID, EPOCH) == [batch]


def test_expire_and_fail() -> None:
    a = acc(delivery_timeout_ms=1000, linger_ms=10_000)
    future = a.append(TP0, None, b"v")
    created = a.incomplete()[0].created
    assert a.expire(created + 0.5) == []
    (batch,) = a.expire(created + 1.0)
    # out of its queue, but incomplete until failed: a flush meanwhile still waits for it
    assert a.incomplete() == [batch] and a.queued_count() == 0
    a.fail(batch, errors.KafkaTimeoutError("expired"))
    assert future is not None
    with pytest.raises(errors.KafkaTimeoutError):
        future.result(0)
    assert not a.has_incomplete()


def test_reset_sequences_unseals_unsent_retries_and_drops_maybe_stored_ones() -> None:
    a = acc(batch_size=1)
    for _ in range(3):
        a.append(TP0, None, b"v")
    b0, b1 = drain_one(a), drain_one(a)
    b0.maybe_stored = True  # e.g. the request timed out
    a.requeue(b0, 0.0, errors.RequestTimedOutError())
    a.requeue(b1, 0.0, errors.OutOfOrderSequenceError())
    assert a.reset_sequences() == [b0]
    nxt = drain_one(a)
    assert nxt is b1
    assert nxt.sequence == 0
    assert nxt.producer_epoch == EPOCH


def test_abort_queued_keeps_in_flight_batches() -> None:
    a = acc(batch_size=1)
    for _ in range(3):
        a.append(TP0, None, b"v", transactional=True)
    in_flight = drain_one(a)
    dropped = a.abort_queued(lambda b: b.transactional)
    assert len(dropped) == 2
    assert a.queued_count() == 0
    for batch in dropped:  # incomplete until the caller fails them
        a.fail(batch, errors.KafkaTimeoutError("aborted"))
    assert a.incomplete() == [in_flight]


def test_a_record_never_joins_a_batch_of_another_transaction() -> None:
    a = acc(linger_ms=10_000)
    a.append(TP0, None, b"n", transactional=True, generation=1)
    a.append(TP0, None, b"n+1", transactional=True, generation=3)
    first, second = sorted(a.incomplete(), key=lambda b: b.generation)
    assert (first.generation, first.record_count, second.generation, second.record_count) == (1, 1, 3, 1)
    assert a.incomplete(3) == [second]
    # drained only while its transaction is the current one
    assert a.drain([TP0], 1e12, PID, EPOCH, generation=3) == []
    assert a.drain([TP0], 1e12, PID, EPOCH, generation=1) == [first]


def test_appends_after_close_are_refused() -> None:
    a = acc()
    a.close()
    with pytest.raises(errors.IllegalStateError):
        a.append(TP0, None, b"v")


# ------------------------------------------------------------------ partitioner


def test_key_partitioning_is_crc32_and_stable() -> None:
    for key in (b"", b"a", b"order-17", bytes(range(256))):
        for n in (1, 3, 7, 50):
            assert partition_for_key(key, n) == zlib.crc32(key) % n
    # pinned values: changing the partitioner moves every keyed record of every user
    assert [partition_for_key(b"k%d" % i, 6) for i in range(8)] == [zlib.crc32(b"k%d" % i) % 6 for i in range(8)]
    assert partition_for_key(b"order-17", 12) == 8


def test_sticky_partitioner_sticks_until_a_new_batch() -> None:
    sticky = StickyPartitioner(random.Random(1))
    first = sticky.partition("t", 8)
    assert all(sticky.partition("t", 8) == first for _ in range(10))
    sticky.on_new_batch("t", 8, first)
    second = sticky.partition("t", 8)
    assert second != first
    sticky.on_new_batch("t", 8, first)  # stale notice: no change
    assert sticky.partition("t", 8) == second


def test_sticky_partitioner_prefers_available_partitions() -> None:
    sticky = StickyPartitioner(random.Random(2))
    for _ in range(20):
        p = sticky.partition("t", 4, [2])
        assert p == 2
        sticky.on_new_batch("t", 4, p, [2])


def test_default_partition() -> None:
    sticky = StickyPartitioner(random.Random(3))
    assert default_partition(sticky, "t", b"abc", 5) == zlib.crc32(b"abc") % 5
    p = default_partition(sticky, "t", None, 5)
    assert 0 <= p < 5


# ------------------------------------------------------------------ buffer_memory


def blocked_append(a: RecordAccumulator, append: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """Run ``append`` on a thread and return once it waits for buffer space; its result or exception
    lands in the list when it ends. Bounded: the waiter registers at once (10 s on a loaded machine)."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(append())
        except Exception as exc:  # the tests look at what was raised
            out.append(exc)

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 10
    while not a._space_waiters and time.monotonic() < deadline:
        time.sleep(0.001)
    assert a._space_waiters == 1 and out == []
    return t, out


def test_a_new_batch_waits_for_buffer_memory_until_an_acknowledgement_frees_it() -> None:
    a = acc(batch_size=1000, buffer_memory=2000, max_block_ms=10_000, linger_ms=60_000)
    first = a.append(TP0, None, b"x" * 900)
    a.append(TP1, None, b"x" * 900)  # two batches: the buffer is full
    assert a.ready(0.0)[0] == []  # lingering: nothing is sendable yet
    t, got = blocked_append(a, lambda: a.append(TP0, None, b"y" * 900))
    assert sorted(a.ready(0.0)[0]) == [TP0, TP1]  # while someone waits, every queued batch goes at once
    a.append(TP1, None, b"z" * 50)  # 70 more bytes still fit: this append does not wait
    batch = drain_one(a, TP0)
    a.complete(batch, 7)
    t.join(10)
    assert not t.is_alive() and len(got) == 1
    assert first is not None and first.result(0).offset == 7
    assert a.queued_count() == 2 and a._buffered == sum(b.size for b in a.incomplete())


def test_buffer_exhausted_after_max_block_ms_fails_the_record_not_the_producer() -> None:
    a = acc(batch_size=1000, buffer_memory=1000, max_block_ms=50)
    a.append(TP0, None, b"x" * 900)
    start = time.monotonic()
    refused = a.append(TP0, None, b"y" * 900)
    assert refused is not None and time.monotonic() - start >= 0.05
    exc = refused.exception(0)
    assert isinstance(exc, errors.BufferExhaustedError) and exc.retriable
    assert "buffer_memory (1000 bytes" in str(exc) and "max_block_ms (50 ms)" in str(exc)
    assert a.queued_count() == 1  # the refused record was not queued
    a.complete(drain_one(a), 0)
    assert a._buffered == 0
    later = a.append(TP0, None, b"z")
    assert later is not None and not later.done()  # room again: queued


def test_send_from_a_record_callback_never_waits_for_buffer_memory() -> None:
    # Callbacks run on the producer's I/O threads, the ones that free the buffer: waiting there would
    # stop the producer. The record goes over the bound instead.
    a = acc(batch_size=1000, buffer_memory=2000, max_block_ms=2000)
    f = a.append(TP0, None, b"x" * 900)
    a.append(TP1, None, b"x" * 900)
    assert f is not None
    inside: list[object] = []
    tp2 = TopicPartition("t", 2)
    # 1,500 bytes need 1,500 of the 1,000 that the failed batch gives back
    f.add_done_callback(lambda _f: inside.append(a.append(tp2, None, b"y" * 1500)))
    a.fail(drain_one(a), errors.BrokerNotAvailableError("down"))  # runs the callback on this thread
    assert len(inside) == 1 and inside[0] is not None and not inside[0].done()  # type: ignore[attr-defined]
    assert a._buffered > 2000  # over the bound, by design


def test_close_wakes_a_send_waiting_for_buffer_memory() -> None:
    a = acc(batch_size=1000, buffer_memory=1000, max_block_ms=60_000)
    a.append(TP0, None, b"x" * 900)
    t, raised = blocked_append(a, lambda: a.append(TP1, None, b"y" * 900))
    a.close()
    t.join(10)
    assert not t.is_alive()
    assert len(raised) == 1 and isinstance(raised[0], errors.IllegalStateError)


def test_bulk_append_waits_for_buffer_memory_too() -> None:
    a = acc(batch_size=1000, buffer_memory=1000, max_block_ms=30)
    runs: list[tuple[BatchOutcome, int, int, int]] = []
    q0 = a.queue_for(TP0)
    end, full = a.append_values(q0, [b"x" * 300] * 3, 0, 1, False, 0, runs)
    assert end == 3 and not full
    q1 = a.queue_for(TP1)
    with pytest.raises(errors.BufferExhaustedError):
        a.append_values(q1, [b"y" * 300], 0, 1, False, 0, runs)
    assert a.queued_count() == 1


def test_the_hot_path_raises_buffer_exhausted_for_send_to_record_with_the_transaction() -> None:
    # Producer.send() calls append_to and turns the error into a refused record (which breaks an open
    # transaction, as every refused record does): append_to raises rather than returning a future.
    a = acc(batch_size=1000, buffer_memory=1000, max_block_ms=10)
    a.append(TP0, None, b"x" * 900)
    with pytest.raises(errors.BufferExhaustedError):
        a.append_to(a.queue_for(TP1), None, b"y" * 900, None, 1, record_size(None, b"y" * 900, None), True, False, 1)


# ------------------------------------------------------------------ send(callback=...)


def test_delivery_callbacks_run_in_send_order_with_each_records_metadata() -> None:
    a = acc(batch_size=10_000)
    seen: list[tuple[int, int, int, object]] = []

    def cb(md: object, exc: BaseException | None) -> None:
        seen.append((md.partition, md.offset, md.timestamp, exc))  # type: ignore[attr-defined]

    q = a.queue_for(TP0)
    for i in range(5):
        a.append_to(q, None, b"v", None, 1000 + i, record_size(None, b"v", None), False, False, 0, cb)
    a.append_to(q, None, b"w", None, 2000, record_size(None, b"w", None), False, False, 0)  # no callback
    a.complete(drain_one(a), 40)
    assert seen == [(0, 40 + i, 1000 + i, None) for i in range(5)]
    assert q.queue == deque() and not a.incomplete()


def test_delivery_callbacks_of_a_failed_batch_get_the_error_and_minus_one() -> None:
    a = acc(batch_size=10_000)
    seen: list[tuple[int, int, object]] = []
    q = a.queue_for(TP1)
    for _ in range(3):
        a.append_to(
            q, None, b"v", None, 5, record_size(None, b"v", None), False, False, 0,
            lambda md, exc: seen.append((md.offset, md.timestamp, exc)),
        )  # fmt: skip
    err = errors.NotEnoughReplicasError("2 of 3")
    a.fail(drain_one(a, TP1), err)
    assert seen == [(-1, -1, err)] * 3


def test_a_failing_delivery_callback_is_logged_and_the_others_still_run(caplog: pytest.LogCaptureFixture) -> None:
    a = acc(batch_size=10_000)
    seen: list[int] = []

    def bad(md: object, exc: BaseException | None) -> None:
        raise RuntimeError("callback bug")

    q = a.queue_for(TP0)
    size = record_size(None, b"v", None)
    a.append_to(q, None, b"v", None, 1, size, False, False, 0, bad)
    a.append_to(q, None, b"v", None, 1, size, False, False, 0, lambda md, exc: seen.append(md.offset))
    a.complete(drain_one(a), 7)
    assert seen == [8]
    assert "exception calling the delivery callback of t-0" in caplog.text


def test_send_from_a_delivery_callback_never_waits_for_buffer_memory() -> None:
    a = acc(batch_size=1000, buffer_memory=2000, max_block_ms=2000)
    inside: list[object] = []
    tp2 = TopicPartition("t", 2)
    q = a.queue_for(TP0)
    a.append_to(
        q, None, b"x" * 900, None, 1, record_size(None, b"x" * 900, None), False, False, 0,
        lambda md, exc: inside.append(a.append(tp2, None, b"y" * 1500)),
    )  # fmt: skip
    a.append(TP1, None, b"x" * 900)
    a.fail(drain_one(a), errors.BrokerNotAvailableError("down"))
    assert len(inside) == 1 and inside[0] is not None and not inside[0].done()  # type: ignore[attr-defined]


def test_a_send_that_waited_for_space_past_its_transactions_end_is_refused() -> None:
    current = [1]
    a = RecordAccumulator(
        AccumulatorConfig(linger_ms=0, retry_backoff_ms=0, batch_size=1000, buffer_memory=1000, max_block_ms=10_000),
        current_generation=lambda: current[0],
    )
    q0, q1 = a.queue_for(TP0), a.queue_for(TP1)
    size = record_size(None, b"x" * 900, None)
    a.append_to(q0, None, b"x" * 900, None, 1, size, True, False, 1)
    t, raised = blocked_append(a, lambda: a.append_to(q1, None, b"y" * 900, None, 1, size, True, False, 1))
    current[0] = 2  # another thread ended transaction 1 (its batches failed or committed)
    a.complete(drain_one(a), 0)
    t.join(10)
    assert not t.is_alive() and len(raised) == 1 and isinstance(raised[0], errors.IllegalStateError)
    assert "transaction is no longer open" in str(raised[0])
    assert a.queued_count() == 0  # nothing of the ended transaction was queued


def test_a_waiter_whose_queue_was_replaced_meanwhile_appends_to_the_new_one() -> None:
    # expire() and abort_queued() swap a partition's deque while a send() waits for space (the lock is
    # released): the waiter must queue into the deque the sender reads, or its batch would be lost
    # there, never sent nor failed, and its buffer space never given back.
    for swap in ("expire", "abort_queued"):
        a = acc(batch_size=1000, buffer_memory=2000, max_block_ms=10_000, delivery_timeout_ms=1)
        a.append(TP0, None, b"x" * 900)
        a.append(TP1, None, b"x" * 900)
        t, got = blocked_append(a, lambda a=a: a.append(TP1, None, b"y" * 900))
        # expire: both batches are past delivery_timeout_ms; abort_queued: TP0's only
        taken = a.expire(time.monotonic() + 1) if swap == "expire" else a.abort_queued(lambda b: b.tp == TP0)
        for batch in taken:
            a.fail(batch, errors.KafkaTimeoutError("expired"))
        t.join(10)
        assert not t.is_alive() and len(got) == 1 and not got[0].done()  # type: ignore[attr-defined]
        assert a.queued_count() == len(a.incomplete()), swap  # every incomplete batch is where the sender looks
        for _ in range(4):  # one batch per partition per drain
            for batch in a.drain([TP0, TP1], 1e12, PID, EPOCH):
                a.complete(batch, 0)
        assert not a.incomplete() and a._buffered == 0, swap


def test_a_send_that_waited_while_its_transaction_commits_is_refused() -> None:
    # The transaction manager reports -1 while the transaction is not open for sends (committing,
    # aborting, in error): a waiter woken then must not queue into it (Kafka: "Cannot call send in
    # state COMMITTING_TRANSACTION").
    open_ = [True]
    a = RecordAccumulator(
        AccumulatorConfig(linger_ms=0, retry_backoff_ms=0, batch_size=1000, buffer_memory=1000, max_block_ms=10_000),
        current_generation=lambda: 1 if open_[0] else -1,
    )
    q0, q1 = a.queue_for(TP0), a.queue_for(TP1)
    size = record_size(None, b"x" * 900, None)
    a.append_to(q0, None, b"x" * 900, None, 1, size, True, False, 1)
    t, raised = blocked_append(a, lambda: a.append_to(q1, None, b"y" * 900, None, 1, size, True, False, 1))
    open_[0] = False  # commit_transaction() began
    a.complete(drain_one(a), 0)
    t.join(10)
    assert len(raised) == 1 and isinstance(raised[0], errors.IllegalStateError)
    assert a.queued_count() == 0 and a._buffered == 0


def test_buffer_memory_counts_the_bytes_of_records_not_batch_size_per_open_batch() -> None:
    # Kafka reserves batch.size for every open batch; Sluice counts bytes, so one small record in each
    # of many partitions does not fill the buffer with empty batches (keyed records over hundreds
    # of partitions were four times slower with a 256 KiB batch_size counted per batch).
    a = acc(batch_size=262_144, buffer_memory=1_048_576, max_block_ms=10)
    futures = [a.append(TopicPartition("t", p), b"k", b"v" * 100) for p in range(300)]
    assert all(f is not None and not f.done() for f in futures)  # 300 open batches, about 37 KB
    assert a._buffered == sum(b.size for b in a.incomplete()) < 40_000
    # ... and an append into an open batch counts too: the bound holds for the bytes themselves
    big = b"x" * 250_000
    a.append(TP0, None, big)
    a.append(TP0, None, big)
    a.append(TP1, None, big)
    a.append(TopicPartition("t", 2), None, big)
    refused = a.append(TopicPartition("t", 3), None, big)  # 37 KB + 5 x 250 KB > 1 MiB
    assert refused is not None and isinstance(refused.exception(0), errors.BufferExhaustedError)
    assert a._buffered <= 1_048_576


def test_bulk_append_stops_at_buffer_memory_and_goes_on_after_an_acknowledgement() -> None:
    a = acc(batch_size=100_000, buffer_memory=10_000, max_block_ms=10)
    runs: list[tuple[BatchOutcome, int, int, int]] = []
    q0 = a.queue_for(TP0)
    end, _full = a.append_values(q0, [b"x" * 1000] * 20, 0, 1, False, 0, runs)
    assert 0 < end < 20 and a._buffered <= 10_000  # stopped where the buffer is full
    with pytest.raises(errors.BufferExhaustedError):
        a.append_values(q0, [b"x" * 1000] * 20, end, 1, False, 0, runs)
    a.complete(drain_one(a), 0)
    assert a._buffered == 0
    end2, _full = a.append_values(q0, [b"x" * 1000] * 20, end, 1, False, 0, runs)
    assert end2 > end
