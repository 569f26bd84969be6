"""The server-side assignor: every partition once, balanced, deterministic, sticky."""

from __future__ import annotations

import itertools
import random

from sluice.broker.group.assignor import assign


def _check_complete(result: dict[str, frozenset[tuple[str, int]]], sizes: dict[str, int]) -> None:
    owned = [tp for tps in result.values() for tp in tps]
    assert len(owned) == len(set(owned)), "a partition was given twice"
    assert set(owned) == {(t, p) for t, n in sizes.items() for p in range(n)}


def test_balanced_for_equal_subscriptions() -> None:
    for members, parts in itertools.product(range(1, 8), range(0, 20)):
        subs = {f"m{i}": ["a", "b"] for i in range(members)}
        sizes = {"a": parts, "b": (parts * 7) % 5}
        result = assign(subs, sizes)
        _check_complete(result, sizes)
        counts = [len(tps) for tps in result.values()]
        assert max(counts) - min(counts) <= 1, (members, parts, counts)


def test_deterministic_whatever_the_input_order() -> None:
    subs = {"b": ["x", "y"], "a": ["y", "x"], "c": ["x", "y"]}
    sizes = {"x": 5, "y": 4}
    first = assign(subs, sizes)
    for _ in range(10):
        items = list(subs.items())
        random.shuffle(items)
        assert assign(dict(items), dict(reversed(sizes.items()))) == first


def test_unknown_topics_and_empty_groups() -> None:
    assert assign({}, {"t": 3}) == {}
    assert assign({"m": ["missing"]}, {"t": 3}) == {"m": frozenset()}


def test_uneven_subscriptions_only_get_their_topics() -> None:
    subs = {"a": ["t1", "t2"], "b": ["t2"]}
    sizes = {"t1": 4, "t2": 4}
    result = assign(subs, sizes)
    _check_complete(result, sizes)
    assert all(t == "t2" for t, _p in result["b"])
    assert len(result["a"]) == len(result["b"]) == 4


def test_sticky_when_a_member_joins() -> None:
    sizes = {"t": 12}
    before = assign({"a": ["t"], "b": ["t"]}, sizes)
    after = assign({"a": ["t"], "b": ["t"], "c": ["t"]}, sizes, before)
    _check_complete(after, sizes)
    assert [len(after[m]) for m in "abc"] == [4, 4, 4]
    assert after["a"] <= before["a"] and after["b"] <= before["b"]  # only the minimum (4) moved


def test_sticky_when_a_member_leaves() -> None:
    sizes = {"t": 7}
    before = assign({"a": ["t"], "b": ["t"], "c": ["t"]}, sizes)
    after = assign({"a": ["t"], "c": ["t"]}, sizes, before)
    _check_complete(after, sizes)
    assert before["a"] <= after["a"] and before["c"] <= after["c"]
    assert abs(len(after["a"]) - len(after["c"])) <= 1


def test_extra_partition_stays_with_the_member_that_had_more() -> None:
    sizes = {"t": 7}
    previous = {"a": frozenset({("t", 0), ("t", 1)}), "b": frozenset({("t", p) for p in range(2, 7)})}
    result = assign({"a": ["t"], "b": ["t"], "c": ["t"]}, sizes, previous)
    _check_complete(result, sizes)
    assert previous["a"] <= result["a"]
    assert len(result["b"] & previous["b"]) == 3  # b keeps the extra slot: 2 moves, not 3


def test_new_partitions_are_spread() -> None:
    before = assign({"a": ["t"], "b": ["t"]}, {"t": 2})
    after = assign({"a": ["t"], "b": ["t"]}, {"t": 6}, before)
    _check_complete(after, {"t": 6})
    assert before["a"] <= after["a"] and before["b"] <= after["b"]
    assert len(after["a"]) == len(after["b"]) == 3
