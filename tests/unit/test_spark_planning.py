"""Driver-side planning helpers: range splitting (Spark's Kafka rule), rate limits, offset JSON."""

from __future__ import annotations

import itertools
import pickle

from sluice.client import TopicPartition
from sluice.spark.planning import OffsetRange, from_json, rate_limit, split_ranges, to_json

A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)


def _covers(pieces: list[OffsetRange], ranges: list[OffsetRange]) -> bool:
    for r in ranges:
        mine = sorted((p.start, p.end) for p in pieces if (p.topic, p.partition) == (r.topic, r.partition))
        if r.size == 0:
            if mine:
                return False
            continue
        if mine[0][0] != r.start or mine[-1][1] != r.end:
            return False
        if any(a[1] != b[0] for a, b in itertools.pairwise(mine)):
            return False
    return True


def test_split_keeps_small_reads_whole_and_cuts_big_ranges_in_proportion() -> None:
    ranges = [OffsetRange("a", 0, 0, 900), OffsetRange("a", 1, 10, 110), OffsetRange("b", 0, 5, 5)]
    assert split_ranges(ranges, None, None) == ranges[:2]  # empty ranges are no task
    assert split_ranges(ranges, 2, None) == ranges[:2]  # already enough tasks
    pieces = split_ranges(ranges, 10, None)
    assert len(pieces) >= 10 and _covers(pieces, ranges)
    assert sum(1 for p in pieces if p.partition == 0) > sum(1 for p in pieces if p.partition == 1)
    capped = split_ranges(ranges, None, 100)
    assert max(p.size for p in capped) <= 100 and _covers(capped, ranges)
    assert split_ranges([OffsetRange("a", 0, 0, 3)], 10, None) == [
        OffsetRange("a", 0, 0, 1), OffsetRange("a", 0, 1, 2), OffsetRange("a", 0, 2, 3)
    ]  # fmt: skip


def test_rate_limit_shares_in_proportion_and_never_passes_the_latest() -> None:
    start = {A0: 0, A1: 100}
    latest = {A0: 1000, A1: 200, B0: 50}  # B0 is new: not in start, nothing counted for it
    assert rate_limit(start, latest, 10_000) == latest
    limited = rate_limit(start, latest, 110)
    assert limited[A0] == 100 and limited[A1] == 110 and limited[B0] == 50
    tiny = rate_limit({A0: 0, A1: 0}, {A0: 1000, A1: 1}, 5)
    assert tiny == {A0: 4, A1: 1}  # a share below one record rounds up, as Spark's Kafka source does


def test_offsets_json_round_trip_and_ranges_pickle() -> None:
    offsets = {A1: 7, A0: 3, B0: 0}
    assert to_json(offsets) == {"a": {"0": 3, "1": 7}, "b": {"0": 0}}
    assert from_json(to_json(offsets)) == offsets
    r = OffsetRange("a", 1, 5, 9)
    assert pickle.loads(pickle.dumps(r)) == r and r.size == 4
