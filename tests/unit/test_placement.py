"""Replica placement (sluice.metadata.placement): spread, racks, determinism, errors."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from sluice.metadata.placement import place_replicas


def no_racks(*ids: int) -> list[tuple[int, str | None]]:
    return [(i, "") for i in ids]


def test_three_brokers_rf3_matches_kafka_layout() -> None:
    assert place_replicas(no_racks(0, 1, 2), 6, 3) == [
        [0, 1, 2],
        [1, 2, 0],
        [2, 0, 1],
        [0, 2, 1],  # the follower shift moves after every n partitions
        [1, 0, 2],
        [2, 1, 0],
    ]


@pytest.mark.parametrize(("n", "partitions", "rf"), [(1, 5, 1), (3, 50, 3), (4, 10, 2), (5, 7, 3), (6, 60, 4)])
def test_replicas_distinct_and_leaders_even(n: int, partitions: int, rf: int) -> None:
    placement = place_replicas(no_racks(*range(n)), partitions, rf)
    assert len(placement) == partitions
    for replicas in placement:
        assert len(replicas) == rf and len(set(replicas)) == rf
        assert set(replicas) <= set(range(n))
    leaders = Counter(r[0] for r in placement)
    assert max(leaders.values()) - min(leaders.get(b, 0) for b in range(n)) <= 1
    # every broker carries about the same number of replicas too
    load = Counter(itertools.chain.from_iterable(placement))
    assert max(load.values()) - min(load.get(b, 0) for b in range(n)) <= rf


def test_followers_of_one_broker_spread_over_the_others() -> None:
    """When a broker dies its partitions' new leaders are not all one neighbour."""
    placement = place_replicas(no_racks(0, 1, 2, 3), 12, 2)
    successors = {r[1] for r in placement if r[0] == 0}
    assert successors == {1, 2, 3}


def test_deterministic_and_independent_of_input_order() -> None:
    a = place_replicas([(2, ""), (0, ""), (1, "")], 9, 2)
    b = place_replicas([(0, ""), (1, ""), (2, "")], 9, 2)
    assert a == b == place_replicas([(0, ""), (1, ""), (2, "")], 9, 2)


def test_start_partition_continues_the_pattern() -> None:
    brokers = no_racks(0, 1, 2, 3)
    whole = place_replicas(brokers, 10, 3)
    assert place_replicas(brokers, 4, 3) + place_replicas(brokers, 6, 3, start_partition=4) == whole


def test_non_contiguous_broker_ids() -> None:
    placement = place_replicas(no_racks(10, 20, 7), 3, 2)
    assert [r[0] for r in placement] == [7, 10, 20]
    assert all(set(r) <= {7, 10, 20} for r in placement)


def test_rack_aware_puts_replicas_on_distinct_racks() -> None:
    brokers = [(0, "a"), (1, "a"), (2, "b"), (3, "b"), (4, "c"), (5, "c")]
    placement = place_replicas(brokers, 30, 3)
    rack = dict(brokers)
    for replicas in placement:
        assert len({rack[b] for b in replicas}) == 3, replicas
    leaders = Counter(r[0] for r in placement)
    assert set(leaders.values()) == {5}


def test_rack_aware_uses_every_rack_before_repeating_one() -> None:
    brokers = [(0, "a"), (1, "a"), (2, "a"), (3, "b")]
    rack = dict(brokers)
    for replicas in place_replicas(brokers, 8, 3):
        assert {rack[b] for b in replicas} == {"a", "b"}, replicas
        assert len(set(replicas)) == 3
    for replicas in place_replicas(brokers, 8, 2):
        assert {rack[b] for b in replicas} == {"a", "b"}, replicas


def test_rackless_brokers_count_as_one_rack_when_others_have_racks() -> None:
    brokers: list[tuple[int, str | None]] = [(0, "a"), (1, None), (2, ""), (3, "b")]
    rack = {b: r or "" for b, r in brokers}
    for replicas in place_replicas(brokers, 8, 3):
        assert len({rack[b] for b in replicas}) == 3


def test_replication_factor_larger_than_brokers_is_refused() -> None:
    with pytest.raises(ValueError, match="replication factor 3 is larger than the 2 available broker"):
        place_replicas(no_racks(0, 1), 1, 3)
    with pytest.raises(ValueError, match="larger than the 0 available"):
        place_replicas([], 1, 1)


@pytest.mark.parametrize(
    ("brokers", "partitions", "rf", "start"),
    [(no_racks(0), 1, 0, 0), (no_racks(0), -1, 1, 0), (no_racks(0), 1, 1, -2), (no_racks(0, 0), 1, 1, 0)],
)
def test_bad_arguments(brokers: list[tuple[int, str | None]], partitions: int, rf: int, start: int) -> None:
    with pytest.raises(ValueError):
        place_replicas(brokers, partitions, rf, start)


def test_zero_partitions_is_empty() -> None:
    assert place_replicas(no_racks(0, 1), 0, 2) == []
