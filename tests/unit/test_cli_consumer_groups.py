"""``sluice consumer-groups``' pure parts: the reset plan (Kafka's clamping), the --topic scope, usage
errors, and the group state the broker reports (KIP-848's names)."""

from __future__ import annotations

import argparse

import pytest

from sluice import cli
from sluice.broker.group.admin import group_state
from sluice.broker.group.membership import ConsumerGroup, GroupSettings, HeartbeatInput
from sluice.cli.consumer_groups import datetime_ms, duration_ms, parse_topic_scope, plan_reset
from sluice.cli.exits import CliError
from sluice.client import TopicPartition

A, B = TopicPartition("t", 0), TopicPartition("t", 1)
EARLIEST = {A: 2, B: 0}
LATEST = {A: 10, B: 5}


def test_reset_plans_are_clamped_to_each_partitions_range() -> None:
    committed = {A: 6, B: 1}
    assert plan_reset([A, B], committed, EARLIEST, LATEST, to_earliest=True) == {A: 2, B: 0}
    assert plan_reset([A, B], committed, EARLIEST, LATEST, to_latest=True) == {A: 10, B: 5}
    assert plan_reset([A, B], committed, EARLIEST, LATEST, to_offset=7) == {A: 7, B: 5}
    assert plan_reset([A, B], committed, EARLIEST, LATEST, to_offset=0) == {A: 2, B: 0}
    assert plan_reset([A, B], committed, EARLIEST, LATEST, shift_by=-3) == {A: 3, B: 0}
    assert plan_reset([A, B], committed, EARLIEST, LATEST, shift_by=100) == {A: 10, B: 5}


def test_shifting_a_partition_without_a_committed_offset_is_an_error() -> None:
    with pytest.raises(CliError, match="t-1 has no committed offset"):
        plan_reset([A, B], {A: 3}, EARLIEST, LATEST, shift_by=1)


def test_topic_scope() -> None:
    assert parse_topic_scope("orders") == ("orders", None)
    assert parse_topic_scope("orders:0,2") == ("orders", [0, 2])
    for bad in (":1", "orders:x", "orders:", "orders:-1"):
        with pytest.raises(CliError) as exc:
            parse_topic_scope(bad)
        assert exc.value.code == 2


@pytest.mark.parametrize(
    "argv",
    [
        ["consumer-groups", "reset-offsets", "g", "--to-earliest"],  # no scope
        ["consumer-groups", "reset-offsets", "g", "--all-topics"],  # no target
        ["consumer-groups", "reset-offsets", "g", "--all-topics", "--to-earliest", "--to-latest"],
        ["consumer-groups", "reset-offsets", "g", "--all-topics", "--to-earliest", "--dry-run", "--execute"],
        ["consumer-groups", "reset-offsets", "g", "--all-topics", "--to-offset", "x"],
        ["consumer-groups", "describe", "g", "--members", "--state"],
        ["consumer-groups", "delete"],
        ["transactions", "list", "--duration-filter", "-1"],
    ],
)
def test_bad_usage_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    assert "sluice" in capsys.readouterr().err


def test_group_state_follows_the_members() -> None:
    group = ConsumerGroup("g", GroupSettings(), new_member_id=lambda: "m1")
    assert group_state(None) == "Empty" and group_state(group) == "Empty"
    joined = group.heartbeat(HeartbeatInput("", 0, ("t",)), {"t": 2}, now=0)
    assert group_state(group) == "Stable"  # the only member was answered its whole target at once
    group.members[joined.member_id].assigned.clear()  # as if the member had not yet been given its target
    assert group_state(group) == "Reconciling"


def test_top_screen_is_bounded_and_says_what_it_left_out() -> None:
    from sluice.cli.top import Screen, render

    screen = Screen(
        cluster_id="c1",
        brokers=[(0, "h:1"), (1, "h:2"), (2, "h:3")],
        leaders={0: 4, 1: 3},
        partitions=8,
        under_replicated=[("t", p, [0, 1, 2], [0, 1]) for p in range(5)],
        offline=[("t", 7)],
        open_transactions=[("tx", "Ongoing", 12.34, 1)],
        open_total=1,
        groups=[],
        groups_total=0,
        errors=["group g: COORDINATOR_NOT_AVAILABLE"],
    )
    text = render(screen, rows=3)
    assert "brokers 3  partitions 8  under-replicated 5  offline 1  open transactions 1  groups 0" in text
    assert "  ... and 3 more" in text  # 6 problem partitions, 3 shown, the offline one first
    problems = text.split("UNDER-REPLICATED / OFFLINE PARTITIONS\n")[1].splitlines()
    assert problems[1].split() == ["t-7", "offline", "-", "-"]
    assert "12.3s" in text and "(none)" in text and "COORDINATOR_NOT_AVAILABLE" in text
    rows = [line.split() for line in text.split("BROKERS\n")[1].splitlines()[1:4]]
    assert [r[2:4] for r in rows] == [["-", "4"], ["-", "3"], ["-", "0"]]  # STATUS: not checked, LEADERS


def test_top_says_which_brokers_are_gone() -> None:
    """Metadata lists every registered broker; the health check's answer says which are down."""
    from sluice.cli.top import Screen, render

    screen = Screen("c1", [(0, "h:1"), (1, "h:2"), (2, "h:3")], {0: 2, 2: 1}, 3, [], [], [], 0, [], 0,
                    health={0: "SERVING", 1: "UNREACHABLE", 2: "NOT_SERVING"})  # fmt: skip
    text = render(screen, rows=5)
    assert "brokers 3 (2 not serving)" in text
    rows = [line.split() for line in text.split("BROKERS\n")[1].splitlines()[1:4]]
    assert [r[2] for r in rows] == ["up", "DOWN", "not"]  # "not serving"


@pytest.mark.parametrize("argv", [["top", "--interval", "0"], ["top", "--rows", "0"], ["top", "--iterations", "0"]])
def test_top_bad_usage_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2


def test_top_keeps_refreshing_when_a_refresh_fails(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A refresh the cluster does not answer is one line, and the next refresh tries again."""
    from sluice import errors
    from sluice.cli import top

    class NoAdmin:
        def close(self) -> None:
            pass

    answers: list[Exception | None] = [errors.BrokerNotAvailableError("every broker is down"), None]

    def gather(admin: object, rows: int, *_health: object) -> top.Screen:
        exc = answers.pop(0)
        if exc is not None:
            raise exc
        return top.Screen("c1", [(0, "h:1")], {0: 1}, 1, [], [], [], 0, [], 0)

    monkeypatch.setattr(top, "open_admin", lambda connection: NoAdmin())
    monkeypatch.setattr(top, "connection", lambda args: "h:1")
    monkeypatch.setattr(top, "gather", gather)
    assert cli.main(["top", "--iterations", "2", "--interval", "0.01"]) == 0
    out = capsys.readouterr().out
    assert "the cluster did not answer: BrokerNotAvailableError: every broker is down" in out
    assert "cluster c1" in out and not answers


def test_reset_by_time_takes_each_partitions_first_offset_at_the_time_or_the_end() -> None:
    assert plan_reset([A, B], {}, EARLIEST, LATEST, by_time={A: 6, B: -1}) == {A: 6, B: 5}
    assert plan_reset([A, B], {}, EARLIEST, LATEST, by_time={A: 0}) == {A: 2, B: 5}  # clamped; B: none found


def test_durations_and_datetimes_as_kafkas_tool_writes_them() -> None:
    assert duration_ms("PT30M") == 1_800_000 and duration_ms("P1DT2H") == 93_600_000 and duration_ms("pt0.5s") == 500
    for bad in ("P", "PT", "30M", "P1H", "-PT1M"):
        with pytest.raises(argparse.ArgumentTypeError):
            duration_ms(bad)
    assert datetime_ms("1970-01-01T00:00:01Z") == 1000
    assert datetime_ms("1970-01-01T01:00:01.500+01:00") == 1500
    with pytest.raises(argparse.ArgumentTypeError):
        datetime_ms("yesterday")
