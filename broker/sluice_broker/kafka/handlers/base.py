"""The shape of a Kafka API handler.

A handler gets the connection's :class:`~sluice.broker.kafka.context.KafkaContext`:
the broker's core objects, and ``ctx.caller``, who is asking (``User:<CN>`` of
the client certificate on an mTLS listener, ``User:ANONYMOUS`` otherwise).
Before it changes or reveals anything, a handler asks
:mod:`sluice.broker.kafka.authorization` (the table of what each API needs is
there) and answers a refusal with Kafka's error code where Kafka puts it (per
partition, per topic, per group or for the whole request). Byte-rate quotas are
the listener's business, not the handler's.
"""

from __future__ import annotations

from typing import Protocol

from sluice.broker.kafka.context import KafkaContext
from sluice.broker.kafka_wire.codec import Message, Versions
from sluice.broker.kafka_wire.messages.request_header import RequestHeader


class Handler(Protocol):
    api_key: int
    versions: Versions  # the versions served (advertised in ApiVersions)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message | None:
        """The response to ``request`` (decoded at ``header.request_api_version``).

        None: no response at all (Produce with acks=0, as Kafka).
        """
        ...
