"""The command line shows the bidi controls that a plugin wrote as ``⟨U+202E⟩``, as the console
does (issue 24, item 13): a terminal must not reorder ``gnp.exe`` into ``exe.png``. A real job whose
rollout logs such a name and whose grader fails with it; every command that prints them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plugtune.bidi import BIDI_CONTROLS
from plugtune.cli import app
from plugtune.jobs.control import create_job
from plugtune.jobs.scheduler import run_job
from plugtune.settings import Settings
from plugtune.store import Store
from tests.jobs.jobkit import make_job

pytestmark = pytest.mark.slow

NAME = "report\u202egnp.exe"  # a right-to-left override: a terminal shows "reportexe.png"
SHOWN = "report⟨U+202E⟩gnp.exe"

ROLLOUT = f"""
from plugtune import rollout

@rollout
def answer(ctx, policy, sample):
    ctx.logger.info("saved {NAME}")
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
