"""The shape of a Kafka API handler."""

from __future__ import annotations

from typing import Protocol

from sluice.broker.kafka.codec import Message, Versions
from sluice.broker.kafka.context import KafkaContext
from sluice.broker.kafka.messages.request_header import RequestHeader


class Handler(Protocol):
    api_key: int
    versions: Versions  # the versions served (advertised in ApiVersions)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message | None:
        """The response to ``request`` (decoded at ``header.request_api_version``).

        None: no response at all (Produce with acks=0, as Kafka).
        """
        ...
