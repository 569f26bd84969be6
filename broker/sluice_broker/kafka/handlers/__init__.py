"""Kafka API handlers: one module per API, each thin over the broker's core.

A handler serves a version range (:attr:`Handler.versions`, within what the
generated codec knows) and turns a decoded request into a response message.
:data:`HANDLERS` is what the listener dispatches on and what ApiVersions
advertises: an API is advertised exactly when it has a handler here.
"""

from __future__ import annotations

from sluice.broker.kafka.handlers.api_versions import ApiVersionsHandler
from sluice.broker.kafka.handlers.base import Handler
from sluice.broker.kafka.handlers.metadata import MetadataHandler


def build_handlers() -> dict[int, Handler]:
    handlers: dict[int, Handler] = {}
    metadata = MetadataHandler()
    handlers[metadata.api_key] = metadata
    api_versions = ApiVersionsHandler(handlers)  # advertises every handler, itself included
    handlers[api_versions.api_key] = api_versions
    return handlers


__all__ = ["Handler", "build_handlers"]
