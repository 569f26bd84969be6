"""The producer-id rate limit per principal: a token bucket, refilled continuously."""

from __future__ import annotations

import pytest

from sluice.broker.config import BrokerConfig, ConfigError
from sluice.broker.security.limits import KEY, RateLimit


def test_a_bucket_empties_and_refills_per_principal() -> None:
    now = [0.0]
    limit = RateLimit(3, clock=lambda: now[0])
    assert [limit.take("User:a") for _ in range(4)] == [True, True, True, False]
    assert limit.take("User:b")  # another principal has its own bucket
    now[0] = 20.0  # a third of a minute: one token back
    assert limit.take("User:a") and not limit.take("User:a")
    assert KEY in limit.refusal("User:a") and "User:a" in limit.refusal("User:a")


def test_zero_is_unlimited_and_negative_is_refused() -> None:
    assert all(RateLimit(0).take("User:a") for _ in range(10_000))
    with pytest.raises(ValueError, match=KEY):
        RateLimit(-1)
    with pytest.raises(ConfigError, match=KEY):
        BrokerConfig.build(0, "127.0.0.1", 1, "/tmp/x", "/tmp/x/m", {KEY: "-5"})


def test_byte_rate_quota_throttles_for_as_long_as_the_principal_is_over() -> None:
    from sluice.broker.security.limits import MAX_THROTTLE_MS, ByteRateQuota

    now = [0.0]
    quota = ByteRateQuota("quota.producer.default", 1000, clock=lambda: now[0])
    assert quota.record("User:a", 1000) == 0  # one second of burst
    assert quota.record("User:a", 500) == 501  # 500 bytes over at 1000 B/s: half a second
    assert quota.record("User:b", 900) == 0
    now[0] = 0.5
    assert quota.record("User:a", 0) == 0  # back at zero after the throttle time
    assert quota.record("User:a", 10**9) == MAX_THROTTLE_MS
    assert ByteRateQuota("k", 0).record("User:a", 10**12) == 0
    with pytest.raises(ValueError, match=r"quota\.consumer\.default"):
        ByteRateQuota("quota.consumer.default", -1)
