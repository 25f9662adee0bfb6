"""Bounds on what a plugin may log: the length of one line and the volume of one call.

The supervisor applies them to every line an instance sends or writes (the worker runs the
plugin's code, so its own truncation is a courtesy): a line longer than ``MAX_LINE_CHARS`` keeps
its start and a marker saying how much was cut; a call's lines beyond ``MAX_CALL_LINES`` or
``MAX_CALL_CHARS`` are dropped, and one marker line says how many when the call ends. Lines no
call owns (import time, background threads) share one budget per ``WINDOW_S`` of the instance.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

#: Characters kept of one log line (a traceback or a JSON dump fits; a 200 MiB string does not).
MAX_LINE_CHARS = 64 << 10
#: Room for the marker: a line the worker already cut is not cut again.
MARKER_CHARS = 100
#: Log volume kept per call: lines and characters, whichever is reached first.
MAX_CALL_LINES = 5_000
MAX_CALL_CHARS = 4 << 20
#: Lines outside any call get the same budget per this many seconds of the instance's life.
WINDOW_S = 60.0


def clip_line(text: str, limit: int = MAX_LINE_CHARS) -> str:
    """``text`` itself, or its first ``limit`` characters and a marker naming how many were cut."""
    if len(text) <= limit + MARKER_CHARS:
        return text
    cut = len(text) - limit
    return f"{text[:limit]}… [truncated {cut:,} characters: a log line keeps at most {limit:,}]"


@dataclass(slots=True)
class _Spent:
    lines: int = 0
    chars: int = 0
    dropped_lines: int = 0
    dropped_chars: int = 0


class LogBudget:
    """Counts each call's log volume; says which lines to keep and what was dropped."""

    def __init__(
        self, max_lines: int = MAX_CALL_LINES, max_chars: int = MAX_CALL_CHARS, window_s: float = WINDOW_S
    ) -> None:
        self.max_lines, self.max_chars, self.window_s = max_lines, max_chars, window_s
        self._spent: dict[str, _Spent] = {}
        self._window_start = time.monotonic()

    def admit(self, call_id: str, chars: int) -> bool:
        """Whether a line of ``chars`` characters of ``call_id`` ("" for none) is kept."""
        spent = self._spent.setdefault(call_id, _Spent())
        if spent.dropped_lines or spent.lines >= self.max_lines or spent.chars + chars > self.max_chars:
            spent.dropped_lines += 1
            spent.dropped_chars += chars
            return False
        spent.lines += 1
        spent.chars += chars
        return True

    def settle(self, call_id: str) -> str | None:
        """Forget ``call_id``'s count; the marker line to log when some of its lines were dropped."""
        spent = self._spent.pop(call_id, None)
        if spent is None or not spent.dropped_lines:
            return None
        what = "this call" if call_id else f"the instance outside calls in {self.window_s:g} s"
        return (
            f"[plugtune dropped {spent.dropped_lines:,} log lines ({spent.dropped_chars:,} characters) of "
            f"{what}: a call keeps at most {self.max_lines:,} lines or {self.max_chars:,} characters "
            "of logs; log less, or summarize with ctx.metric()]"
        )

    def roll_window(self) -> str | None:
        """Start a new window for lines outside calls once the last is over (its marker, if any)."""
        now = time.monotonic()
        if now - self._window_start < self.window_s:
            return None
        self._window_start = now
        return self.settle("")
