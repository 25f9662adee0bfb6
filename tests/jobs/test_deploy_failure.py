"""A plugin that cannot be deployed (a syntax error, setup() raising) fails the job with its Create faas
fault: that plugin is `failed` with the reason and the user's line, its code is on its tab, the
plugins never deployed say so (none stays `waiting`), and the banner's Plugin link opens the tab."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from plugtune.jobs.control import create_job
from plugtune.jobs.scheduler import run_job
from plugtune.settings import Settings
from plugtune.store import Store
from plugtune.web import create_app
from tests.jobs.jobkit import make_job

pytestmark = pytest.mark.slow

BASE_URL = "http://127.0.0.1:8321"  # a name the console answers to

SYNTAX_ERROR = """
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    return 1.0 if trajectory.completion.strip() == sample.extra["answer"] else 0.0 +
"""

SETUP_RAISES = """
from plugtune import rollout

def setup():
    raise RuntimeError("the tool server is not configured")

@rollout
def answer(ctx, policy, sample):
    policy.chat(sample.messages, max_tokens=sample.sampling.max_tokens)
"""


def _failed_job(store: Store, home: Settings, job_file: Path) -> int:
    job_id, invalid = create_job(store, job_file)
    assert invalid is None, invalid
    assert run_job(store, home, job_id) == "failed"
    return job_id


def _check_banner_link(store: Store, job_id: int, plugin: str, shown: str) -> None:
    with TestClient(create_app(store), base_url=BASE_URL) as client:
        page = client.get(f"/jobs/{job_id}")
        assert page.status_code == 200
        link = f"/jobs/{job_id}/plugins?plugin={plugin}"
        assert f'href="{link}"' in page.text
        tab = client.get(link)
        assert tab.status_code == 200, tab.text[:500]
        assert "Create faas fault" in tab.text and shown in tab.text


def test_a_grader_with_a_syntax_error_fails_the_job_with_its_code_and_line(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    job_id = _failed_job(store, home, make_job(tmp_path / "syntax", grader=SYNTAX_ERROR))
    job = store.get_job(job_id)
    assert job is not None and job.error is not None
    assert (job.error.type, job.error.cause) == ("Call plugin error", "Create faas fault")
    assert job.error.evidence["plugin"] == "exact"  # its name in job.yaml, not its file path
    assert "grader.py" in job.error.evidence["traceback"] and "line 6" in job.error.evidence["traceback"]
    assert job.next_retry_at is None  # the same code fails the same way: no automatic retry
    plugins = {p.name: p for p in store.list_plugins(job_id)}
    grader = plugins["exact"]
    assert grader.status == "failed" and grader.ended_at is not None
    assert grader.failure_reason.startswith("Create faas fault [exact]")
    assert grader.code_hash, "the code that failed to deploy is stored"
    assert "else 0.0 +" in store.get_code(grader.code_hash)["grader.py"].decode()
    assert plugins["answer"].status in ("completed", "not started")
    assert not any(p.status in ("waiting", "running") for p in plugins.values())
    _check_banner_link(store, job_id, "exact", "else 0.0 +")


def test_a_rollout_whose_setup_raises_fails_the_job_and_the_grader_never_starts(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    job_id = _failed_job(store, home, make_job(tmp_path / "setup", rollout=SETUP_RAISES))
    job = store.get_job(job_id)
    assert job is not None and job.error is not None
    assert (job.error.cause, job.error.evidence["plugin"]) == ("Create faas fault", "answer")
    assert "the tool server is not configured" in job.error.message + job.error.evidence["traceback"]
    assert "rollout.py" in job.error.evidence["traceback"]
    plugins = {p.name: p for p in store.list_plugins(job_id)}
    assert plugins["answer"].status == "failed" and "Create faas fault" in plugins["answer"].failure_reason
    assert "def setup" in store.get_code(plugins["answer"].code_hash)["rollout.py"].decode()
    assert plugins["exact"].status == "not started" and plugins["exact"].ended_at is not None
    _check_banner_link(store, job_id, "answer", "the tool server is not configured")
