"""JoinGroup, SyncGroup, Heartbeat, LeaveGroup: Kafka's classic group protocol.

Thin maps onto the group coordinator's classic part
(:mod:`sluice.broker.group.classic_coordinator`, the state machine in
:mod:`sluice.broker.group.classic`). JoinGroup and SyncGroup may wait for
other members (bounded by the rebalance timeout): the listener answers a
connection's requests in order, so a waiting request holds only its own
connection, and Kafka clients send group requests on a coordinator
connection of their own, exactly as with Kafka (which mutes a connection
until its request is answered).

Served: JoinGroup 0-9 (MEMBER_ID_REQUIRED from v4, KIP-394; static
membership from v5, KIP-345; v0 has no rebalance timeout: the session
timeout is used, as Kafka does, and so it is for a non-positive one)

Authorization (Kafka's): every one of them needs Read on the group
(GROUP_AUTHORIZATION_FAILED, nothing done). A member's ``client_host`` is the
connection's peer address, written as Kafka does (``/127.0.0.1``)., SyncGroup 0-5 (v5 checks the protocol type
and name), Heartbeat 0-4, LeaveGroup 0-5 (v3+ batched by member).
"""

from __future__ import annotations

from sluice.acls import AclOperation
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.group.classic import JoinInput
from sluice.broker.kafka import authorization
from sluice.broker.kafka.context import KafkaContext
from sluice.broker.kafka_wire.codec import Message, Versions
from sluice.broker.kafka_wire.messages.heartbeat_request import HeartbeatRequest
from sluice.broker.kafka_wire.messages.heartbeat_response import HeartbeatResponse
from sluice.broker.kafka_wire.messages.join_group_request import JoinGroupRequest
from sluice.broker.kafka_wire.messages.join_group_response import JoinGroupResponse, JoinGroupResponseMember
from sluice.broker.kafka_wire.messages.leave_group_request import LeaveGroupRequest
from sluice.broker.kafka_wire.messages.leave_group_response import LeaveGroupResponse, MemberResponse
from sluice.broker.kafka_wire.messages.request_header import RequestHeader
from sluice.broker.kafka_wire.messages.sync_group_request import SyncGroupRequest
from sluice.broker.kafka_wire.messages.sync_group_response import SyncGroupResponse


class JoinGroupHandler:
    api_key = 11
    versions = Versions(0, 9)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, JoinGroupRequest)
        version = header.request_api_version
        refusal = authorization.group_refusal(ctx, AclOperation.READ, request.group_id)
        if refusal is not None:
            return JoinGroupResponse(
                error_code=refusal[0], member_id=request.member_id, protocol_name="" if version < 7 else None
            )
        # v0 has none; Kafka's clients always send one from v1 (a non-positive one falls back the same way)
        rebalance_timeout = request.rebalance_timeout_ms if version >= 1 and request.rebalance_timeout_ms > 0 else 0
        rebalance_timeout = rebalance_timeout or request.session_timeout_ms
        result = await ctx.groups.classic.join(
            request.group_id,
            JoinInput(
                member_id=request.member_id,
                group_instance_id=request.group_instance_id,
                client_id=header.client_id or "",
                client_host=f"/{ctx.caller.host}" if ctx.caller.host else "",
                session_timeout_ms=request.session_timeout_ms,
                rebalance_timeout_ms=rebalance_timeout,
                protocol_type=request.protocol_type,
                protocols=tuple((p.name, p.metadata) for p in request.protocols),
                require_known_member_id=version >= 4,
            ),
        )
        protocol_name = result.protocol_name
        if protocol_name is None and version < 7:
            protocol_name = ""  # nullable from v7 only
        return JoinGroupResponse(
            error_code=int(result.error),
            generation_id=result.generation,
            protocol_type=result.protocol_type,
            protocol_name=protocol_name,
            leader=result.leader,
            member_id=result.member_id,
            members=[
                JoinGroupResponseMember(member_id=mid, group_instance_id=instance, metadata=meta)
                for mid, instance, meta in result.members
            ],
            skip_assignment=result.skip_assignment and version >= 9,
        )


class SyncGroupHandler:
    api_key = 14
    versions = Versions(0, 5)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, SyncGroupRequest)
        refusal = authorization.group_refusal(ctx, AclOperation.READ, request.group_id)
        if refusal is not None:
            return SyncGroupResponse(error_code=refusal[0])
        assignments: dict[str, bytes] = {}
        for a in request.assignments:
            if a.member_id in assignments:
                return SyncGroupResponse(error_code=pb.INVALID_REQUEST)  # one assignment per member
            assignments[a.member_id] = a.assignment
        result = await ctx.groups.classic.sync(
            request.group_id,
            request.member_id,
            request.group_instance_id,
            request.generation_id,
            request.protocol_type,
            request.protocol_name,
            assignments,
        )
        return SyncGroupResponse(
            error_code=int(result.error),
            protocol_type=result.protocol_type,
            protocol_name=result.protocol_name,
            assignment=result.assignment,
        )


class HeartbeatHandler:
    api_key = 12
    versions = Versions(0, 4)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, HeartbeatRequest)
        refusal = authorization.group_refusal(ctx, AclOperation.READ, request.group_id)
        if refusal is not None:
            return HeartbeatResponse(error_code=refusal[0])
        code = ctx.groups.classic.heartbeat(
            request.group_id, request.member_id, request.group_instance_id, request.generation_id
        )
        return HeartbeatResponse(error_code=int(code))


class LeaveGroupHandler:
    api_key = 13
    versions = Versions(0, 5)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, LeaveGroupRequest)
        refusal = authorization.group_refusal(ctx, AclOperation.READ, request.group_id)
        if refusal is not None:
            return LeaveGroupResponse(error_code=refusal[0])
        if header.request_api_version < 3:
            error, codes = ctx.groups.classic.leave(request.group_id, [(request.member_id, None)])
            return LeaveGroupResponse(error_code=int(error or (codes[0] if codes else pb.NONE)))
        leaving = [(m.member_id, m.group_instance_id) for m in request.members]
        if not leaving:
            return LeaveGroupResponse(error_code=pb.INVALID_REQUEST)
        error, codes = ctx.groups.classic.leave(request.group_id, leaving)
        return LeaveGroupResponse(
            error_code=int(error),
            members=[
                MemberResponse(member_id=mid, group_instance_id=instance, error_code=int(code))
                for (mid, instance), code in zip(leaving, codes, strict=False)
            ],
        )
