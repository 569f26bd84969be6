"""Unique, valid resource names for tests (topics, groups, transactional ids)."""

from __future__ import annotations

import itertools
import os
import re

_counter = itertools.count()
_INVALID = re.compile(r"[^a-zA-Z0-9._-]+")


def unique_topic_name(prefix: str = "topic") -> str:
    """``prefix`` made a legal topic name ([a-zA-Z0-9._-], not starting with '__') plus a unique suffix.

    Unique across calls in this process and, thanks to the pid and random
    bytes, across processes sharing a cluster.
    """
    base = _INVALID.sub("-", prefix).strip("-_.")[:180] or "topic"
    return f"{base}-{os.getpid()}-{next(_counter)}-{os.urandom(3).hex()}"
