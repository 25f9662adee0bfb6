"""Bidi control characters shown, never obeyed: ``⟨U+202E⟩`` instead of a right-to-left override,
so text a plugin or a dataset wrote cannot make ``gnp.exe`` read as ``exe.png``. The
console's pages (``web/templating``, ``console.js``) and the command line (``RevealingStream``)
show them the same way."""

from __future__ import annotations

import re
from typing import Any, TextIO

BIDI_CONTROLS = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def reveal(text: str) -> str:
    """``text`` with every bidi control character replaced by a visible ``⟨U+XXXX⟩``."""
    return BIDI_CONTROLS.sub(lambda m: f"⟨U+{ord(m.group()):04X}⟩", text)


class RevealingStream:
    """A text stream that writes to ``stream`` with bidi controls revealed; anything else (flush,
    isatty, fileno, encoding, ...) is the wrapped stream's."""

    def __init__(self, stream: TextIO) -> None:
        self.wrapped = stream

    def write(self, text: str) -> int:
        self.wrapped.write(reveal(text))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)
