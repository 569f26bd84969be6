"""argparse value types shared by the commands: bounded numbers, KEY=VALUE, acks, compression.

Each function takes the option's text and returns the parsed value, or raises
``argparse.ArgumentTypeError`` so argparse reports a usage error (exit code 2) naming the option.
Values are normalised here, once (``-1`` acks is ``all``, ``none`` compression is None), so the
commands never see two spellings of one setting.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

ISOLATION_LEVELS = ("read_committed", "read_uncommitted")

_Number = TypeVar("_Number", int, float)


def _bounded(kind: Callable[[str], _Number], noun: str, minimum: float, strict: bool) -> Callable[[str], _Number]:
    """An argparse type: ``kind(text)``, refused unless > ``minimum`` (``strict``) or >= it."""

    def parse(text: str) -> _Number:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {noun}: {text!r}") from None
        if value < minimum or (strict and value == minimum):
            raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {minimum:g}, got {value}")
        return value

    return parse


positive_int = _bounded(int, "an integer", 1, strict=False)
non_negative_int = _bounded(int, "an integer", 0, strict=False)
positive_float = _bounded(float, "a number", 0, strict=True)


def key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def acks(text: str) -> str:
    value = text.strip().lower()
    if value in ("all", "-1"):
        return "all"
    if value in ("0", "1"):
        return value
    raise argparse.ArgumentTypeError(f"acks must be all, -1, 0 or 1, got {text!r}")


def compression(text: str) -> str | None:
    value = text.strip().lower()
    if value == "none":
        return None
    if value in ("gzip", "snappy", "lz4", "zstd"):
        return value
    raise argparse.ArgumentTypeError(f"compression must be none, gzip, snappy, lz4 or zstd, got {text!r}")


def separator(text: str) -> str:
    """Separators may be given with escapes: '\\t' is a tab."""
    if not text:
        raise argparse.ArgumentTypeError("the separator must not be empty")
    return text.encode("utf-8").decode("unicode_escape")
