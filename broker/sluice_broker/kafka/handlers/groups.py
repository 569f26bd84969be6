"""ListGroups and DeleteGroups: what kafka-consumer-groups.sh and admin clients ask a broker.

The gRPC group administration (:class:`~sluice.broker.servicers.group_admin.GroupAdmin`)
does the work over the same group coordinator, so a group listed or deleted
here is the group gRPC clients see. Every Sluice group is a KIP-848 consumer
group: listed with protocol type and group type ``consumer`` and Kafka's state
names (Empty, Reconciling, Stable). ListGroups is per broker, as in Kafka: a
broker lists the groups whose ``__consumer_offsets`` partitions it leads (an
admin client asks every broker); a partition still loading answers
COORDINATOR_LOAD_IN_PROGRESS. A ``types_filter`` (v5) without ``consumer``
(``classic``, ``share``) lists nothing: Sluice has no such groups.
DeleteGroups answers per group: NON_EMPTY_GROUP while it has members (or
offsets pending in an open transaction), GROUP_ID_NOT_FOUND for a group with
neither members nor offsets, NOT_COORDINATOR elsewhere.

Authorization (Kafka's): ListGroups lists every group for a caller with
Describe on the cluster, else only the groups it may Describe; DeleteGroups
needs Delete on each group (GROUP_AUTHORIZATION_FAILED in that group's result;
the others are deleted).
"""

from __future__ import annotations

from sluice.acls import AclOperation
from sluice.api.v1 import broker_pb2 as bpb
from sluice.broker.kafka import authorization
from sluice.broker.kafka.codec import Message, Versions
from sluice.broker.kafka.context import KafkaContext
from sluice.broker.kafka.messages.delete_groups_request import DeleteGroupsRequest
from sluice.broker.kafka.messages.delete_groups_response import DeletableGroupResult, DeleteGroupsResponse
from sluice.broker.kafka.messages.list_groups_request import ListGroupsRequest
from sluice.broker.kafka.messages.list_groups_response import ListedGroup, ListGroupsResponse
from sluice.broker.kafka.messages.request_header import RequestHeader
from sluice.broker.servicers.group_admin import GroupAdmin

CONSUMER = "consumer"  # Kafka's protocol type and (KIP-848) group type of every Sluice group


def _admin(ctx: KafkaContext) -> GroupAdmin:
    return GroupAdmin(ctx.groups, ctx.config.broker_id)


class ListGroupsHandler:
    api_key = 16
    versions = Versions(0, 5)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, ListGroupsRequest)
        resp = ListGroupsResponse()
        if request.types_filter and CONSUMER not in {t.lower() for t in request.types_filter}:
            return resp
        listed = await _admin(ctx).list_groups(bpb.ListGroupsRequest(states_filter=list(request.states_filter)))
        resp.error_code = int(listed.error_code)
        everything = authorization.cluster_allowed(ctx, AclOperation.DESCRIBE)
        for group in listed.groups:
            if not everything and authorization.group_refusal(ctx, AclOperation.DESCRIBE, group.group_id):
                continue
            resp.groups.append(
                ListedGroup(
                    group_id=group.group_id, protocol_type=CONSUMER, group_state=group.state, group_type=CONSUMER
                )
            )
        return resp


class DeleteGroupsHandler:
    api_key = 42
    versions = Versions(0, 2)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, DeleteGroupsRequest)
        refused = {
            g: r for g in request.groups_names if (r := authorization.group_refusal(ctx, AclOperation.DELETE, g))
        }
        allowed = [g for g in request.groups_names if g not in refused]
        deleted = await _admin(ctx).delete_groups(bpb.DeleteGroupsRequest(group_ids=allowed)) if allowed else None
        answered = {r.group_id: int(r.error_code) for r in deleted.results} if deleted is not None else {}
        return DeleteGroupsResponse(
            results=[
                DeletableGroupResult(group_id=g, error_code=refused[g][0] if g in refused else answered[g])
                for g in request.groups_names
            ]
        )
