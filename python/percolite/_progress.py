"""A small progress display for long waits: a line on a terminal's stderr, or
a text widget-free line in notebooks (no extra dependencies)."""

from __future__ import annotations

import sys
import time
from typing import Any


class Progress:
    """Shows ``label: N`` and the rate it falls at; ``enabled`` may be True,
    False, or "auto" (only when stderr is a terminal)."""

    def __init__(self, label: str, enabled: Any = "auto", stream: Any = None) -> None:
        self.stream = stream or sys.stderr
        if enabled == "auto":
            enabled = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.enabled = bool(enabled)
        self.label = label
        self.started = time.monotonic()
        self.first: int | None = None
        self.last_draw = 0.0
        self.drawn = False

    def update(self, value: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if self.first is None:
            self.first = value
        if self.drawn and now - self.last_draw < 0.2 and value:
            return
        elapsed = now - self.started
        rate = (self.first - value) / elapsed if elapsed > 0 and self.first is not None else 0.0
        text = f"\r{self.label}: {value:>10,}  ({rate:,.0f}/s, {elapsed:,.1f} s)"
        self.stream.write(text)
        self.stream.flush()
        self.last_draw = now
        self.drawn = True

    def close(self) -> None:
        if self.enabled and self.drawn:
            self.stream.write("\n")
            self.stream.flush()
