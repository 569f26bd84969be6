"""The classic group state machine (broker/sluice_broker/group/classic.py) and its record, clock injected."""

from __future__ import annotations

import itertools

from sluice.api.v1 import records_pb2 as pb
from sluice.broker.group.classic import ClassicGroup, ClassicSettings, ClassicState, JoinInput, JoinResult
from sluice.broker.group.classic_records import ClassicRecordLog, decode_key, encode_key, encode_value
from sluice.records import build_batch

SETTINGS = ClassicSettings(initial_rebalance_delay_ms=100, max_size=3)
SESSION, REBALANCE = 10_000, 30_000


def group() -> ClassicGroup:
    ids = itertools.count(1)
    return ClassicGroup("g", SETTINGS, new_member_id=lambda prefix: f"{prefix}-{next(ids)}")


def join_input(member_id: str = "", protocols: tuple[tuple[str, bytes], ...] = (("range", b"m"),), *,
               instance: str | None = None, client: str = "c", v4: bool = True) -> JoinInput:  # fmt: skip
    return JoinInput(member_id, instance, client, "", SESSION, REBALANCE, "consumer", protocols, v4)


def joined(g: ClassicGroup, now: float, **kw: object) -> str:
    """A new dynamic member through MEMBER_ID_REQUIRED; returns its id (its JoinGroup parked)."""
    mid, result, _ = g.join(join_input(**kw), now)  # type: ignore[arg-type]
    assert result is not None and result.error == pb.MEMBER_ID_REQUIRED and result.member_id == mid
    mid2, result, _ = g.join(join_input(mid, **kw), now)  # type: ignore[arg-type]
    assert mid2 == mid and result is None
    return mid


def test_first_join_waits_the_initial_delay_then_the_leader_gets_every_members_metadata() -> None:
    g = group()
    a = joined(g, 0, protocols=(("range", b"A"), ("roundrobin", b"a")))
    b = joined(g, 50, protocols=(("roundrobin", b"b"), ("range", b"B")))
    assert g.state is ClassicState.PREPARING_REBALANCE
    assert not g.expire(100).joins  # b's join moved the deadline to 150
    fx = g.expire(150)
    assert set(fx.joins) == {a, b} and g.state is ClassicState.COMPLETING_REBALANCE
    ja, jb = fx.joins[a], fx.joins[b]
    assert ja.generation == jb.generation == 1 and ja.leader == jb.leader == a
    # one vote each: the tie goes to the leader's preference
    assert ja.protocol_name == jb.protocol_name == "range"
    assert ja.members == ((a, None, b"A"), (b, None, b"B")) and jb.members == ()


def stable_pair() -> tuple[ClassicGroup, str, str]:
    g = group()
    a, b = joined(g, 0), joined(g, 0)
    g.expire(100)
    for mid in (a, b):
        result, write = g.sync(mid, None, 1, "consumer", "range", {a: b"pa", b: b"pb"} if mid == a else {}, 100)
        assert result is None and write == (mid == a)
    fx = g.assignment_written(1, 101)
    assert fx.syncs[a].assignment == b"pa" and fx.syncs[b].assignment == b"pb"
    assert g.state is ClassicState.STABLE
    return g, a, b


def test_sync_hands_out_the_leaders_assignment_once_written() -> None:
    g, a, b = stable_pair()
    assert g.heartbeat(a, None, 1, 200) == pb.NONE
    assert g.heartbeat(a, None, 0, 200) == pb.ILLEGAL_GENERATION
    assert g.heartbeat("stranger", None, 1, 200) == pb.UNKNOWN_MEMBER_ID
    result, _ = g.sync(b, None, 1, "consumer", "range", {}, 200)  # a late retry: answered at once
    assert result is not None and result.assignment == b"pb"
    result, _ = g.sync(b, None, 1, "consumer", "roundrobin", {}, 200)
    assert result is not None and result.error == pb.INCONSISTENT_GROUP_PROTOCOL


def test_a_new_member_makes_the_others_rejoin_and_a_silent_one_is_removed_at_the_deadline() -> None:
    g, a, b = stable_pair()
    c = joined(g, 1000)
    assert g.state is ClassicState.PREPARING_REBALANCE
    assert g.heartbeat(a, None, 1, 1001) == pb.REBALANCE_IN_PROGRESS
    assert g.check_commit(a, 1, transactional=False) == (pb.NONE, "")  # still generation 1's member
    _, result, fx = g.join(join_input(a), 1002)
    assert result is None and not fx.joins  # b has not rejoined
    assert g.heartbeat(b, None, 1, 25_000) == pb.REBALANCE_IN_PROGRESS  # alive, but does not rejoin
    fx = g.expire(1000 + REBALANCE)
    assert fx.removed == [(b, "did not rejoin within the rebalance timeout")]
    assert set(fx.joins) == {a, c} and fx.joins[a].generation == 2 and fx.joins[a].leader == a
    assert g.check_commit(a, 1, transactional=False)[0] == pb.ILLEGAL_GENERATION
    assert g.check_commit(a, 2, transactional=False)[0] == pb.REBALANCE_IN_PROGRESS  # before SyncGroup
    assert g.check_commit(a, 2, transactional=True) == (pb.NONE, "")  # KIP-447: the transaction fences
    assert g.check_commit("", -1, transactional=False)[0] == pb.UNKNOWN_MEMBER_ID  # outside, group not empty


def test_leave_rebalances_and_the_last_leave_empties_the_group() -> None:
    g, a, b = stable_pair()
    codes, fx = g.leave([(b, None), ("nobody", None)], 300)
    assert codes == [pb.NONE, pb.UNKNOWN_MEMBER_ID] and fx.removed == [(b, "left the group")]
    assert g.state is ClassicState.PREPARING_REBALANCE
    _, result, fx = g.join(join_input(a), 301)  # the only member rejoined: the join phase completes at once
    assert result is None and fx.joins[a].generation == 2 and fx.joins[a].members == ((a, None, b"m"),)
    codes, fx = g.leave([(a, None)], 302)
    assert codes == [pb.NONE] and fx.emptied and g.state is ClassicState.EMPTY and g.is_gone
    assert g.check_commit("", -1, transactional=False) == (pb.NONE, "")


def test_sessions_expire_but_not_while_a_request_is_parked() -> None:
    g, a, b = stable_pair()
    g.heartbeat(a, None, 1, 5000)
    fx = g.expire(101 + SESSION + 1)
    assert fx.removed == [(b, f"no heartbeat within {SESSION} ms")]
    assert g.state is ClassicState.PREPARING_REBALANCE  # a must rejoin; parked, it is not expired
    g.join(join_input(a), 20_000)
    assert [j.generation for j in g.expire(20_000).joins.values()] == []  # already completed by the join
    assert g.state is ClassicState.COMPLETING_REBALANCE and g.generation == 2


def test_inconsistent_protocols_size_limit_and_unknown_member() -> None:
    g, _, _ = stable_pair()
    _, result, _ = g.join(join_input(protocols=(("sticky", b""),)), 0)
    assert result is not None and result.error == pb.INCONSISTENT_GROUP_PROTOCOL
    _, result, _ = g.join(join_input("made-up"), 0)
    assert result is not None and result.error == pb.UNKNOWN_MEMBER_ID
    joined(g, 0)
    _, result, _ = g.join(join_input(), 0)  # max_size 3
    assert result is not None and result.error == pb.GROUP_MAX_SIZE_REACHED


def test_a_static_member_restarting_fences_its_old_member_id() -> None:
    g = group()
    mid, result, _ = g.join(join_input(instance="i-1"), 0)  # static: no MEMBER_ID_REQUIRED
    assert result is None and mid.startswith("i-1-")
    g.expire(100)
    g.sync(mid, "i-1", 1, None, None, {mid: b"x"}, 100)
    g.assignment_written(1, 100)
    # Back with the same protocols in a Stable group (KIP-345): its assignment, no rebalance
    new, result, fx = g.join(join_input(instance="i-1"), 200)
    assert new != mid and result is not None and result.error == pb.NONE
    assert (result.generation, result.leader, result.skip_assignment) == (1, new, True)  # KIP-814
    assert fx.store and g.state is ClassicState.STABLE and g.generation == 1
    assert g.heartbeat(mid, "i-1", 1, 201) == pb.FENCED_INSTANCE_ID
    assert g.members[new].assignment == b"x" and g.leader == new
    synced, write = g.sync(new, "i-1", 1, "consumer", "range", {new: b"ignored"}, 202)
    assert synced is not None and synced.assignment == b"x" and not write
    # the zombie's offset commits are fenced by its instance id; the new member's are not
    assert g.check_commit(mid, 1, transactional=False, instance_id="i-1")[0] == pb.FENCED_INSTANCE_ID
    assert g.check_commit(new, 1, transactional=False, instance_id="i-1")[0] == pb.NONE
    assert g.check_commit(new, 1, transactional=True, instance_id="i-2")[0] == pb.UNKNOWN_MEMBER_ID


def test_a_static_member_back_with_other_protocols_rebalances() -> None:
    g = group()
    mid, _, _ = g.join(join_input(instance="i-1"), 0)
    g.expire(100)
    g.sync(mid, "i-1", 1, None, None, {mid: b"x"}, 100)
    g.assignment_written(1, 100)
    new, result, fx = g.join(join_input(instance="i-1", protocols=(("range", b"new topics"),)), 200)
    assert result is None and not fx.store  # it parks: a rebalance, which its join alone completes
    assert fx.joins[new].generation == 2 and fx.joins[new].members == ((new, "i-1", b"new topics"),)
    assert g.heartbeat(mid, "i-1", 1, 201) == pb.FENCED_INSTANCE_ID


def test_the_record_round_trips_kafkas_group_metadata_value() -> None:
    g, a, b = stable_pair()
    value = encode_value(g, {a: b"pa", b: b"pb"}, 1234)
    assert value[:2] == b"\x00\x03"  # GroupMetadataValue version 3
    assert decode_key(encode_key("g")) == "g" and decode_key(b"\x00\x00\x00\x01g") is None
    log = ClassicRecordLog()
    log.replay(build_batch([(encode_key("g"), value), (encode_key("gone"), value), (encode_key("gone"), None)]))
    [(gid, restored)] = log.groups(SETTINGS, 5000).items()
    assert gid == "g" and restored.state is ClassicState.STABLE and restored.generation == 1
    assert restored.leader == a and restored.protocol_name == "range"
    assert [(m.member_id, m.assignment, m.metadata("range")) for m in restored.members.values()] == [
        (a, b"pa", b"m"),
        (b, b"pb", b"m"),
    ]
    assert restored.heartbeat(b, None, 1, 5001) == pb.NONE


def test_a_join_answer_for_a_retry_in_completing_rebalance_is_the_same() -> None:
    g = group()
    a = joined(g, 0)
    first = g.expire(100).joins[a]
    _, again, _ = g.join(join_input(a), 101)
    assert isinstance(again, JoinResult) and again == first
