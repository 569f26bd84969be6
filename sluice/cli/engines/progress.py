"""A one-line progress display on stderr for long commands (demo, bench, produce).

On a terminal the line is rewritten in place a few times a second; when stderr
is a file or a pipe (CI logs) a full line is printed every few seconds
instead, so logs stay readable. Stdout is never touched: it carries data.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(
        self,
        label: str,
        total: int | None = None,
        unit: str = "records",
        *,
        stream: TextIO | None = None,
        enabled: bool = True,
    ) -> None:
        self.label = label
        self.total = total
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = 0.25 if self.tty else 5.0
        self.start = time.monotonic()
        self._last = 0.0
        self._width = 0
        self._done: int | None = None
        self._extra = ""

    def update(self, done: int, extra: str = "", *, force: bool = False) -> None:
        if not self.enabled:
            return
        self._done, self._extra = done, extra
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        elapsed = now - self.start
        rate = done / elapsed if elapsed > 0 else 0.0
        of = f"/{self.total:,}" if self.total else ""
        pct = f" ({100.0 * done / self.total:5.1f}%)" if self.total else ""
        line = f"{self.label}: {done:,}{of} {self.unit}{pct}, {rate:,.0f}/s, {elapsed:.1f}s"
        if extra:
            line += f", {extra}"
        self._write(line)

    def message(self, text: str) -> None:
        """A line of its own (the progress line, if any, continues below it)."""
        if not self.enabled:
            return
        self._write(text)
        if self.tty:
            self.stream.write("\n")
            self._width = 0

    def close(self, final: str | None = None) -> None:
        """End the line; shows ``final``, else the last count (so logs always get the end state)."""
        if not self.enabled:
            return
        if final is not None:
            self._write(final)
        elif self._done is not None:
            self.update(self._done, self._extra, force=True)
        if self.tty and self._width:
            self.stream.write("\n")
        self.stream.flush()
        self._width = 0

    def _write(self, line: str) -> None:
        if self.tty:
            pad = max(0, self._width - len(line))
            self.stream.write("\r" + line + " " * pad)
            self._width = len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
