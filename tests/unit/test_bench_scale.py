"""bench/scale.py's growth naming and bench/compare_kafka.py's scaled set and file names (pure parts)."""

from __future__ import annotations

import pytest

from bench import scale
from bench.compare_kafka import results_stem, the_set


def test_growth_names_the_curve_from_its_ends() -> None:
    assert scale.growth([3, 300, 3000], [100.0, 99.0, 98.0]).startswith("flat")
    assert scale.growth([1, 16, 64], [10.0, 150.0, 660.0]).startswith("linear")
    assert scale.growth([1, 100], [1.0, 10.0]).startswith("sub-linear")
    assert scale.growth([1, 10], [1.0, 1000.0]).startswith("worse than linear")
    assert scale.growth([3, 3000], [100.0, 10.0]).startswith("falls")
    assert scale.growth([3, 300], [62.0, 26.8]).startswith("falls")  # x0.43 over x100 is not "flat"
    assert scale.growth([5], [1.0]) == "n/a"
    assert scale.growth([1, 2], [0.0, 1.0]) == "n/a"  # a zero cannot be put on a log scale


def test_scale_table_marks_busy_and_failed_points() -> None:
    pts = [scale.Point("partitions", "sluice", 3, {"produce_mb_s": 100.0}),
           scale.Point("partitions", "sluice", 300, {"produce_mb_s": 90.0}, valid=False, reasons=["busy"]),
           scale.Point("partitions", "kafka", 3, {}, valid=False, error="boom")]  # fmt: skip
    md = scale.table(pts)
    assert "| partitions | sluice | 3 | 100 | 0.0 | yes |" in md
    assert "| partitions | sluice | 300 | 90 | 0.0 | NO (busy) |" in md
    assert "NO (failed)" in md
    assert "- sluice produce_mb_s: flat (x0.90 for x100 size" in md


def test_compare_set_matches_run_all_counts() -> None:
    full = {s.name: s for s in the_set(1.0)}
    assert full["produce-1KiB-acks-all"].count == 200_000
    assert full["produce-100B-acks-all"].count == 500_000 and full["produce-100B-acks-all"].record_size == 100
    assert full["transactions-1KiB-100ms"].commit_interval_ms == 100
    assert full["latency-10MBps-1KiB"].seconds == 30.0
    quick = {s.name: s for s in the_set(0.1)}
    assert quick["consume-read_committed-1KiB"].count == 20_000 and quick["latency-10MBps-1KiB"].seconds == 5.0
    assert {s.count for s in the_set(0.0001) if s.kind != "latency"} == {1000}  # never below 1,000 records


def test_a_failed_point_is_recorded_not_raised_and_a_busy_start_spoils_every_point(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bench import verdict

    # What other processes did meanwhile is not under test: on a loaded machine a point of a few
    # microseconds can see a whole 10 ms /proc/stat tick of foreign CPU (a share above 100%).
    monkeypatch.setattr(verdict, "judge_run", lambda load, limits: verdict.Verdict())
    judge = scale.Judge(verdict.Limits(max_foreign_share=1.0, max_start_load_per_cpu=1000.0))
    ok = scale.Point("x", "sluice", 1)
    with judge.point(ok):
        ok.figures["f"] = 1.0
    assert ok.valid and not ok.error and ok.figures == {"f": 1.0}
    bad = scale.Point("x", "sluice", 2)
    with judge.point(bad):
        raise RuntimeError("broker died")
    assert not bad.valid and bad.error == "RuntimeError: broker died"
    judge.start = verdict.judge_start(99.0, cpus=2)
    busy = scale.Point("x", "sluice", 3)
    with judge.point(busy):
        pass
    assert not busy.valid and "99.00" in busy.reasons[0]


def test_wait_quiet_waits_for_the_load_to_decay_and_gives_up_at_its_deadline() -> None:
    from bench import verdict

    limits = verdict.Limits(max_start_load_per_cpu=0.5)  # 1.0 on two cores
    now = [0.0]
    loads = iter([3.0, 2.0, 1.4, 0.9, 0.5])
    said: list[str] = []

    def sleep(s: float) -> None:
        now[0] += s

    def load() -> tuple[float, float, float]:
        return next(loads), 0.0, 0.0

    got = verdict.wait_quiet(limits, 2, 600, loadavg=load, sleep=sleep, clock=lambda: now[0], say=said.append)
    assert got == 0.9 and now[0] == 15.0  # three 5 s waits, stopped at the first load under 1.0
    assert said and "load average 3.00, limit 1.00" in said[0]

    now[0] = 0.0
    busy = verdict.wait_quiet(
        limits, 2, 12, loadavg=lambda: (4.0, 0.0, 0.0), sleep=sleep, clock=lambda: now[0], say=said.append
    )
    assert busy == 4.0 and now[0] == 12.0  # never past the deadline; the caller's verdict says "not valid"
    assert verdict.judge_start(busy, 2, limits).valid is False
    assert verdict.wait_quiet(limits, 2, 0, loadavg=lambda: (4.0, 0.0, 0.0), sleep=sleep, clock=lambda: 0.0) == 4.0


def test_catchup_rounds_alternate_the_order_and_each_is_judged_from_its_own_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bench import verdict

    order: list[tuple[int, str]] = []
    judged_by: list[scale.Judge] = []

    def point(system: str, run: int, judge: scale.Judge) -> scale.Point:
        order.append((run, system))
        judged_by.append(judge)
        return scale.Point("catchup", system, 2.0, {"catchup_mb_s": 100.0}, run=run)

    waits: list[float] = []
    judges: list[scale.Judge] = []

    def new_judge(self: scale.Judge, limits: verdict.Limits) -> None:
        self.limits, self.cpus = limits, 2
        judges.append(self)

    monkeypatch.setattr(scale, "_sluice_catchup", lambda gb, judge, tools, run: point("sluice", run, judge))
    monkeypatch.setattr(scale, "_kafka_catchup", lambda gb, judge, run: point("kafka", run, judge))
    monkeypatch.setattr(verdict, "wait_quiet", lambda limits, cpus, timeout_s: waits.append(timeout_s) or 0.0)
    monkeypatch.setattr(scale.Judge, "__init__", new_judge)
    points = scale.catchup_rounds(2.0, scale.Judge(verdict.Limits()), True, False, rounds=3, quiet_s=60.0)
    assert order == [(1, "sluice"), (1, "kafka"), (2, "kafka"), (2, "sluice"), (3, "sluice"), (3, "kafka")]
    assert waits == [60.0, 60.0] and len(judges) == 3  # no wait before the first round; a new judge after
    assert [p.run for p in points] == [1, 1, 2, 2, 3, 3]
    assert judged_by == [judges[0], judges[0], judges[1], judges[1], judges[2], judges[2]]  # each round its own


def test_rounds_get_a_run_column_and_medians_of_the_valid_ones_only() -> None:
    pts = [scale.Point("catchup", "sluice", 2, {"catchup_mb_s": 400.0}, run=1),
           scale.Point("catchup", "kafka", 2, {"catchup_mb_s": 500.0}, run=1),
           scale.Point("catchup", "kafka", 2, {"catchup_mb_s": 520.0}, run=2),
           scale.Point("catchup", "sluice", 2, {"catchup_mb_s": 100.0}, valid=False, run=2)]  # fmt: skip
    md = scale.table(pts)
    assert "| catchup | sluice | 2 | 2 | 100 | 0.0 | NO (busy) |" in md
    assert "- size 2, catchup_mb_s: sluice 400 (1 valid), kafka 510 (2 valid); Sluice/Kafka 0.78" in md
    assert "Growth from" not in md  # one size: no curve to name
    none_valid = [scale.Point("catchup", "sluice", 2, {"catchup_mb_s": 1.0}, valid=False, run=r) for r in (1, 2)]
    assert "- none: no round was valid" in scale.table(none_valid)
    assert "| run |" not in scale.table(pts[:2])  # a single round keeps the table as it was


def test_rounds_are_valid_when_each_system_has_a_valid_round_at_every_size() -> None:
    one_busy = [scale.Point("catchup", "sluice", 2, run=1, valid=False), scale.Point("catchup", "sluice", 2, run=2),
                scale.Point("catchup", "kafka", 2, run=1), scale.Point("catchup", "kafka", 2, run=2)]  # fmt: skip
    valid, text = scale.verdict_of(one_busy)
    assert valid and "sluice 1 of 2, kafka 2 of 2" in text
    no_kafka = [*one_busy[:2], *(scale.Point("catchup", "kafka", 2, run=r, valid=False) for r in (1, 2))]
    valid, text = scale.verdict_of(no_kafka)
    assert not valid and text.startswith("NOT VALID (a system without a valid round)") and "kafka 0 of 2" in text
    assert scale.verdict_of(one_busy[:1]) == (False, "NOT VALID (busy machine or a failed point)")  # one round


def test_a_comparison_that_is_not_valid_never_replaces_the_measurement_the_docs_quote() -> None:
    assert results_stem(1, False, False, False, True) == "kafka-compare-1broker"
    assert results_stem(3, True, True, False, True) == "kafka-compare-3broker-kafka-tools-kafka-tls"
    assert results_stem(3, False, False, False, False) == "kafka-compare-3broker-not-valid"
    assert results_stem(1, True, False, True, False) == "kafka-compare-1broker-kafka-tools-smoke"
