"""Byte-rate quotas on the Kafka listener, enforced the way Kafka enforces them (KIP-219).

Produce counts the request's bytes (the whole frame, as Kafka's ``request.sizeInBytes``) and
Fetch the response's against the caller's principal, in the broker's one request gate
(:class:`~sluice.broker.security.gate.RequestGate`), which the gRPC servicers fill too: a quota entity (user, client id,
both) has one rate per broker whichever protocol its clients use. The throttle time is reported in the response's
``throttle_time_ms``.

How the wait is imposed is KIP-219's: from Produce v6 and Fetch v8 the client knows to wait
out the throttle time itself, so the response goes out at once and the broker then reads
nothing more from that connection for the throttle time (Kafka "mutes the channel"); older
versions predate it, so their response is held back that long instead. Either way a client
that ignores the field cannot go faster than its quota on this connection.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.broker.kafka.context import KafkaContext
from sluice.broker.kafka_wire.codec import Message
from sluice.broker.kafka_wire.messages.fetch_response import FetchResponse
from sluice.broker.kafka_wire.messages.produce_response import ProduceResponse

PRODUCE_KEY, FETCH_KEY = 0, 1
# The first version whose clients throttle themselves (KIP-219): below it the broker holds the response.
CLIENT_THROTTLES_FROM = {PRODUCE_KEY: 6, FETCH_KEY: 8}


@dataclass(frozen=True, slots=True)
class Throttle:
    ms: int
    hold_response: bool  # True: delay the response (old clients); False: send it, then mute the connection


def throttle(
    ctx: KafkaContext, api_key: int, version: int, request_bytes: int, response_bytes: int, client_id: str | None = None
) -> Throttle | None:
    """Count a Produce's or Fetch's bytes for the caller (its principal and the request header's
    client id, which client-id quota entities match); the throttle to apply (None: within quota)."""
    client = client_id or ""
    if api_key == PRODUCE_KEY:
        quota = ctx.gate.produce
        ms = quota.record(ctx.caller.principal, request_bytes, client) if quota.active else 0
    elif api_key == FETCH_KEY:
        quota = ctx.gate.fetch
        ms = quota.record(ctx.caller.principal, response_bytes, client) if quota.active else 0
    else:
        return None
    if ms <= 0:
        return None
    return Throttle(ms, version < CLIENT_THROTTLES_FROM[api_key])


def report(response: Message | None, ms: int) -> bool:
    """Put the throttle time into a Produce/Fetch response; False when there is none (acks=0)."""
    if isinstance(response, ProduceResponse | FetchResponse):
        response.throttle_time_ms = ms
        return True
    return False
