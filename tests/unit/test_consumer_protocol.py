"""The consumer protocol's bytes read for DescribeGroups, built by hand from Kafka's v0 layout.

ConsumerProtocolSubscription/Assignment v0: int16 version, then an int32-counted array (topic
names; or topics, each an int16-length name and an int32-counted int32 partition list), then the
user data as int32-length bytes (-1: null).
"""

from __future__ import annotations

import struct

from sluice.broker.group.consumer_protocol import assigned_partitions, subscribed_topics


def _str(s: str) -> bytes:
    return struct.pack(">h", len(s)) + s.encode()


def subscription(topics: list[str]) -> bytes:
    return struct.pack(">hi", 0, len(topics)) + b"".join(_str(t) for t in topics) + struct.pack(">i", -1)


def assignment(parts: list[tuple[str, list[int]]], version: int = 0) -> bytes:
    body = b"".join(_str(t) + struct.pack(f">i{len(ps)}i", len(ps), *ps) for t, ps in parts)
    return struct.pack(">hi", version, len(parts)) + body + struct.pack(">i", -1)


def test_a_subscription_and_an_assignment_are_read() -> None:
    assert subscribed_topics(subscription(["orders", "audit"])) == ["orders", "audit"]
    assert assigned_partitions(assignment([("orders", [2, 0]), ("audit", [1])])) == [
        ("audit", 1), ("orders", 0), ("orders", 2),
    ]  # fmt: skip


def test_a_newer_version_is_read_as_the_newest_known_and_garbage_as_nothing() -> None:
    future = assignment([("t", [0])], version=9) + b"fields a later version appends"
    assert assigned_partitions(future) == [("t", 0)]
    assert assigned_partitions(b"") == []  # a member not assigned yet
    assert assigned_partitions(b"\x00") is None and subscribed_topics(b"\xff\xff\x00") is None
    assert subscribed_topics(struct.pack(">hi", 0, 9) + b"abc") is None  # an array longer than its bytes
