"""Bidi control characters shown, never obeyed: ``⟨U+202E⟩`` instead of a right-to-left override,
so text a plugin or a dataset wrote cannot make ``gnp.exe`` read as ``exe.png``. The
console's pages (``web/templating``, ``console.js``) and the command line (``RevealingStream``)
show them the same way.

On the command line a terminal obeys more than bidi controls: an escape sequence in a plugin's log
line could set the window title, write the clipboard (OSC 52), hide text or clear the screen. So
``RevealingStream`` also shows every other control character (``⟨ESC⟩``, ``⟨U+0007⟩``, the C1
controls) except newline, tab and carriage return, letting through only the sequences plugtune's
own output is styled and redrawn with: SGR colours (``ESC[...m``), erase line (``ESC[2K``), cursor
up and to a column (``ESC[nA``, ``ESC[nG``) and cursor hide/show (``ESC[?25l``/``h``)."""

from __future__ import annotations

import re
from typing import Any, TextIO

BIDI_CONTROLS = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def reveal(text: str) -> str:
    """``text`` with every bidi control character replaced by a visible ``⟨U+XXXX⟩``."""
    return BIDI_CONTROLS.sub(lambda m: f"⟨U+{ord(m.group()):04X}⟩", text)


#: What plugtune's own terminal output is made of (click's styles, rich's live progress bar).
OWN_SEQUENCES = r"\x1b\[[0-9;]*m|\x1b\[2K|\x1b\[[0-9]*[AG]|\x1b\[\?25[lh]"
TERMINAL_CONTROLS = re.compile(rf"({OWN_SEQUENCES})|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def reveal_for_terminal(text: str) -> str:
    """``text`` with bidi controls and every terminal control but newline, tab, carriage return and
    :data:`OWN_SEQUENCES` shown (``⟨ESC⟩``, ``⟨U+0007⟩``), never obeyed."""

    def shown(match: re.Match[str]) -> str:
        if match.group(1):
            return match.group(1)
        char = match.group()
        return "⟨ESC⟩" if char == "\x1b" else f"⟨U+{ord(char):04X}⟩"

    return reveal(TERMINAL_CONTROLS.sub(shown, text))


class RevealingStream:
    """A text stream that writes to ``stream`` with bidi and terminal controls revealed
    (:func:`reveal_for_terminal`); anything else (flush, isatty, fileno, encoding, ...) is the
    wrapped stream's."""

    def __init__(self, stream: TextIO) -> None:
        self.wrapped = stream

    def write(self, text: str) -> int:
        self.wrapped.write(reveal_for_terminal(text))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)
