"""The Kafka protocol's wire encoding, driven by the generated message schemas.

Kafka describes every message in JSON (``common/message/*.json`` in kafka-clients):
fields, the versions each exists in, which versions are *flexible* (compact
strings/arrays, tagged fields), which fields are nullable or tagged.
``scripts/gen_kafka_messages.py`` turns those files into
:mod:`sluice.broker.kafka_wire.messages`: one dataclass per struct, each carrying a
:class:`Schema` (a table of :class:`Field` rows). This module is the one
interpreter of those tables: :func:`encode` and :func:`decode` walk a schema for
a given version. There is no hand-written struct per message anywhere: adding
an API means regenerating, not writing a codec.

Why an interpreter over tables rather than generated straight-line code per
version: one small, reviewed piece of encoding logic instead of ~200 modules of
it, and the generated files stay declarative (easy to diff against Kafka's
JSON). Record data (the ``records`` type) is carried as an opaque byte string,
never decoded here, so the produce/fetch hot path costs one interpretation of
a handful of header fields per partition, not per record.

Rules implemented (KIP-482 for flexible versions):

* fixed-width ints are big-endian; ``uuid`` is 16 raw bytes; ``float64`` IEEE;
* non-flexible: string = int16 length (-1 null), bytes/records = int32 length
  (-1 null), array = int32 count (-1 null);
* flexible: the same, each length as an unsigned varint of length+1 (0 null),
  and every struct ends with a tagged-field section (uvarint count, then
  uvarint tag, uvarint size, data). Tagged fields are written only when they
  differ from their default, in ascending tag order; unknown tags are skipped;
* a field may override flexibility (``flexibleVersions: none``: the request
  header's ClientId keeps its int16 length in header v2);
* a nullable struct is an int8 (-1 null, 1 present) followed by the struct.

A ``records`` value may be given as :class:`Chunks`, the buffers of its batches: :func:`encode_segments`
then leaves them where they are and returns the message as a list of buffers (the bytes around
them, and the chunks themselves), which the listener hands to the socket one by one. A fetch
answer's batches are thus never copied into the response (before, they were joined, written into
the response and copied again into the frame: a fifth of the broker's CPU catching up through a
log). :func:`encode` joins them, for every other caller.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias, TypeVar

MAX_VERSION = 0x7FFF

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")

_FIXED: dict[str, struct.Struct] = {
    "int8": _I8,
    "int16": _I16,
    "uint16": _U16,
    "int32": _I32,
    "uint32": _U32,
    "int64": _I64,
    "float64": _F64,
}


class DecodeError(ValueError):
    """The bytes do not hold a valid message of the schema and version asked for."""


@dataclass(frozen=True, slots=True)
class Versions:
    """An inclusive version range; ``lo > hi`` is the empty range (Kafka's ``none``)."""

    lo: int
    hi: int

    def __contains__(self, version: object) -> bool:
        return isinstance(version, int) and self.lo <= version <= self.hi

    @classmethod
    def parse(cls, text: str | None) -> Versions:
        if text is None or text.strip() == "none":
            return NONE
        text = text.strip()
        if text.endswith("+"):
            return cls(int(text[:-1]), MAX_VERSION)
        lo, sep, hi = text.partition("-")
        return cls(int(lo), int(hi if sep else lo))


NONE = Versions(1, 0)


@dataclass(frozen=True, slots=True)
class Field:
    """One row of a schema: a field's name (snake_case), type and version rules.

    ``kind`` is a primitive name (``int32``, ``string``, ``records``...), ``struct`` or
    ``array``; for ``array`` ``element`` is a primitive name or a Message class, for
    ``struct`` it is the Message class.
    """

    name: str
    kind: str
    versions: Versions
    nullable: Versions = NONE
    tag: int | None = None
    tagged: Versions = NONE
    flexible: Versions | None = None  # the field's own flexibleVersions, overriding the message's
    default: Any = None
    element: Any = None


@dataclass(frozen=True, slots=True)
class Schema:
    name: str
    fields: tuple[Field, ...]
    flexible: Versions


class Message:
    """Base of every generated struct: its :class:`Schema` is set by the generated module."""

    SCHEMA: ClassVar[Schema]
    VALID_VERSIONS: ClassVar[Versions]  # set on request, response and header classes
    __slots__ = ()


M = TypeVar("M", bound=Message)

Buffer: TypeAlias = bytes | bytearray | memoryview
# Chunks shorter than this are copied into the bytes around them: each buffer costs the socket a
# send call (a few microseconds), about what copying 32 KiB costs.
UNCOPIED_FROM = 32 * 1024


class Chunks:
    """A ``records`` (or ``bytes``) value given as the buffers it is made of, in order.

    Encoded as their concatenation would be; :func:`encode_segments` passes them on uncopied.
    """

    __slots__ = ("parts", "size")

    def __init__(self, parts: Sequence[Buffer]) -> None:
        self.parts = parts
        self.size = sum(len(p) for p in parts)

    def __len__(self) -> int:
        return self.size


# A ``records`` field's value: bytes (always, when decoded), or Chunks to send.
Records: TypeAlias = bytes | Chunks


def received(value: Records | None) -> bytes | None:
    """A ``records`` field of a decoded message, typed as what decoding gives: bytes or None."""
    assert not isinstance(value, Chunks)  # Chunks are only ever built to be encoded
    return value


class _Segments(bytearray):
    """The encoder's output when chunks stay uncopied: the bytes written since the last chunk, and
    ``done``, what came before (bytes, then the chunk's parts)."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        super().__init__()
        self.done: list[Buffer] = []

    def cut(self, chunks: Chunks) -> None:
        for part in chunks.parts:
            if len(part) < UNCOPIED_FROM:
                self += part
                continue
            if self:
                self.done.append(bytearray(self))
                self.clear()
            self.done.append(part)


# -- writing ------------------------------------------------------------------------------------


def _uvarint(out: bytearray, value: int) -> None:
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _length(out: bytearray, n: int | None, compact: bool, wide: bool) -> None:
    """A length or count: -1/None is null. ``wide`` is int32 (bytes, arrays), else int16 (strings)."""
    if compact:
        _uvarint(out, 0 if n is None else n + 1)
    elif wide:
        out += _I32.pack(-1 if n is None else n)
    else:
        out += _I16.pack(-1 if n is None else n)


def _write_value(out: bytearray, f: Field, kind: str, value: Any, version: int, compact: bool) -> None:
    fixed = _FIXED.get(kind)
    if fixed is not None:
        out += fixed.pack(value)
    elif kind == "bool":
        out.append(1 if value else 0)
    elif kind == "string":
        if value is None:
            _length(out, None, compact, wide=False)
        else:
            raw = value.encode()
            if not compact and len(raw) > 0x7FFF:
                raise ValueError(f"{f.name}: string of {len(raw)} bytes exceeds 32767")
            _length(out, len(raw), compact, wide=False)
            out += raw
    elif kind in ("bytes", "records"):
        _length(out, None if value is None else len(value), compact, wide=True)
        if isinstance(value, Chunks):
            if isinstance(out, _Segments):
                out.cut(value)
            else:
                for part in value.parts:
                    out += part
        elif value is not None:
            out += value
    elif kind == "uuid":
        out += value.bytes
    else:
        raise AssertionError(f"unknown primitive {kind}")


def _write_field(out: bytearray, f: Field, value: Any, version: int, flexible: bool) -> None:
    compact = flexible if f.flexible is None else version in f.flexible
    if f.kind == "struct":
        if version in f.nullable:
            if value is None:
                out += _I8.pack(-1)
                return
            out += _I8.pack(1)
        _write_struct(out, value, version, flexible)
    elif f.kind == "array":
        if value is None:
            if version not in f.nullable:
                raise ValueError(f"{f.name} is not nullable at version {version}")
            _length(out, None, compact, wide=True)
            return
        _length(out, len(value), compact, wide=True)
        if isinstance(f.element, str):
            for item in value:
                _write_value(out, f, f.element, item, version, compact)
        else:
            for item in value:
                _write_struct(out, item, version, flexible)
    else:
        if value is None and version not in f.nullable:
            raise ValueError(f"{f.name} is not nullable at version {version}")
        _write_value(out, f, f.kind, value, version, compact)


@dataclass(frozen=True, slots=True)
class _Plan:
    """A schema at one version: its regular fields in order, its tagged fields by tag."""

    regular: tuple[Field, ...]
    tagged: dict[int, Field]


_PLANS: dict[tuple[int, int], _Plan] = {}


def _plan(schema: Schema, version: int) -> _Plan:
    """Which fields a version has, worked out once per (schema, version) instead of per message."""
    key = (id(schema), version)
    plan = _PLANS.get(key)
    if plan is None:
        present = [f for f in schema.fields if version in f.versions]
        plan = _Plan(
            tuple(f for f in present if not (f.tag is not None and version in f.tagged)),
            {f.tag: f for f in present if f.tag is not None and version in f.tagged},
        )
        _PLANS[key] = plan
    return plan


def _write_struct(out: bytearray, msg: Message, version: int, flexible: bool) -> None:
    plan = _plan(msg.SCHEMA, version)
    for f in plan.regular:
        _write_field(out, f, getattr(msg, f.name), version, flexible)
    tagged: list[tuple[int, Field, Any]] = []
    for tag, f in plan.tagged.items():
        value = getattr(msg, f.name)
        if value != _default(f):
            tagged.append((tag, f, value))
    if flexible:
        tagged.sort(key=lambda t: t[0])
        _uvarint(out, len(tagged))
        for tag, f, value in tagged:
            body = bytearray()
            _write_field(body, f, value, version, flexible)
            _uvarint(out, tag)
            _uvarint(out, len(body))
            out += body


def _default(f: Field) -> Any:
    if f.kind == "array":
        return None if f.default is None else []
    if f.kind == "struct":
        return None if f.default is None else f.element()
    return f.default


def encode(msg: Message, version: int) -> bytes:
    """The body of ``msg`` at ``version`` (no size prefix, no header)."""
    out = bytearray()
    _write_struct(out, msg, version, version in msg.SCHEMA.flexible)
    return bytes(out)


def encode_segments(head: bytes | bytearray, msg: Message, version: int) -> list[Buffer]:
    """``head`` then the body of ``msg`` at ``version``, as buffers to send in order: the
    :class:`Chunks` of its ``records`` fields as they were given, uncopied. The first buffer is a
    bytearray that starts with ``head`` (so a size in it can be patched)."""
    out = _Segments()
    out += head
    _write_struct(out, msg, version, version in msg.SCHEMA.flexible)
    done, out.done = out.done, []  # out must not hold the list it goes into: a cycle would keep the
    if out:  # batches' bytes alive until a garbage collection
        done.append(out)
    return done


# -- reading ------------------------------------------------------------------------------------


class Reader:
    """A cursor over a frame. Every read checks bounds: a short frame is a DecodeError."""

    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: bytes | memoryview, pos: int = 0) -> None:
        self.buf = memoryview(buf)
        self.pos = pos
        self.end = len(self.buf)

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > self.end:
            raise DecodeError(f"need {n} bytes at offset {self.pos}, frame has {self.end}")
        view = self.buf[self.pos : self.pos + n]
        self.pos += n
        return view

    def fixed(self, s: struct.Struct) -> Any:
        if self.pos + s.size > self.end:
            raise DecodeError(f"need {s.size} bytes at offset {self.pos}, frame has {self.end}")
        (value,) = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return value

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            if self.pos >= self.end:
                raise DecodeError("truncated varint")
            b = self.buf[self.pos]
            self.pos += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 63:
                raise DecodeError("varint longer than 64 bits")

    def length(self, compact: bool, wide: bool) -> int | None:
        n = self.uvarint() - 1 if compact else self.fixed(_I32 if wide else _I16)
        if n < -1:
            raise DecodeError(f"negative length {n}")
        if n > self.end - self.pos:
            raise DecodeError(f"length {n} beyond the frame ({self.end - self.pos} bytes left)")
        return None if n == -1 else int(n)


def _read_value(r: Reader, f: Field, kind: str, version: int, compact: bool) -> Any:
    fixed = _FIXED.get(kind)
    if fixed is not None:
        return r.fixed(fixed)
    if kind == "bool":
        return r.take(1)[0] != 0
    if kind == "string":
        n = r.length(compact, wide=False)
        if n is None:
            if version not in f.nullable:
                raise DecodeError(f"{f.name}: null is not allowed at version {version}")
            return None
        try:
            return str(r.take(n), "utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError(f"{f.name}: not UTF-8: {exc}") from None
    if kind in ("bytes", "records"):
        n = r.length(compact, wide=True)
        if n is None:
            if version not in f.nullable:
                raise DecodeError(f"{f.name}: null is not allowed at version {version}")
            return None
        return bytes(r.take(n))
    if kind == "uuid":
        return uuid.UUID(bytes=bytes(r.take(16)))
    raise AssertionError(f"unknown primitive {kind}")


def _read_field(r: Reader, f: Field, version: int, flexible: bool) -> Any:
    compact = flexible if f.flexible is None else version in f.flexible
    if f.kind == "struct":
        if version in f.nullable and r.fixed(_I8) < 0:
            return None
        return _read_struct(r, f.element, version, flexible)
    if f.kind == "array":
        n = r.length(compact, wide=True)
        if n is None:
            if version not in f.nullable:
                raise DecodeError(f"{f.name}: null is not allowed at version {version}")
            return None
        if isinstance(f.element, str):
            return [_read_value(r, f, f.element, version, compact) for _ in range(n)]
        return [_read_struct(r, f.element, version, flexible) for _ in range(n)]
    return _read_value(r, f, f.kind, version, compact)


def _read_struct(r: Reader, cls: type[M], version: int, flexible: bool) -> M:
    plan = _plan(cls.SCHEMA, version)
    values: dict[str, Any] = {f.name: _read_field(r, f, version, flexible) for f in plan.regular}
    by_tag = plan.tagged
    if flexible:
        for _ in range(r.uvarint()):
            tag = r.uvarint()
            size = r.uvarint()
            tf = by_tag.get(tag)
            if tf is None:  # a tag from a newer schema: skipped, as KIP-482 asks
                r.take(size)
                continue
            sub = Reader(r.take(size))
            values[tf.name] = _read_field(sub, tf, version, flexible)
    return cls(**values)


def decode(cls: type[M], data: bytes | memoryview, version: int) -> M:
    """Decode a whole body; bytes left over are a DecodeError (the frame is not what it claims)."""
    r = Reader(data)
    msg = _read_struct(r, cls, version, version in cls.SCHEMA.flexible)
    if r.pos != r.end:
        raise DecodeError(f"{r.end - r.pos} bytes left over after {cls.SCHEMA.name} v{version}")
    return msg


def decode_request(cls: type[M], data: bytes | memoryview, version: int) -> tuple[M, int]:
    """Decode a request body as Kafka's broker does: its fields in order, bytes after them ignored.

    Returns the message and how many bytes were left over. Kafka's broker (``RequestContext``)
    never checks that a request body was consumed whole, and clients rely on it without knowing:
    librdkafka 2.16 writes an all-topics Metadata v9+ request with the topics count still in its
    4-byte int32 placeholder (``00 00 00 00``) instead of a 1-byte compact null (``00``). Kafka
    reads the first ``00`` as null (all topics), the next two as the booleans, the third as an
    empty tag section and ignores the 3 bytes behind; refusing them made every librdkafka
    ``list_topics()`` and regex subscription fail.
    """
    r = Reader(data)
    msg = _read_struct(r, cls, version, version in cls.SCHEMA.flexible)
    return msg, r.end - r.pos


def decode_from(r: Reader, cls: type[M], version: int) -> M:
    """Decode one struct at the reader's position (a header before the body)."""
    return _read_struct(r, cls, version, version in cls.SCHEMA.flexible)
