"""The producer's per-record futures: lightweight, but concurrent.futures.Future in behaviour.

Every record of a batch shares one BatchOutcome; these tests pin down that each
future still behaves as a ``concurrent.futures.Future`` that is running until
its batch completes: result/exception with timeouts, callbacks before and after
completion, ``concurrent.futures.wait`` / ``as_completed``, and the standalone
futures of records that failed before being queued.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections import deque
from concurrent.futures import Future, InvalidStateError
from typing import Any

import pytest

from sluice import errors
from sluice.client.types import BatchOutcome, FutureRecordMetadata, RecordMetadata, failed_future


def futures(n: int, topic: str = "t", partition: int = 2) -> tuple[BatchOutcome, list[FutureRecordMetadata]]:
    outcome = BatchOutcome(topic, partition)
    return outcome, [FutureRecordMetadata(outcome, i, 1000 + i) for i in range(n)]


def test_a_record_future_is_a_running_concurrent_future_until_its_batch_completes() -> None:
    outcome, (f0, f1) = futures(2)
    assert isinstance(f0, Future)
    assert not f0.done() and f0.running() and not f0.cancelled()
    assert not f0.cancel()  # a record being sent cannot be cancelled
    with pytest.raises(TimeoutError):
        f0.result(timeout=0.01)
    with pytest.raises(TimeoutError):
        f0.exception(timeout=0)
    assert outcome.complete(500)
    assert f0.done() and not f0.running()
    assert f0.result() == RecordMetadata("t", 2, 500, 1000)
    assert f1.get(0) == RecordMetadata("t", 2, 501, 1001)
    assert f1.exception() is None
    assert not outcome.complete(900)  # completed once
    assert f1.result().offset == 501


def test_log_append_time_and_unknown_offsets() -> None:
    outcome, (f0, f1) = futures(2)
    outcome.complete(-1, log_append_time=77)  # acks=0: offset unknown; LogAppendTime topic
    assert f0.result() == RecordMetadata("t", 2, -1, 77)
    assert f1.result() == RecordMetadata("t", 2, -1, 77)


def test_a_failed_batch_fails_every_record_with_its_error() -> None:
    outcome, fs = futures(3)
    exc = errors.KafkaTimeoutError("expired")
    outcome.fail(exc)
    for f in fs:
        assert f.done()
        assert f.exception() is exc
        with pytest.raises(errors.KafkaTimeoutError):
            f.result()


def test_result_waits_for_completion_from_another_thread() -> None:
    outcome, (f,) = futures(1)
    threading.Timer(0.05, outcome.complete, args=(7,)).start()
    assert f.result(timeout=5).offset == 7


def test_callbacks_run_once_in_order_before_and_after_completion() -> None:
    outcome, (f0, f1) = futures(2)
    calls: list[tuple[str, int]] = []
    f0.add_done_callback(lambda f: calls.append(("a", f.result().offset)))
    f0.add_done_callback(lambda f: calls.append(("b", f.result().offset)))  # a second one on the same future
    f1.add_done_callback(lambda f: calls.append(("c", f.result().offset)))
    assert calls == []
    outcome.complete(10)
    assert calls == [("a", 10), ("b", 10), ("c", 11)]
    f1.add_done_callback(lambda f: calls.append(("late", f.result().offset)))  # already done: runs now
    assert calls[-1] == ("late", 11)
    outcome.complete(99)
    assert len(calls) == 4


def test_a_failing_callback_is_logged_and_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    outcome, (f0, f1) = futures(2)
    seen: list[int] = []

    def boom(_f: Future[RecordMetadata]) -> None:
        raise RuntimeError("boom")

    f0.add_done_callback(boom)
    f1.add_done_callback(lambda f: seen.append(f.result().offset))
    outcome.complete(0)
    assert seen == [1]
    assert "exception calling callback" in caplog.text


def test_callbacks_registered_while_completing_run_exactly_once() -> None:
    count = [0]
    lock = threading.Lock()

    def cb(_f: Future[RecordMetadata]) -> None:
        with lock:
            count[0] += 1

    for _ in range(50):
        count[0] = 0
        outcome, fs = futures(200)
        t = threading.Thread(target=lambda fs=fs: [f.add_done_callback(cb) for f in fs])
        t.start()
        outcome.complete(0)
        t.join()
        assert count[0] == 200


def test_a_callback_appended_just_after_the_finish_drained_still_runs_once() -> None:
    # The interleaving the lock-free registration must survive, made deterministic: the adder saw
    # the batch running, then the batch completed and drained its (empty) callbacks, and only then
    # did the adder's append land. The adder sees ``done`` after its append and runs the entry.
    outcome, (f, g) = futures(2)
    ran: list[str] = []

    class FinishFirst(deque[tuple[FutureRecordMetadata, Any]]):
        def append(self, entry: tuple[FutureRecordMetadata, Any]) -> None:
            if not outcome.done:
                outcome.complete(7)  # drains nothing: the entry is not there yet
            super().append(entry)

    g.add_done_callback(lambda _f: ran.append("before"))  # registered the ordinary way
    outcome._callbacks = FinishFirst(outcome._callbacks)
    f.add_done_callback(lambda f: ran.append(f"late {f.result().offset}"))
    assert ran == ["before", "late 7"]
    assert not outcome._callbacks


def test_two_threads_adding_to_the_same_futures_while_they_complete_run_each_callback_once() -> None:
    # Registration takes no lock (BatchOutcome's docstring): two threads add a callback to each of the
    # same futures while a third completes the batch, with a tiny switch interval so that the threads
    # interleave inside add_done_callback. Every (future, thread) pair must run exactly once, and a
    # callback that registers another one from inside the drain must run it too.
    import sys

    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for round_ in range(20):
            ran: list[tuple[int, str]] = []
            outcome, fs = futures(300)

            def add(tag: str, fs: list[FutureRecordMetadata] = fs, ran: list[tuple[int, str]] = ran) -> None:
                for f in fs:
                    f.add_done_callback(lambda f, tag=tag: ran.append((f._index, tag)))  # list.append: atomic

            def nested(
                f: Future[RecordMetadata], fs: list[FutureRecordMetadata] = fs, ran: list[tuple[int, str]] = ran
            ) -> None:
                fs[-1].add_done_callback(lambda _f: ran.append((-1, "nested")))

            fs[0].add_done_callback(nested)
            threads = [threading.Thread(target=add, args=(tag,)) for tag in ("a", "b")]
            for t in threads:
                t.start()
            if round_ % 2:
                time.sleep(0.0005)  # let some registrations land before the finish, some after
            outcome.complete(0)
            for t in threads:
                t.join(10)
            assert sorted(ran) == sorted([(-1, "nested")] + [(i, tag) for i in range(300) for tag in ("a", "b")])
            assert not outcome._callbacks
    finally:
        sys.setswitchinterval(before)


def test_concurrent_futures_wait_and_as_completed_work_on_record_futures() -> None:
    outcome, fs = futures(3)
    other = Future[int]()
    threading.Timer(0.05, outcome.complete, args=(40,)).start()
    done, not_done = concurrent.futures.wait([*fs, other], timeout=5, return_when=concurrent.futures.FIRST_COMPLETED)
    assert set(done) == set(fs) and not_done == {other}
    assert [f.result().offset for f in concurrent.futures.as_completed(fs, timeout=1)] != []

    outcome2, fs2 = futures(2)
    threading.Timer(0.05, outcome2.fail, args=(errors.BrokerNotAvailableError("down"),)).start()
    done, _ = concurrent.futures.wait(fs2, timeout=5, return_when=concurrent.futures.FIRST_EXCEPTION)
    assert set(done) == set(fs2)
    assert all(isinstance(f.exception(), errors.BrokerNotAvailableError) for f in fs2)

    outcome3, fs3 = futures(2)
    outcome3.complete(1)
    done, _ = concurrent.futures.wait(fs3, timeout=0)  # materialised after completion
    assert set(done) == set(fs3)


def test_failed_future_and_standalone_futures() -> None:
    f = failed_future(errors.MessageTooLargeError("too large"))
    assert f.done()
    with pytest.raises(errors.MessageTooLargeError):
        f.result(0)
    g = FutureRecordMetadata()
    assert g.set_running_or_notify_cancel()
    g.set_result(RecordMetadata("x", 1, 5, 6))
    assert g.result() == RecordMetadata("x", 1, 5, 6)
    with pytest.raises(InvalidStateError):
        g.set_exception(ValueError("late"))
    h = FutureRecordMetadata()
    h.set_exception(ValueError("bad"))
    assert isinstance(h.exception(), ValueError)
    assert "raised ValueError" in repr(h) and "returned RecordMetadata" in repr(g)
    assert "running" in repr(FutureRecordMetadata())


def test_record_futures_are_cheap() -> None:
    # Not a timing assertion: the point is that no per-record lock or condition exists.
    outcome, (f,) = futures(1)
    assert "_condition" not in f.__dict__
    f.add_done_callback(lambda _f: None)
    assert "_condition" not in f.__dict__
    outcome.complete(0)
    time.sleep(0)
    assert "_condition" not in f.__dict__
