"""The client id of a gRPC call, as a Kafka request header carries it.

Sluice's Producer, Consumer and Admin send their ``client_id`` in each call's metadata under
:data:`sluice.client._network.rpc.CLIENT_ID_KEY`, percent-encoded (gRPC metadata is ASCII). The
broker reads it only where it needs it, for the client quota entities of Produce and Fetch; a
call without it has client id ``""``, as a Kafka request with a null client id.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from sluice.client._network.rpc import CLIENT_ID_KEY

MAX_LENGTH = 1024  # longer ids are cut: the id names a quota bucket, kept in memory


def client_id(ctx: Any) -> str:
    """The caller's client id (``""`` when it sent none)."""
    for key, value in ctx.invocation_metadata() or ():
        if key == CLIENT_ID_KEY:
            return unquote(value if isinstance(value, str) else value.decode("ascii", "replace"))[:MAX_LENGTH]
    return ""
