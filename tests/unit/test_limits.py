"""The producer-id rate limit per principal: a token bucket, refilled continuously."""

from __future__ import annotations

from pathlib import Path

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


def test_a_principal_over_its_quota_is_delayed_until_it_is_not_and_overrides_win() -> None:
    from sluice.broker.security.limits import ByteRateQuota

    class Overrides:
        def any(self) -> bool:
            return True

        def resolve(self, principal: str, client_id: str) -> tuple[tuple[str, str], int] | None:
            return ((principal, ""), 100) if principal == "User:slow" else None

    now = [0.0]
    quota = ByteRateQuota("quota.producer.default", 1000, clock=lambda: now[0], rates=Overrides())
    assert quota.active and quota.rate_of("User:slow") == 100 and quota.rate_of("User:a") == 1000
    assert quota.record("User:slow", 150) == 501  # 50 bytes below zero at 100 B/s
    assert quota.delay("User:slow") == pytest.approx(0.5)
    now[0] = 0.25
    assert quota.delay("User:slow") == pytest.approx(0.25)
    now[0] = 1.0
    assert quota.delay("User:slow") == 0.0
    assert quota.delay("User:never-seen") == 0.0


def test_connection_quotas_count_per_address_with_overrides_and_a_total() -> None:
    from sluice.broker.security.connections import ConnectionQuotas

    q = ConnectionQuotas(2, {"10.0.0.9": 3}, total=5)
    assert q.open("10.0.0.1") is None and q.open("10.0.0.1") is None
    refused = q.open("10.0.0.1")
    assert refused is not None and "max.connections.per.ip=2" in refused and "10.0.0.1" in refused
    assert [q.open("10.0.0.9") for _ in range(3)] == [None, None, None]
    total = q.open("10.0.0.2")
    assert total is not None and "max.connections=5" in total
    q.close("10.0.0.1")
    assert q.open("10.0.0.2") is None and q.count == 5


def test_grpc_connections_are_learnt_from_peers_and_forgotten_when_gone() -> None:
    from sluice.broker.security.connections import ConnectionQuotas, GrpcConnections

    now = [0.0]
    established: set[tuple[str, int]] = set()
    conns = GrpcConnections(
        ConnectionQuotas(2), 9092, idle_s=600, clock=lambda: now[0], established=lambda port: set(established)
    )
    established |= {("127.0.0.1", 1001), ("127.0.0.1", 1002), ("127.0.0.1", 1003)}
    assert conns.begin("ipv4:127.0.0.1:1001") is None
    conns.end("ipv4:127.0.0.1:1001")
    assert conns.begin("ipv4:127.0.0.1:1002") is None  # a call in flight on it
    assert conns.begin("ipv4:127.0.0.1:1001") is None  # a known connection is not new
    conns.end("ipv4:127.0.0.1:1001")
    refused = conns.begin("ipv4:127.0.0.1:1003")
    assert refused is not None and "max.connections.per.ip" in refused
    established.discard(("127.0.0.1", 1001))  # its client closed it
    now[0] = 5.0
    assert conns.begin("ipv4:127.0.0.1:1003") is None  # the kernel's table freed the place
    assert conns.begin("unix:/tmp/sock") is None  # not counted
    assert conns.begin("ipv6:[::1]:1004") is None  # another address has its own count


def test_established_peers_reads_the_kernel_table(tmp_path: Path) -> None:
    from sluice.broker.security.connections import established_peers, parse_peer

    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    (tmp_path / "tcp").write_text(
        header
        + "   0: 0100007F:2384 0100007F:D431 01 00000000:00000000 00:00000000 00000000  1000        0 1\n"
        + "   1: 0100007F:2384 0100007F:D432 06 00000000:00000000 00:00000000 00000000  1000        0 2\n"
        + "   2: 0100007F:1F90 0100007F:D433 01 00000000:00000000 00:00000000 00000000  1000        0 3\n"
    )
    (tmp_path / "tcp6").write_text(
        header
        + "   0: 00000000000000000000000001000000:2384 00000000000000000000000001000000:D434 01 0:0 0:0 0 0 0 4\n"
        + "   1: 00000000000000000000000001000000:2384 0000000000000000FFFF00000100007F:D435 01 0:0 0:0 0 0 0 5\n"
    )
    found = established_peers(0x2384, tmp_path)
    assert found == {("127.0.0.1", 0xD431), ("::1", 0xD434), ("127.0.0.1", 0xD435)}
    assert established_peers(1, tmp_path / "none") is None
    assert parse_peer("ipv4:10.1.2.3:4567") == ("10.1.2.3", 4567)
    assert parse_peer("ipv6:[fe80::1]:80") == ("fe80::1", 80)
