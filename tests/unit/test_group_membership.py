"""Membership: joins, epochs, hand-over only after release, fencing, sessions (fake clock)."""

from __future__ import annotations

from sluice.api.v1 import records_pb2 as pb
from sluice.broker.group.membership import ConsumerGroup, GroupSettings, HeartbeatInput, HeartbeatResult

TP = tuple[str, int]
SETTINGS = GroupSettings(
    session_timeout_ms=3000,
    min_session_timeout_ms=1000,
    max_session_timeout_ms=10_000,
    heartbeat_interval_ms=200,
    rebalance_timeout_ms=5000,
)
TOPICS = {"t": 4}


class Harness:
    """A group, a fake clock and the topic sizes, with one-line heartbeats."""

    def __init__(self, topics: dict[str, int] | None = None) -> None:
        self.group = ConsumerGroup("g", SETTINGS)
        self.now = 0.0
        self.topics = dict(topics or TOPICS)

    def hb(
        self,
        member_id: str,
        epoch: int,
        owned: set[TP] | frozenset[TP] | tuple[TP, ...] = (),
        subscription: tuple[str, ...] | None = None,
        session: int = 0,
    ) -> HeartbeatResult:
        return self.group.heartbeat(
            HeartbeatInput(member_id, epoch, subscription, frozenset(owned), session), self.topics, self.now
        )

    def join(self, member_id: str, topics: tuple[str, ...] = ("t",)) -> HeartbeatResult:
        result = self.hb(member_id, 0, subscription=topics)
        assert result.error == pb.NONE
        return result

    def settle(self, states: dict[str, HeartbeatResult], rounds: int = 6) -> dict[str, HeartbeatResult]:
        """Every member heartbeats, owning exactly what it was last given, until nothing changes."""
        for _ in range(rounds):
            for member_id in sorted(states):
                last = states[member_id]
                states[member_id] = self.hb(member_id, last.member_epoch, set(last.assignment))
                assert states[member_id].error == pb.NONE
        return states


def test_join_assigns_an_id_an_epoch_and_everything() -> None:
    h = Harness()
    result = h.hb("", 0, subscription=("t",))
    assert result.error == pb.NONE
    assert result.member_id and result.member_epoch == 1
    assert result.assignment == (("t", 0), ("t", 1), ("t", 2), ("t", 3))


def test_partition_moves_only_after_the_previous_owner_released_it() -> None:
    h = Harness()
    a = h.join("a")
    assert len(a.assignment) == 4
    b = h.join("b")
    assert b.member_epoch == 2
    assert b.assignment == ()  # a still holds everything
    # a heartbeats still owning all four: told to keep only its target.
    a = h.hb("a", a.member_epoch, set(a.assignment))
    assert a.member_epoch == 2 and len(a.assignment) == 2
    kept = set(a.assignment)
    # b asks again before a released anything: still nothing (a reported owning 4).
    b = h.hb("b", b.member_epoch)
    assert b.assignment == ()
    # a revokes, reports only what it kept: now b gets the rest.
    a = h.hb("a", a.member_epoch, kept)
    b = h.hb("b", b.member_epoch)
    assert set(b.assignment) == {("t", p) for p in range(4)} - kept


def test_no_partition_is_ever_owned_twice_during_churn() -> None:
    h = Harness({"t": 10})
    states = {m: h.join(m) for m in ("a", "b", "c")}
    for step in range(30):
        if step == 10:
            states["d"] = h.join("d")
        if step == 20:
            states.pop("b")
            assert h.hb("b", -1).error == pb.NONE
        for member_id in sorted(states):
            last = states[member_id]
            states[member_id] = h.hb(member_id, last.member_epoch, set(last.assignment))
            given = [tp for s in states.values() for tp in s.assignment]
            assert len(given) == len(set(given)), f"step {step}: {states}"
    final = [tp for s in states.values() for tp in s.assignment]
    assert sorted(final) == [("t", p) for p in range(10)]
    counts = sorted(len(s.assignment) for s in states.values())
    assert counts[-1] - counts[0] <= 1


def test_leave_frees_partitions_at_once() -> None:
    h = Harness()
    states = h.settle({"a": h.join("a"), "b": h.join("b")})
    epoch = h.group.epoch
    left = h.hb("a", -1)
    assert left.member_epoch == -1 and "a" not in h.group.members
    assert h.group.epoch > epoch
    b = h.hb("b", states["b"].member_epoch, set(states["b"].assignment))
    assert len(b.assignment) == 4
    assert h.hb("a", -1).error == pb.UNKNOWN_MEMBER_ID


def test_stale_epoch_is_fenced_and_removed() -> None:
    h = Harness()
    a = h.join("a")
    h.join("b")  # bumps the group epoch to 2
    a2 = h.hb("a", a.member_epoch, set(a.assignment))
    assert a2.member_epoch == 2
    # epoch 1 again with partitions it no longer has: a zombie, fenced.
    fenced = h.hb("a", 0 + 1, {("t", 0), ("t", 1), ("t", 2), ("t", 3)})
    assert a2.assignment != a.assignment
    assert fenced.error == pb.FENCED_MEMBER_EPOCH
    assert "a" not in h.group.members
    assert h.hb("a", 2).error == pb.UNKNOWN_MEMBER_ID
    # an epoch from the future is fenced too
    b = h.group.members["b"]
    assert h.hb("b", b.epoch + 5).error == pb.FENCED_MEMBER_EPOCH


def test_lost_response_previous_epoch_is_accepted_if_nothing_was_revoked() -> None:
    h = Harness({"t": 4, "u": 1})
    a = h.join("a", ("t",))
    b = h.join("b", ("u",))  # epoch 2; a keeps all of t
    lost = h.hb("a", a.member_epoch, set(a.assignment))  # the answer (epoch 2) never arrives
    assert lost.member_epoch == 2 and lost.assignment == a.assignment
    retry = h.hb("a", a.member_epoch, set(a.assignment))  # again with epoch 1: accepted
    assert retry.error == pb.NONE and retry.member_epoch == 2
    # same situation, but the lost answer revoked partitions a still reports: fenced
    h.hb("b", b.member_epoch, subscription=("t", "u"))  # epoch 3: a must give up some of t
    lost = h.hb("a", 2, set(a.assignment))
    assert lost.member_epoch == 3 and len(lost.assignment) < 4
    assert h.hb("a", 2, set(a.assignment)).error == pb.FENCED_MEMBER_EPOCH


def test_unknown_member_and_invalid_requests() -> None:
    h = Harness()
    assert h.hb("nobody", 3).error == pb.UNKNOWN_MEMBER_ID
    assert h.hb("", -2).error == pb.INVALID_REQUEST
    assert h.hb("", 0, subscription=("t",), session=10).error == pb.INVALID_SESSION_TIMEOUT
    assert h.hb("", 0, subscription=("t",), session=999_999).error == pb.INVALID_SESSION_TIMEOUT
    assert h.group.is_empty


def test_session_expiry_with_a_fake_clock_moves_partitions() -> None:
    h = Harness()
    states = h.settle({"a": h.join("a"), "b": h.join("b")})
    h.now += 2000
    states["b"] = h.hb("b", states["b"].member_epoch, set(states["b"].assignment))
    assert h.group.expire(h.topics, h.now) == []
    h.now += 1500  # a: 3500 ms without a heartbeat (timeout 3000); b: 1500
    removed = h.group.expire(h.topics, h.now)
    assert [m for m, _ in removed] == ["a"]
    b = h.hb("b", states["b"].member_epoch, set(states["b"].assignment))
    assert len(b.assignment) == 4
    assert h.hb("a", states["a"].member_epoch).error == pb.UNKNOWN_MEMBER_ID


def test_member_session_timeout_from_the_request() -> None:
    h = Harness()
    h.hb("a", 0, subscription=("t",), session=1000)
    h.now += 1001
    assert [m for m, _ in h.group.expire(h.topics, h.now)] == ["a"]


def test_member_that_never_revokes_is_removed_after_rebalance_timeout() -> None:
    h = Harness()
    a = h.join("a")
    h.join("b")
    stubborn = set(a.assignment)
    for _ in range(3):
        h.now += 1000
        a = h.hb("a", a.member_epoch, stubborn)  # keeps reporting all four
        assert h.group.expire(h.topics, h.now) == []
    h.now += 3500  # 5500 ms after it was first told to revoke (rebalance timeout 5000)
    h.hb("a", a.member_epoch, stubborn)
    h.hb("b", h.group.members["b"].epoch)
    assert [m for m, _ in h.group.expire(h.topics, h.now)] == ["a"]


def test_subscription_and_metadata_changes_recompute_the_target() -> None:
    h = Harness({"t": 2, "u": 2})
    a = h.join("a", ("t",))
    assert set(a.assignment) == {("t", 0), ("t", 1)}
    a = h.hb("a", a.member_epoch, set(a.assignment), subscription=("t", "u"))
    assert a.member_epoch == 2 and len(a.assignment) == 4
    h.topics["u"] = 3  # a partition added
    a = h.hb("a", a.member_epoch, set(a.assignment))
    assert a.member_epoch == 3 and ("u", 2) in a.assignment
    h.topics["v"] = 1  # an unrelated topic: nothing changes
    a = h.hb("a", a.member_epoch, set(a.assignment))
    assert a.member_epoch == 3
    a = h.hb("a", a.member_epoch, set(a.assignment), subscription=("u",))
    assert {t for t, _ in a.assignment} == {"u"}


def test_rejoin_with_the_same_id_replaces_the_member() -> None:
    h = Harness()
    a = h.join("a")
    again = h.hb("a", 0, subscription=("t",))
    assert again.error == pb.NONE and again.member_epoch > a.member_epoch
    assert len(again.assignment) == 4 and list(h.group.members) == ["a"]


def test_commit_fencing() -> None:
    h = Harness()
    a = h.join("a")  # epoch 1, owns all
    assert h.group.check_commit("a", 1, [("t", 0)])[0] == pb.NONE
    assert h.group.check_commit("x", 1, [("t", 0)])[0] == pb.UNKNOWN_MEMBER_ID
    assert h.group.check_commit("a", 2, [("t", 0)])[0] == pb.FENCED_MEMBER_EPOCH
    h.join("b")
    a = h.hb("a", a.member_epoch, set(a.assignment))  # epoch 2, keeps two
    kept, gone = sorted(a.assignment), sorted({("t", p) for p in range(4)} - set(a.assignment))
    # an older epoch: fine for partitions held since then, including those a still reports owned
    # while it revokes them (it commits what it processed before it lets them go) ...
    assert h.group.check_commit("a", 1, kept)[0] == pb.NONE
    assert h.group.check_commit("a", 1, gone[:1])[0] == pb.NONE
    a = h.hb("a", a.member_epoch, set(kept))  # ... and fenced once it released them
    assert h.group.check_commit("a", 1, kept)[0] == pb.NONE
    assert h.group.check_commit("a", 1, gone[:1])[0] == pb.FENCED_MEMBER_EPOCH
    assert h.group.check_commit("a", 2, gone[:1])[0] == pb.NONE  # current epoch: Kafka's rule
    # after a rejoin under the same id, the old epoch is a zombie's
    h.hb("a", 0, subscription=("t",))
    assert h.group.check_commit("a", 1, kept)[0] == pb.FENCED_MEMBER_EPOCH


def test_a_stale_owned_report_does_not_release_what_was_just_taken_away() -> None:
    """The consumer applies an answer in poll() while its heartbeat thread may already have
    sampled ``owned`` for the next request: an empty ``owned`` sent before the member saw the
    answer that took partitions away must not free them (another member would start on them
    while this one consumes them), and this member may still commit them under its old epoch."""
    h = Harness()
    a = h.join("a")
    assert len(a.assignment) == 4 and a.member_epoch == 1
    h.join("b")
    # a's application took all 4 on; its heartbeat thread sampled owned=() before that
    a2 = h.hb("a", 1, ())
    assert a2.error == pb.NONE and len(a2.assignment) == 2 and a2.member_epoch == 2
    member_a = h.group.members["a"]
    assert set(member_a.revoking) == set(a.assignment) - set(a2.assignment)
    b = h.hb("b", 2, ())
    assert b.assignment == (), "b got partitions a may still be consuming"
    assert h.group.check_commit("a", 1, list(a.assignment)) == (pb.NONE, "")
    # a heartbeat built after a saw epoch 2 reports what it really owns: now they are released
    a3 = h.hb("a", 2, set(a2.assignment))
    assert a3.error == pb.NONE and not h.group.members["a"].revoking
    b = h.hb("b", b.member_epoch, ())
    assert set(b.assignment) == set(a.assignment) - set(a2.assignment)


def test_a_member_id_chosen_by_the_client_and_a_retried_join() -> None:
    """KIP-1082: the client names itself; a join retried (its first answer lost) replaces the
    first attempt, so the group does not keep a second member holding partitions."""
    h = Harness()
    first = h.join("client-uuid-1")
    assert first.member_id == "client-uuid-1" and len(first.assignment) == 4
    again = h.join("client-uuid-1")
    assert again.member_id == "client-uuid-1" and list(h.group.members) == ["client-uuid-1"]
    assert len(again.assignment) == 4
    too_long = h.hb("x" * 0x10000, 0, subscription=("t",))
    assert too_long.error == pb.INVALID_REQUEST and "at most 65535 bytes" in too_long.message
    assert list(h.group.members) == ["client-uuid-1"]
