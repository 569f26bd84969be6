"""bench/verdict.py: when a run is called valid and when the machine was busy."""

from __future__ import annotations

import pytest

from bench import verdict


def test_quiet_run_is_valid() -> None:
    load = verdict.RunLoad(wall_s=10.0, machine_busy_s=15.0, own_cpu_s=14.5, cpus=2)
    assert load.foreign_share == pytest.approx(0.025)
    assert verdict.judge_run(load).valid


def test_run_with_other_work_is_not_valid_and_says_why() -> None:
    # the benchmark used 10 CPU s, the machine 16: 6 CPU s of others over 20 CPU s of capacity = 30%
    load = verdict.RunLoad(wall_s=10.0, machine_busy_s=16.0, own_cpu_s=10.0, cpus=2)
    v = verdict.judge_run(load)
    assert not v.valid
    assert "30%" in v.reasons[0] and "busy" in v.reasons[0]


def test_sampling_skew_never_makes_foreign_cpu_negative() -> None:
    load = verdict.RunLoad(wall_s=1.0, machine_busy_s=1.0, own_cpu_s=1.2, cpus=2)
    assert load.foreign_cpu_s == 0.0
    assert verdict.judge_run(load).valid


def test_start_load_limit_is_per_cpu() -> None:
    assert verdict.judge_start(0.9, cpus=2).valid  # limit 0.5 x 2 = 1.0
    busy = verdict.judge_start(8.0, cpus=2)
    assert not busy.valid and "8.00" in busy.text()


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError):
        verdict.Limits(max_foreign_share=0)
    with pytest.raises(ValueError):
        verdict.Limits(max_start_load_per_cpu=-1)
    strict = verdict.Limits(max_foreign_share=0.01)
    load = verdict.RunLoad(wall_s=10.0, machine_busy_s=10.5, own_cpu_s=10.0, cpus=2)  # 2.5%
    assert verdict.judge_run(load).valid and not verdict.judge_run(load, strict).valid


def test_merge_keeps_every_reason_once() -> None:
    a, b = verdict.Verdict(), verdict.Verdict()
    a.add("x")
    b.add("x")
    b.add("y")
    m = a.merge(b)
    assert not m.valid and m.reasons == ["x", "y"]
