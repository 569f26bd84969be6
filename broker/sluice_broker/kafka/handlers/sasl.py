"""SaslHandshake and SaslAuthenticate, answered by the connection's SASL session.

The session is :class:`~sluice.broker.kafka.authentication.SaslSession`.

Served (and advertised in ApiVersions) only by a listener that authenticates with SASL
(``--client-listener token``). SaslHandshake is served at v1 only: after a v0 handshake the
client would send raw SASL bytes outside Kafka's framing, which no current client does (Kafka 4
dropped v0 too). A successful SaslAuthenticate puts the authenticated caller in the
connection's context, which every later request's authorization asks about.
"""

from __future__ import annotations

from sluice.broker.kafka.authentication import SASL_AUTHENTICATE_KEY, SASL_HANDSHAKE_KEY
from sluice.broker.kafka.context import KafkaContext
from sluice.broker.kafka_wire.codec import Message, Versions
from sluice.broker.kafka_wire.messages.request_header import RequestHeader
from sluice.broker.kafka_wire.messages.sasl_authenticate_request import SaslAuthenticateRequest
from sluice.broker.kafka_wire.messages.sasl_handshake_request import SaslHandshakeRequest


class SaslHandshakeHandler:
    api_key = SASL_HANDSHAKE_KEY
    versions = Versions(1, 1)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, SaslHandshakeRequest) and ctx.sasl is not None  # served with SASL only
        return ctx.sasl.handshake(request.mechanism)


class SaslAuthenticateHandler:
    api_key = SASL_AUTHENTICATE_KEY
    versions = Versions(0, 2)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, SaslAuthenticateRequest) and ctx.sasl is not None  # served with SASL only
        response, caller = await ctx.sasl.authenticate(request.auth_bytes, ctx.caller.host)
        if caller is not None:
            ctx.caller = caller  # the connection's own context: every later request is this principal's
        return response
