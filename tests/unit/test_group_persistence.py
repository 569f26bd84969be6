"""Group membership persisted in __consumer_offsets (KIP-848's records) and restored by a load.

The pure part (records of a group, and a group rebuilt from them) with the membership
harness; the coordinator part over real RocksDB, a real metadata store and a real
ReplicaManager (the set-up of test_group_coordinator), restarted on the same directories
the way a broker restarts, or a new leader loads the partition after a failover.
"""

from __future__ import annotations

from pathlib import Path

from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.cluster import CONSUMER_OFFSETS_TOPIC
from sluice.broker.group.classic import ClassicGroup
from sluice.broker.group.group_records import (
    CURRENT_ASSIGNMENT,
    GROUP_METADATA,
    MEMBER_METADATA,
    TARGET_ASSIGNMENT,
    GroupRecordLog,
    changed_records,
    decode_key,
    encode_key,
    group_records,
)
from sluice.broker.group.membership import ConsumerGroup
from sluice.records import build_batch, decode_records

from .test_group_coordinator import GROUP, Broker, commit_req, fetch, run
from .test_group_coordinator import heartbeat as heartbeat_via_grpc_codec
from .test_group_membership import SETTINGS, Harness

TP = tuple[str, int]


# -- pure: records of a group ---------------------------------------------------------------------


def test_keys_round_trip_and_offset_keys_are_not_group_keys() -> None:
    assert decode_key(encode_key(GROUP_METADATA, "g")) == (GROUP_METADATA, "g", "")
    for kind in (MEMBER_METADATA, TARGET_ASSIGNMENT, CURRENT_ASSIGNMENT):
        assert decode_key(encode_key(kind, "g", "m-1")) == (kind, "g", "m-1")
    from sluice.broker.group.offsets import encode_key as offset_key

    assert decode_key(offset_key("g", "t", 0)) is None


def test_a_group_rebuilt_from_its_records_has_the_same_records() -> None:
    h = Harness()
    a = h.join("a")
    b = h.join("b")
    states = h.settle({"a": a, "b": b})
    # a revoking partition in flight: c joins, a and b are asked to give some up but still own them
    c = h.join("c")
    states["c"] = c
    records = group_records(h.group)
    replay = GroupRecordLog()
    replay.replay(build_batch(list(records.items())))
    restored = replay.groups(SETTINGS, now=1234.0)["g"]
    assert group_records(restored) == records
    assert restored.epoch == h.group.epoch
    for mid, member in h.group.members.items():
        again = restored.members[mid]
        fields = ("epoch", "previous_epoch", "assigned", "revoking", "owned", "revoked_epoch")
        assert [getattr(again, f) for f in fields] == [getattr(member, f) for f in fields]
        assert again.last_seen_ms == 1234.0  # the session starts at the load


def test_changes_are_only_what_changed_and_a_leave_is_tombstones() -> None:
    h = Harness()
    a = h.join("a")
    states = h.settle({"a": a})
    before = group_records(h.group)
    h.hb("a", states["a"].member_epoch, set(states["a"].assignment))
    assert changed_records(before, group_records(h.group)) == []  # a steady heartbeat writes nothing
    h.join("b")
    changes = dict(changed_records(before, group_records(h.group)))
    assert encode_key(MEMBER_METADATA, "g", "b") in changes
    assert encode_key(MEMBER_METADATA, "g", "a") not in changes  # a's subscription did not change
    before = group_records(h.group)
    h.hb("a", -1)
    h.hb("b", -1)
    gone = changed_records(before, group_records(h.group))
    assert gone and all(value is None for _key, value in gone)
    assert {key for key, _ in gone} == set(before)  # every key of the emptied group


def test_tombstones_delete_on_replay() -> None:
    replay = GroupRecordLog()
    key = encode_key(GROUP_METADATA, "g")
    h = Harness()
    h.join("a")
    replay.replay(build_batch(list(group_records(h.group).items())))
    assert "g" in replay.groups(SETTINGS, 0.0)
    replay.replay(build_batch([(k, None) for k in group_records(h.group)]))
    assert replay.groups(SETTINGS, 0.0) == {}
    assert key not in replay.records


# -- the coordinator, restarted -------------------------------------------------------------------


async def heartbeat(
    b: Broker, member_id: str, epoch: int, owned: tuple[TP, ...] | list[TP] = (), topics: tuple[str, ...] = ("t",)
) -> bpb.ConsumerGroupHeartbeatResponse:
    req = bpb.ConsumerGroupHeartbeatRequest(
        group_id=GROUP,
        member_id=member_id,
        member_epoch=epoch,
        subscribed_topic_names=list(topics),
        owned_partitions=[pb.TopicPartition(topic=t, partition=p) for t, p in owned],
    )
    return await heartbeat_via_grpc_codec(b.groups, req)


def assignment(resp: bpb.ConsumerGroupHeartbeatResponse) -> list[TP]:
    return sorted((tp.topic, tp.partition) for tp in resp.assignment)


def group_log_records(b: Broker) -> list[tuple[bytes, bytes | None]]:
    """Every group record of the group's partition, in log order."""
    out = []
    for batch in b.replicas.iter_batches(CONSUMER_OFFSETS_TOPIC, b.partition):
        if batch.control:
            continue
        for rec in decode_records(batch):
            if rec.key is not None and decode_key(rec.key) is not None:
                out.append((rec.key, rec.value))
    return out


def test_members_keep_id_epoch_and_partitions_across_a_restart(tmp_path: Path) -> None:
    seen: dict[str, tuple[int, list[TP]]] = {}

    async def first(b: Broker) -> None:
        a = await heartbeat(b, "", 0)
        c = await heartbeat(b, "", 0)
        for _ in range(4):  # settle: a gives half up, c takes it
            a = await heartbeat(b, a.member_id, a.member_epoch, assignment(a))
            c = await heartbeat(b, c.member_id, c.member_epoch, assignment(c))
        assert a.error_code == c.error_code == pb.NONE
        assert assignment(a) == [("t", 0)] and assignment(c) == [("t", 1)]
        assert b.groups.partition_for(GROUP) == b.partition
        seen["a"] = (a.member_epoch, assignment(a))
        seen["c"] = (c.member_epoch, assignment(c))
        seen["ids"] = (0, [(a.member_id, 0), (c.member_id, 0)])
        await b.groups.offset_commit(commit_req({("t", 0): 3}, member_id=a.member_id, member_epoch=a.member_epoch))

    async def second(b: Broker) -> None:
        (a_id, _), (c_id, _) = seen["ids"][1]
        group = b.groups._locate(GROUP).groups[GROUP]
        assert set(group.members) == {a_id, c_id}
        epoch_before = group.epoch
        for member_id, name in ((a_id, "a"), (c_id, "c")):
            epoch, partitions = seen[name]
            resp = await heartbeat(b, member_id, epoch, partitions)
            assert resp.error_code == pb.NONE, resp.error_message
            assert (resp.member_id, resp.member_epoch, assignment(resp)) == (member_id, epoch, partitions)
        assert b.groups._locate(GROUP).groups[GROUP].epoch == epoch_before  # no rebalance
        # commit fencing knows them too
        epoch, _ = seen["a"]
        ok = await b.groups.offset_commit(commit_req({("t", 0): 5}, member_id=a_id, member_epoch=epoch))
        assert [r.error_code for r in ok] == [pb.NONE]
        assert await fetch(b, ("t", 0)) == {("t", 0): 5}

    run(tmp_path, first)
    run(tmp_path, second)


def test_a_revoking_member_still_holds_its_partition_after_a_restart(tmp_path: Path) -> None:
    ids: dict[str, str] = {}

    async def first(b: Broker) -> None:
        a = await heartbeat(b, "", 0)
        a = await heartbeat(b, a.member_id, a.member_epoch, assignment(a))
        assert assignment(a) == [("t", 0), ("t", 1)]
        c = await heartbeat(b, "", 0)
        assert assignment(c) == []  # a still owns everything
        a = await heartbeat(b, a.member_id, a.member_epoch, [("t", 0), ("t", 1)])  # told to revoke one
        assert len(assignment(a)) == 1
        ids.update(a=a.member_id, c=c.member_id, c_epoch=str(c.member_epoch), revoked=str(a.member_epoch))

    async def second(b: Broker) -> None:
        # a still reports both: c must not get the second one, even from a new coordinator
        c = await heartbeat(b, ids["c"], int(ids["c_epoch"]), [])
        assert c.error_code == pb.NONE and assignment(c) == []
        a = await heartbeat(b, ids["a"], int(ids["revoked"]), [("t", 0), ("t", 1)])
        assert a.error_code == pb.NONE and len(assignment(a)) == 1
        a = await heartbeat(b, ids["a"], a.member_epoch, assignment(a))  # released
        c = await heartbeat(b, ids["c"], c.member_epoch, [])
        assert len(assignment(c)) == 1 and set(assignment(c)).isdisjoint(assignment(a))

    run(tmp_path, first)
    run(tmp_path, second)


def test_sessions_restart_at_the_load_and_expiry_writes_tombstones(tmp_path: Path) -> None:
    ids: dict[str, str] = {}

    async def first(b: Broker) -> None:
        a = await heartbeat(b, "", 0)
        ids["a"] = a.member_id
        b.now[0] = 2500.0  # 2.5 s of a 3 s session gone on this coordinator

    async def second(b: Broker) -> None:
        g = b.groups
        assert b.now[0] == 0.0  # a new coordinator's clock; the member's session started at the load
        b.now[0] = 2900.0
        g.expire_sessions()
        assert ids["a"] in g._locate(GROUP).groups[GROUP].members  # a full session timeout from the load
        b.now[0] = 3100.0
        g.expire_sessions()
        assert GROUP not in g._locate(GROUP).groups  # expired: the group is empty, so deleted
        last: dict[bytes, bytes | None] = {}
        for key, value in group_log_records(b):
            last[key] = value
        assert last and all(value is None for value in last.values())  # every key ends in a tombstone

    async def third(b: Broker) -> None:
        assert GROUP not in b.groups._locate(GROUP).groups
        resp = await heartbeat(b, ids["a"], 1)
        assert resp.error_code == pb.UNKNOWN_MEMBER_ID

    run(tmp_path, first)
    run(tmp_path, second)
    run(tmp_path, third)


def test_compaction_keeps_the_state_from_growing(tmp_path: Path) -> None:
    """Many members come and go: compaction leaves little more than the live group, which reloads."""
    stay: list[bpb.ConsumerGroupHeartbeatResponse] = []

    async def first(b: Broker) -> None:
        for _ in range(20):
            m = await heartbeat(b, "", 0)
            m = await heartbeat(b, m.member_id, m.member_epoch, assignment(m))
            assert (await heartbeat(b, m.member_id, -1)).error_code == pb.NONE
        m = await heartbeat(b, "", 0)
        m = await heartbeat(b, m.member_id, m.member_epoch, assignment(m))
        stay.append(m)
        written = group_log_records(b)
        part = b.replicas.partitions[(CONSUMER_OFFSETS_TOPIC, b.partition)]
        assert part.compact(now=2**62) > 0  # far in the future: tombstones are past delete.retention.ms
        kept = group_log_records(b)
        assert len(kept) * 5 < len(written), (len(kept), len(written))
        assert not any(decode_key(k) == (MEMBER_METADATA, GROUP, "") for k, _ in kept)

    async def second(b: Broker) -> None:
        group = b.groups._locate(GROUP).groups[GROUP]
        m = stay[0]
        assert set(group.members) == {m.member_id}
        resp = await heartbeat(b, m.member_id, m.member_epoch, assignment(m))
        assert resp.error_code == pb.NONE and resp.member_epoch == m.member_epoch
        assert assignment(resp) == assignment(m) == [("t", 0), ("t", 1)]

    run(tmp_path, first)
    run(tmp_path, second)


def test_ids_the_key_format_cannot_hold_are_refused(tmp_path: Path) -> None:
    async def body(b: Broker) -> None:
        long_group = "g" * 0x10000
        resp = await heartbeat_via_grpc_codec(
            b.groups,
            bpb.ConsumerGroupHeartbeatRequest(group_id=long_group, member_epoch=0, subscribed_topic_names=["t"]),
        )
        assert resp.error_code == pb.INVALID_GROUP_ID and "at most 65535 bytes" in resp.error_message
        resp = await heartbeat(b, "m" * 0x10000, 0)
        assert resp.error_code == pb.INVALID_REQUEST
        assert group_log_records(b) == []  # nothing was written

    run(tmp_path, body)


def test_an_empty_classic_group_gives_its_id_to_a_consumer_group(tmp_path: Path) -> None:
    """Both kinds share one map: a consumer group takes the id of a classic group whose members
    left, the classic coordinator no longer sees a group of its kind, and a restart restores only
    the consumer group (the classic group's record was tombstoned when it emptied)."""

    async def first(b: Broker) -> None:
        state = b.groups.locate(GROUP)
        state.groups[GROUP] = ClassicGroup(GROUP, b.groups.classic.settings)  # its members have left
        a = await heartbeat(b, "", 0)
        assert a.error_code == pb.NONE, a.error_message
        assert isinstance(state.groups[GROUP], ConsumerGroup) and state.classic_group(GROUP) is None
        described = b.groups.classic.describe(GROUP)
        assert described.error == pb.GROUP_ID_NOT_FOUND and "not a classic group" in described.message

    async def second(b: Broker) -> None:
        group = b.groups.locate(GROUP).groups[GROUP]
        assert isinstance(group, ConsumerGroup) and len(group.members) == 1

    run(tmp_path, first)
    run(tmp_path, second)
