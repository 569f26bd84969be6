"""The /metrics HTTP endpoint, served on the broker's own asyncio loop.

Why not prometheus_client's ``start_http_server``: it serves from a thread,
and the collectors read the broker's structures (dicts of partitions, groups,
transactions) that the loop changes between awaits; reading them from another
thread could see them mid-change. Served on the loop, a scrape runs between
two steps of the broker like any request. The exposition itself is
prometheus_client's (``choose_encoder`` picks the text format or OpenMetrics
from the Accept header); this module only speaks the little HTTP/1.1 that
Prometheus needs: ``GET /metrics``, one response, then close.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

Render = Callable[[str], Awaitable[tuple[bytes, str]]]  # Accept header -> (body, content type)

MAX_HEAD_BYTES = 16 * 1024
READ_TIMEOUT_S = 10.0


def _response(status: str, content_type: str, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


async def _handle(render: Render, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            return
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split()
        headers = {}
        for line in lines[1:]:
            key, sep, value = line.partition(":")
            if sep:
                headers[key.strip().lower()] = value.strip()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            writer.write(_response("400 Bad Request", "text/plain", b"not an HTTP request\n"))
        elif parts[0] != "GET":
            writer.write(_response("405 Method Not Allowed", "text/plain", b"only GET /metrics\n"))
        elif parts[1].split("?", 1)[0] != "/metrics":
            writer.write(_response("404 Not Found", "text/plain", b"metrics are at /metrics\n"))
        else:
            try:
                body, content_type = await render(headers.get("accept", ""))
                writer.write(_response("200 OK", content_type, body))
            except Exception:
                log.exception("metrics: rendering a scrape failed")
                writer.write(_response("500 Internal Server Error", "text/plain", b"rendering the metrics failed\n"))
        with contextlib.suppress(ConnectionError):
            await writer.drain()
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def start_metrics_server(host: str, port: int, render: Render) -> asyncio.Server:
    """Serve ``GET /metrics`` on ``host:port`` (the caller closes the returned server)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _handle(render, reader, writer)

    return await asyncio.start_server(handle, host, port, limit=MAX_HEAD_BYTES, reuse_address=True)
