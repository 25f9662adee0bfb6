"""The Jinja2 environment of the pages: autoescape always on, and the filters the templates use.

Text a plugin or a dataset wrote goes through ``clip``: bidi controls are shown as ``⟨U+202E⟩``
(so ``gnp.exe`` with a right-to-left override cannot read as ``exe.png``) and text longer than
``CLIP`` characters is folded behind "show more", so one 100 KB line cannot make a page huge.
"""

from __future__ import annotations

import time
from pathlib import Path

from fastapi.templating import Jinja2Templates
from jinja2 import Environment, FileSystemLoader
from markupsafe import Markup

from plugtune.bidi import reveal

TEMPLATES = Path(__file__).parent / "templates"
CLIP = 2000  # characters of untrusted text shown before "show more" (console.js has the same)


def ts(value: float | None) -> str:
    """Epoch seconds as ``YYYY-MM-DD HH:MM:SS`` in UTC (the console shows UTC everywhere)."""
    if value is None:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(value)))


def clip(value: object, limit: int = CLIP) -> Markup:
    """Untrusted text, escaped and revealed; past ``limit`` characters the rest is behind "show more"."""
    text = reveal("" if value is None else str(value))
    if len(text) <= limit:
        return Markup.escape(text)
    head, rest = text[:limit], text[limit:]
    return Markup(
        '<details class="more"><summary>{}<span class="more-label">… show more ({} more characters)'
        "</span></summary>{}</details>"
    ).format(head, f"{len(rest):,}", rest)


def clip_line(value: object, line_id: int, limit: int = CLIP) -> Markup:
    """A log message: past ``limit`` characters only the head is sent; "show more" loads the line."""
    text = reveal("" if value is None else str(value))
    if len(text) <= limit:
        return Markup.escape(text)
    return Markup(
        '{}… <button type="button" class="show-more" data-line="{}">show more ({} more characters)</button>'
    ).format(text[:limit], line_id, f"{len(text) - limit:,}")


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    total = max(0, round(seconds))
    h, m, s = total // 3600, total % 3600 // 60, total % 60
    return f"{h}h {m:02d}m {s:02d}s" if h else f"{m}m {s:02d}s"


def num(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.4g}"


def _environment() -> Environment:
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True, auto_reload=False)
    env.filters["ts"] = ts
    env.filters["num"] = num
    env.filters["clip"] = clip
    env.filters["clip_line"] = clip_line
    env.filters["reveal"] = reveal  # for attributes (a tooltip), where no "show more" fits
    env.filters["duration"] = duration
    return env


templates = Jinja2Templates(env=_environment())
