"""The command line shows the bidi controls that a plugin wrote as ``⟨U+202E⟩``, as the console
does (issue 24, item 13): a terminal must not reorder ``gnp.exe`` into ``exe.png``; and the
terminal controls it wrote as ``⟨ESC⟩``: no title, clipboard write or clear screen from a log line.
A real job whose rollout logs such a name and whose grader fails with it; every command that
prints them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from typer.testing import CliRunner

from plugtune.bidi import BIDI_CONTROLS, reveal_for_terminal
from plugtune.cli import app
from plugtune.jobs.control import create_job
from plugtune.jobs.scheduler import run_job
from plugtune.settings import Settings
from plugtune.store import Store
from tests.jobs.jobkit import make_job

pytestmark = pytest.mark.slow

NAME = "report\u202egnp.exe"  # a right-to-left override: a terminal shows "reportexe.png"
SHOWN = "report⟨U+202E⟩gnp.exe"
# a window title, the clipboard (OSC 52), a clear screen and an 8-bit CSI, as the plugin's source writes them
ESCAPES = r"title \x1b]0;pwned\x07 clip \x1b]52;c;ZXZpbA==\x07 clear \x1b[2J csi \x9b2J"
# (written to a pipe, click itself strips CSI sequences such as the clear screen first)
ESCAPES_SHOWN = "title ⟨ESC⟩]0;pwned⟨U+0007⟩ clip ⟨ESC⟩]52;c;ZXZpbA==⟨U+0007⟩ clear"

ROLLOUT = f"""
from plugtune import rollout

@rollout
def answer(ctx, policy, sample):
    ctx.logger.info("saved {NAME}")
    ctx.logger.info("{ESCAPES}")
    policy.chat(sample.messages, max_tokens=2)
"""

GRADER = f"""
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    raise ValueError("cannot open {NAME}")
"""


def test_every_command_reveals_a_plugins_bidi_controls(tmp_path: Path, store: Store, home: Settings) -> None:
    job_file = make_job(tmp_path / "bidi", rollout=ROLLOUT, grader=GRADER, hyper={"steps": 1})
    job_id, invalid = create_job(store, job_file)
    assert invalid is None, invalid
    assert run_job(store, home, job_id, wait_for_retries=False) == "failed"
    runner = CliRunner()
    for args in (["logs", str(job_id)], ["jobs", "show", str(job_id)], ["doctor", str(job_id)]):
        result = runner.invoke(app, args)
        assert SHOWN in result.output, (args, result.output)
        assert not BIDI_CONTROLS.search(result.output), (args, result.output)
        assert not {"\x1b", "\x07", "\x9b"} & set(result.output), (args, result.output)
    logged = runner.invoke(app, ["logs", str(job_id)]).output
    assert ESCAPES_SHOWN in logged and "csi ⟨U+009B⟩2J" in logged, logged  # shown, never obeyed
    as_json = runner.invoke(app, ["jobs", "show", str(job_id), "--json"]).stdout
    assert NAME in json.dumps(json.loads(as_json), ensure_ascii=False)  # JSON keeps the text as it is
    # the installed command, writing to a real pipe
    printed = subprocess.run(
        [sys.executable, "-c", "from plugtune.cli import app; app()", "logs", str(job_id)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert SHOWN in printed and not BIDI_CONTROLS.search(printed), printed
    assert ESCAPES_SHOWN in printed and "\x1b" not in printed, printed


def test_a_terminal_is_given_only_plugtunes_own_styles_and_redraws() -> None:
    """What a terminal (no click stripping) is written: click's colours and rich's live redraw pass;
    every other control a plugin's text holds is shown."""
    styled = click.style("failed", fg="red", bold=True)
    redraw = "\r\x1b[2K\x1b[1A\x1b[2K\x1b[?25l\x1b[3G"
    assert reveal_for_terminal(styled + redraw) == styled + redraw
    hostile = "\x1b[2J\x1b[H\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\\x1bP+q\x1b\\\x00\x08\x7f\x9b31m\u202e"
    shown = reveal_for_terminal(hostile)
    assert not {"\x1b", "\x00", "\x08", "\x7f", "\x9b", "\u202e"} & set(shown), shown
    assert shown.startswith("⟨ESC⟩[2J⟨ESC⟩[H⟨ESC⟩]8;;http://x⟨ESC⟩\\link"), shown
    assert reveal_for_terminal("tab\tand\nnewline") == "tab\tand\nnewline"
