"""The Jinja2 environment of the pages: autoescape always on, and the filters the templates use."""

from __future__ import annotations

import time
from pathlib import Path

from fastapi.templating import Jinja2Templates
from jinja2 import Environment, FileSystemLoader

TEMPLATES = Path(__file__).parent / "templates"


def ts(value: float | None) -> str:
    """Epoch seconds as ``YYYY-MM-DD HH:MM:SS`` in UTC (the console shows UTC everywhere)."""
    if value is None:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(value)))


def num(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.4g}"


def _environment() -> Environment:
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True, auto_reload=False)
    env.filters["ts"] = ts
    env.filters["num"] = num
    return env


templates = Jinja2Templates(env=_environment())
