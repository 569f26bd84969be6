"""The reassignment throttle's token bucket (sluice.broker.replication.throttle), on a fake clock."""

from __future__ import annotations

from sluice.broker.replication.throttle import ReplicationThrottle


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_off_when_the_rate_is_not_positive() -> None:
    for rate in (-1, 0):
        throttle = ReplicationThrottle(rate)
        assert not throttle.enabled and throttle.available() > 1 << 40
        throttle.charge(10**9)
        assert throttle.available() > 1 << 40
        assert throttle.throttled_bytes == 10**9


def test_one_second_of_burst_then_the_rate() -> None:
    clock = Clock()
    throttle = ReplicationThrottle(1000, clock)
    assert throttle.available() == 1000
    throttle.charge(1000)
    assert throttle.available() == 0
    clock.now += 0.5
    assert throttle.available() == 500


def test_a_debt_is_repaid_before_the_next_fetch() -> None:
    clock = Clock()
    throttle = ReplicationThrottle(1000, clock)
    throttle.charge(3000)  # one large batch: served, 2000 bytes of debt
    clock.now += 1.5
    assert throttle.available() == 0
    clock.now += 1.0
    assert throttle.available() == 500


def test_the_bucket_never_holds_more_than_one_second() -> None:
    clock = Clock()
    throttle = ReplicationThrottle(1000, clock)
    clock.now += 60
    assert throttle.available() == 1000


def test_bytes_moved_stay_within_the_rate_over_time() -> None:
    clock = Clock()
    throttle = ReplicationThrottle(1000, clock)
    moved = 0
    for _ in range(1000):  # 10 s in steps of 10 ms, each fetch taking what it may (batches of 300)
        if throttle.available() > 0:
            throttle.charge(300)
            moved += 300
        clock.now += 0.01
    assert moved <= 1000 * 10 + 1000 + 300
    assert moved >= 1000 * 10 * 0.9


def test_a_rebalance_rate_overrides_the_configured_one_until_it_is_removed() -> None:
    clock = Clock()
    throttle = ReplicationThrottle(-1, clock)  # no configured rate: off
    throttle.override(1000)  # a rebalance's spec.throttleBytesPerSecond
    assert throttle.enabled and throttle.rate == 1000 and throttle.available() == 1000
    throttle.charge(2500)
    clock.now += 1.0
    assert throttle.available() == 0  # 500 of the debt still to repay
    throttle.override(None)  # the rebalance ended: back to the configured rate (off)
    assert not throttle.enabled and throttle.available() > 1 << 40

    configured = ReplicationThrottle(10_000, clock)
    configured.override(100)  # lower than configured: the bucket holds no more than one second of it
    assert configured.rate == 100 and configured.available() == 100
    configured.override(None)
    assert configured.rate == 10_000
    clock.now += 1.0
    assert configured.available() == 10_000
