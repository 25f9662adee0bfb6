"""The console's steps by code (attempt -> code hash -> step range), the diff between two attempts'
plugin code (escaped like every plugin text), and a retry with new code through the API (which
`plugtune jobs retry --code DIR --server URL` posts to) and the job page's form."""

from __future__ import annotations

import io
import shutil
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.jobs.control import create_job
from plugtune.jobs.revision import set_hash
from plugtune.jobs.scheduler import run_job
from plugtune.settings import Settings
from plugtune.store import Store
from plugtune.web import create_app
from tests.jobs.jobkit import make_job
from tests.jobs.test_retry_with_code import BROKEN, FIXED, LINT_BROKEN, RAISES_ELSEWHERE
from tests.web.browsing import checked_page, needs_chromium, serving
from tests.web.conftest import BASE_URL

runner = CliRunner()

OLD = b"def exact(ctx, sample, trajectory):\n    return 0.25\n"
#: What a plugin may write: markup, and a right-to-left override that would reverse what follows.
NEW = (
    b"def exact(ctx, sample, trajectory):\n"
    b"    # <script>alert(1)</script> \xe2\x80\xaegnp.exe\n"
    b"    return 0.75\n"
)


def _two_attempts(store: Store) -> int:
    """A job whose attempt 1 ran steps 1-2 under OLD and attempt 2 (retried with --code) steps 3-4."""
    rollout = {"rollout.py": b"def answer(ctx, policy, sample):\n    return None\n"}
    hashes = {}
    for name, files in (("rollout", rollout), ("old", {"grader.py": OLD}), ("new", {"grader.py": NEW})):
        hashes[name] = f"{name}-hash".ljust(64, "0")
        store.put_code(hashes[name], files)

    def kept(name: str, file: str, path: str) -> dict[str, str]:
        return {"code_hash": hashes[name], "file": file, "path": path}

    submitted = {
        "plugins/rollout.py": kept("rollout", "rollout.py", "/p/plugins/rollout.py"),
        "plugins/grader.py": kept("old", "grader.py", "/p/plugins/grader.py"),
    }
    revised = {**submitted, "plugins/grader.py": kept("new", "grader.py", "/q/plugins/grader.py")}
    job_id = store.create_job("coded", {"job_file": "/p/job.yaml", "submitted": {"plugins": submitted}})
    first = store.start_attempt(job_id, None, 0)
    store.record_attempt_code(job_id, first, set_hash(submitted), submitted, "submitted")
    store.end_attempt(job_id, first, "failed")
    second = store.start_attempt(job_id, None, 2)
    store.record_attempt_code(job_id, second, set_hash(revised), revised, "/q")
    store.end_attempt(job_id, second, "succeeded")
    store.update_job(job_id, steps_done=4, steps_total=4)
    return job_id


def test_the_steps_by_code_and_the_diff_are_shown_escaped(store: Store) -> None:
    job_id = _two_attempts(store)
    console = TestClient(create_app(store), base_url=BASE_URL)
    spans = console.get(f"/api/jobs/{job_id}/code").json()["attempts"]
    assert [(s["attempt"], s["first_step"], s["last_step"], s["source"]) for s in spans] == [
        (1, 1, 2, "submitted"),
        (2, 3, 4, "/q"),
    ]
    assert spans[0]["code_hash"] != spans[1]["code_hash"] and spans[0]["diff_url"] == ""
    assert spans[1]["diff_url"] == f"/jobs/{job_id}/code/diff?a=1&b=2"

    diff = console.get(f"/api/jobs/{job_id}/code/diff", params={"a": 1, "b": 2}).json()
    assert diff["code_hash_a"] == spans[0]["code_hash"] and diff["code_hash_b"] == spans[1]["code_hash"]
    assert "--- a/plugins/grader.py\n+++ b/plugins/grader.py\n" in diff["diff"]
    assert "-    return 0.25\n" in diff["diff"] and "+    # <script>alert(1)</script>" in diff["diff"]
    assert "rollout.py" not in diff["diff"]  # the same in both

    page = console.get(f"/jobs/{job_id}/code/diff", params={"a": 1, "b": 2})
    assert page.status_code == 200
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text and "<script>alert" not in page.text
    assert "⟨U+202E⟩gnp.exe" in page.text and "\u202e" not in page.text
    assert '<span class="diff-add">+    return 0.75</span>' in page.text
    assert '<span class="diff-del">-    return 0.25</span>' in page.text

    job_page = console.get(f"/jobs/{job_id}").text
    assert 'id="code-spans"' in job_page and f'href="/jobs/{job_id}/code/diff?a=1&amp;b=2"' in job_page
    assert spans[1]["code_hash"][:12] in job_page and "3–4" in job_page
    assert 'id="retry-code-form"' not in job_page  # succeeded: nothing to retry

    same = console.get(f"/api/jobs/{job_id}/code/diff", params={"a": 2, "b": 2}).json()
    assert same["diff"] == ""
    missing = console.get(f"/api/jobs/{job_id}/code/diff", params={"a": 1, "b": 9})
    assert missing.status_code == 404 and "has no attempt 9" in missing.json()["detail"]


def _zipped(folder: Path) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                archive.write(path, path.relative_to(folder))
    return out.getvalue()


@pytest.mark.slow
def test_a_retry_with_new_code_through_the_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLUGTUNE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("PLUGTUNE_DATABASE_URL", f"sqlite:///{tmp_path / 'state' / 'plugtune.db'}")
    home = Settings.from_env()
    store = Store.open(home.database_url)
    project = tmp_path / "task"
    job_id, invalid = create_job(store, make_job(project, grader=BROKEN, hyper={"steps": 3}))
    assert invalid is None and run_job(store, home, job_id) == "failed"
    retried: list[str] = []
    console = TestClient(create_app(store, home=home.home, on_retry=retried.append), base_url=BASE_URL)
    assert 'id="retry-code-form"' in console.get(f"/jobs/{job_id}").text

    before = store.get_job(job_id)
    lint = [("project_files", ("plugins/grader.py", textwrap.dedent(LINT_BROKEN).encode()))]
    lint += [("project_files", ("plugins/rollout.py", (project / "plugins" / "rollout.py").read_bytes()))]
    refused = console.post(f"/api/jobs/{job_id}/retry", files=lint)
    assert refused.status_code == 422, refused.text
    body = refused.json()
    assert "plugtune lint" in body["detail"] and "nothing was changed" in body["detail"]
    (problem,) = body["problems"]
    assert problem["message"].startswith("plugins/grader.py:") and "PT203" in problem["message"]
    assert str(home.home) not in refused.text  # the server's upload folder is not shown
    after = store.get_job(job_id)
    assert after is not None and before is not None
    assert (after.status, after.spec) == ("failed", before.spec) and retried == []

    # The command line posts to the same endpoint (jobs retry --code DIR --server URL).
    raising = tmp_path / "raising"
    shutil.copytree(project, raising)
    (raising / "plugins" / "grader.py").write_text(textwrap.dedent(RAISES_ELSEWHERE))
    fixed = tmp_path / "fixed"
    shutil.copytree(project, fixed)
    (fixed / "plugins" / "grader.py").write_text(textwrap.dedent(FIXED))
    with serving(create_app(store, home=home.home, on_retry=retried.append)) as base:
        command = ["jobs", "retry", str(job_id), "--server", base, "--code"]
        refused_cli = runner.invoke(app, [*command, str(raising)])
        assert refused_cli.exit_code == 1, refused_cli.output
        assert "quick test" in refused_cli.output and "KeyError" in refused_cli.output
        assert store.get_job(job_id).status == "failed" and retried == []  # type: ignore[union-attr]
        queued = runner.invoke(app, [*command, str(fixed)])
        assert queued.exit_code == 0, queued.output
    assert f"job {job_id} is queued again, with code" in queued.output and "tested: s2" in queued.output
    assert retried == [str(job_id)]
    assert run_job(store, home, job_id) == "succeeded"

    spans = console.get(f"/api/jobs/{job_id}/code").json()["attempts"]
    assert [(s["first_step"], s["last_step"], s["source"]) for s in spans] == [
        (1, 1, "submitted"),
        (2, 3, "upload"),
    ]
    diff = console.get(spans[1]["diff_url"]).text
    assert "+        return 0.75" in diff and "broken at step" in diff
    plain = console.post(f"/api/jobs/{job_id}/retry")  # succeeded: a plain retry is still refused
    assert plain.status_code == 409
    store.close()


@pytest.mark.slow
@pytest.mark.browser
@needs_chromium
def test_the_job_page_retries_with_an_uploaded_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, browser: Any
) -> None:
    monkeypatch.setenv("PLUGTUNE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("PLUGTUNE_DATABASE_URL", f"sqlite:///{tmp_path / 'state' / 'plugtune.db'}")
    home = Settings.from_env()
    store = Store.open(home.database_url)
    project = tmp_path / "task"
    job_id, invalid = create_job(store, make_job(project, grader=BROKEN, hyper={"steps": 3}))
    assert invalid is None and run_job(store, home, job_id) == "failed"
    archives = {}
    for name, grader in (("lint", LINT_BROKEN), ("fixed", FIXED)):
        shutil.copytree(project, tmp_path / name)
        (tmp_path / name / "plugins" / "grader.py").write_text(textwrap.dedent(grader))
        archives[name] = {
            "name": f"{name}.zip",
            "mimeType": "application/zip",
            "buffer": _zipped(tmp_path / name),
        }
    with serving(create_app(store, home=home.home)) as base, checked_page(browser) as page:
        page.goto(f"{base}/jobs/{job_id}")
        page.locator("#retry-code-archive").set_input_files(archives["lint"])
        page.click("#retry-code-button")
        problem = page.locator("#retry-code-problems li").first
        problem.wait_for()
        assert "PT203" in problem.inner_text() and "plugins/grader.py" in problem.inner_text()
        assert "plugtune lint" in page.locator("#retry-code-result .notice").inner_text()
        assert store.get_job(job_id).status == "failed"  # type: ignore[union-attr]
        page.problems.clear()  # the browser logs the expected 422
        page.locator("#retry-code-archive").set_input_files(archives["fixed"])
        page.click("#retry-code-button")
        page.wait_for_url(f"**/jobs/{job_id}?retried=1", timeout=60_000)
        assert store.get_job(job_id).status == "queued"  # type: ignore[union-attr]
        assert page.locator("#flash").inner_text().startswith("Retry requested")
    store.close()
