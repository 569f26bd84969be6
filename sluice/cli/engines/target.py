"""Where the engines' clients connect: bootstrap servers, or the clients' keyword arguments.

A plaintext cluster is named by its bootstrap servers. A cluster with TLS client listeners
needs the TLS files too, and a secure cluster a principal: there the engines are given the
keyword arguments ``LocalCluster.client_config(name)`` returns (servers and TLS files), and
every Producer, Consumer and Admin they make is made with them. One type for both keeps the
engines' signatures as they were for the plaintext case.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The bootstrap servers, or Producer/Consumer/Admin keyword arguments (servers and TLS settings).
Target = str | Mapping[str, Any]


def client_kwargs(target: Target) -> dict[str, Any]:
    """The keyword arguments with which the clients connect to ``target``."""
    if isinstance(target, str):
        return {"bootstrap_servers": target}
    return dict(target)


def servers_of(target: Target) -> str:
    """The bootstrap servers of ``target``, for messages."""
    return target if isinstance(target, str) else str(target["bootstrap_servers"])
