"""What the commands print: messages on stderr, JSON and tables on stdout.

Data goes to stdout (so ``sluice consume ... | wc -l`` and ``--json | jq`` work), everything
else, progress, summaries and errors, to stderr, prefixed ``sluice:``. ``to_plain`` turns client
results (dataclasses, protobuf messages, enums, TopicPartitions, mappings) into JSON values, so
every ``--json`` output has one shape, whatever type the client returned.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol


class Closable(Protocol):
    def close(self) -> None: ...


def err(message: str) -> None:
    print(f"sluice: {message}", file=sys.stderr)


def to_plain(obj: object) -> object:
    """Client results (dataclasses, protobuf messages, enums, TopicPartitions ...) as JSON-able values."""
    if obj is None or isinstance(obj, str | int | float | bool):
        return obj
    if isinstance(obj, bytes):
        return obj.decode("utf-8", errors="replace")
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if hasattr(obj, "DESCRIPTOR") and hasattr(obj, "ListFields"):
        from google.protobuf.json_format import MessageToDict
        from google.protobuf.message import Message

        if isinstance(obj, Message):
            return MessageToDict(obj, preserving_proto_field_name=True)
    if isinstance(obj, Mapping):
        return {str(to_plain(k)) if not isinstance(k, str) else k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, Iterable):
        return [to_plain(v) for v in obj]
    if hasattr(obj, "name") and hasattr(obj, "value") and type(obj).__module__ == "enum":
        return obj.name
    if hasattr(obj, "__dict__"):
        return {k: to_plain(v) for k, v in vars(obj).items() if not k.startswith("_")}
    return str(obj)


def print_json(obj: object) -> None:
    print(json.dumps(to_plain(obj), indent=2, sort_keys=True))


def table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    """Columns padded to their widest cell, two spaces apart, no trailing blanks (as kafka-*.sh print)."""
    cells = [list(header)] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def close_quietly(obj: Closable) -> None:
    """Close a client; a failure is a warning, so closing never hides the command's own outcome."""
    try:
        obj.close()
    except Exception as exc:
        err(f"warning: closing {type(obj).__name__} failed: {exc}")
