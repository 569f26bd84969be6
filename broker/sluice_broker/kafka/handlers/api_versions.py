"""ApiVersions: what this listener serves, at which versions.

The list is built from the handlers themselves, so an API is advertised exactly
when it is served. A request at a version above ours is answered at v0 with
UNSUPPORTED_VERSION and the full list (KIP-511): the client then retries at
the highest version both sides know. No feature is advertised (in particular
no ``transaction.version``: the TV2 flow is not served over this listener).
"""

from __future__ import annotations

from collections.abc import Mapping

from sluice.broker.kafka.context import KafkaContext
from sluice.broker.kafka.handlers.base import Handler
from sluice.broker.kafka_wire.codec import Message, Versions
from sluice.broker.kafka_wire.messages.api_versions_response import ApiVersion, ApiVersionsResponse
from sluice.broker.kafka_wire.messages.request_header import RequestHeader

# Kafka's UNSUPPORTED_VERSION; not in records.proto's ErrorCode (the gRPC API never needed it).
UNSUPPORTED_VERSION = 35


class ApiVersionsHandler:
    api_key = 18
    versions = Versions(0, 4)

    def __init__(self, handlers: Mapping[int, Handler]) -> None:
        self._handlers = handlers

    def advertised(self) -> list[ApiVersion]:
        return [ApiVersion(key, h.versions.lo, h.versions.hi) for key, h in sorted(self._handlers.items())]

    def unsupported(self) -> ApiVersionsResponse:
        """The v0 answer to a version we do not know (KIP-511)."""
        return ApiVersionsResponse(error_code=UNSUPPORTED_VERSION, api_keys=self.advertised())

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        return ApiVersionsResponse(error_code=0, api_keys=self.advertised(), throttle_time_ms=0)
