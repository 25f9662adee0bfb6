"""What the console's real-browser tests share: Debian's Chromium, uvicorn serving an app on a
free 127.0.0.1 port, a page that records every page error and console error (the test fails on
any), and the README's screenshots (``PLUGTUNE_SCREENSHOTS=docs/screenshots`` writes them there,
otherwise to a temp folder). The ``browser`` fixture itself is in ``conftest.py``.
"""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from plugtune.gateway.serving import ThreadedServer

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
SHOTS = Path(os.environ.get("PLUGTUNE_SCREENSHOTS") or tempfile.mkdtemp(prefix="plugtune-shots-"))

needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="Debian's chromium is not installed at /usr/bin/chromium"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """``app`` served by uvicorn on a thread; yields its base URL."""
    server = ThreadedServer("test-console", "the test's console")
    port = server.start(app, "127.0.0.1", 0, timeout_s=60)  # a busy machine starts it slowly
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def open_page(browser: Any, *, timeout_ms: int = 30_000, dialogs_fail: bool = False, **context: Any) -> Any:
    """A page in a context of its own (``context``: Playwright's options, 1400x900 by default);
    ``page.problems`` collects page errors, console errors and, with ``dialogs_fail``, any dialog
    (then dismissed). Close it with ``page.context.close()`` and assert ``page.problems == []``."""
    opened = browser.new_context(**{"viewport": {"width": 1400, "height": 900}, **context}).new_page()
    opened.set_default_timeout(timeout_ms)
    problems: list[str] = []
    if dialogs_fail:
        opened.on("dialog", lambda d: (problems.append(f"dialog fired: {d.message}"), d.dismiss()))
    opened.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    opened.on("console", lambda m: m.type == "error" and problems.append(f"console error: {m.text}"))
    opened.problems = problems
    return opened


@contextmanager
def checked_page(browser: Any, **options: Any) -> Iterator[Any]:
    """``open_page``'s page, closed on exit, failing the test on any problem it saw."""
    opened = open_page(browser, **options)
    yield opened
    opened.context.close()
    assert opened.problems == [], opened.problems


def shot(page: Any, name: str, **options: Any) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / name), **options)
