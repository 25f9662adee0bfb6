"""A hostile or careless user of `plugtune jobs retry ID --code DIR`, of `POST /api/jobs/{id}/retry`
with the project uploaded, and of the diff between two attempts' code.

Each test sends what such a user sent (a --code folder with links out of it or too many files, an
upload that unpacks to more than a snapshot keeps, two retries at once, code whose file names or
contents would forge or swamp the diff) through the real command, app and store, and asserts a
clear refusal naming the file (or a bounded, escaped answer) with nothing of the job changed.
"""

from __future__ import annotations

import io
import os
import random
import shutil
import textwrap
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.jobs import remote, revision
from plugtune.jobs.control import create_job
from plugtune.jobs.revision import MAX_DIFF_CHARS, MAX_DIFF_LINE_CHARS, RevisionError, set_hash
from plugtune.jobs.scheduler import run_job
from plugtune.runtime import snapshot
from plugtune.settings import Settings
from plugtune.store import Store
from plugtune.web import create_app
from tests.jobs.jobkit import make_job
from tests.jobs.test_retry_with_code import BROKEN, FIXED
from tests.web.browsing import serving
from tests.web.conftest import BASE_URL

runner = CliRunner()


def _failed_job(project: Path, store: Store, home: Settings) -> int:
    job_id, invalid = create_job(store, make_job(project, grader=BROKEN, hyper={"steps": 3}))
    assert invalid is None and run_job(store, home, job_id) == "failed"
    return job_id


def _fixed_copy(project: Path, target: Path) -> Path:
    shutil.copytree(project, target)
    (target / "plugins" / "grader.py").write_text(textwrap.dedent(FIXED))
    return target


def _unchanged(store: Store, job_id: int) -> tuple[Any, ...]:
    job = store.get_job(job_id)
    assert job is not None
    return job.status, job.spec, len(store.list_transitions(job_id)), len(store.list_attempts(job_id))


@pytest.mark.slow
def test_a_code_folder_a_snapshot_cannot_keep_is_refused_by_name_before_its_code_runs(
    tmp_path: Path, home: Settings, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A link out of the plugin's folder (to the store's database, or the plugin file itself to a
    file elsewhere) and a folder over the snapshot's bounds were found only after the lint and the
    quick test, by the sandbox's deploy: a PluginCallError traceback, no problem named."""
    project = tmp_path / "task"
    job_id = _failed_job(project, store, home)
    before = _unchanged(store, job_id)

    to_db = _fixed_copy(project, tmp_path / "to-db")
    os.symlink(home.home / "plugtune.db", to_db / "plugins" / "notes.sqlite")
    elsewhere = tmp_path / "elsewhere.py"
    elsewhere.write_text(textwrap.dedent(FIXED))
    linked = _fixed_copy(project, tmp_path / "linked")
    (linked / "plugins" / "grader.py").unlink()
    os.symlink(elsewhere, linked / "plugins" / "grader.py")
    many = _fixed_copy(project, tmp_path / "many")
    monkeypatch.setattr(snapshot, "MAX_FILES", 20)  # the bound, smaller: the same check
    for i in range(25):
        (many / "plugins" / f"table{i}.txt").write_text("x")

    for folder, named, what in (
        (to_db, "notes.sqlite", "is a symlink to"),
        (linked, "grader.py", "is a symlink to"),
        (many, "plugins", "holds more than 20 files"),
    ):
        result = runner.invoke(app, ["jobs", "retry", str(job_id), "--code", str(folder)])
        assert result.exit_code == 1, (folder.name, result.output, result.exception)
        assert isinstance(result.exception, SystemExit), result.exception  # no traceback
        assert "nothing was changed" in result.output and "cannot be kept with the job" in result.output
        assert named in result.output and what in result.output, result.output
        assert "quick test" not in result.output  # refused before the code ran
        assert _unchanged(store, job_id) == before


@pytest.mark.slow
def test_a_plugin_named_by_an_absolute_path_is_refused_not_read_from_disk(
    tmp_path: Path, home: Settings, store: Store
) -> None:
    """job.yaml's `entry: /abs/plugins/grader.py:exact` made `DIR / file` the file on disk: --code DIR
    was ignored for it (the original file, edited in place or not, ran as "DIR's" code)."""
    project = tmp_path / "task"
    job_file = make_job(project, grader=BROKEN, hyper={"steps": 3})
    absolute = str(project / "plugins" / "grader.py")
    job_file.write_text(job_file.read_text().replace("plugins/grader.py", absolute))
    job_id, invalid = create_job(store, job_file)
    assert invalid is None and run_job(store, home, job_id) == "failed"
    before = _unchanged(store, job_id)
    (project / "plugins" / "grader.py").write_text(textwrap.dedent(FIXED))  # fixed in place, not in DIR
    fixed = _fixed_copy(project, tmp_path / "fixed")
    result = runner.invoke(app, ["jobs", "retry", str(job_id), "--code", str(fixed)])
    assert result.exit_code == 1, result.output
    assert f"job.yaml names plugin file {absolute} by its absolute path" in result.output, result.output
    assert "retry without --code" in result.output and "nothing was changed" in result.output
    assert _unchanged(store, job_id) == before


@pytest.mark.slow
def test_an_upload_that_unpacks_past_the_snapshot_bound_is_a_422_naming_the_plugin(
    tmp_path: Path, home: Settings, store: Store
) -> None:
    """A 100 KiB zip unpacking to a 65 MiB file in the plugin's folder (within the upload's 256 MiB
    bound, over the snapshot's 64 MiB) was a 500 Internal Server Error."""
    project = tmp_path / "task"
    job_id = _failed_job(project, store, home)
    before = _unchanged(store, job_id)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("plugins/grader.py", textwrap.dedent(FIXED))
        archive.writestr("plugins/rollout.py", (project / "plugins" / "rollout.py").read_bytes())
        archive.writestr("plugins/weights.bin", b"\0" * (65 << 20))
    assert len(out.getvalue()) < 200 << 10
    console = TestClient(create_app(store, home=home.home), base_url=BASE_URL, raise_server_exceptions=False)
    answer = console.post(f"/api/jobs/{job_id}/retry", files=[("project", ("p.zip", out.getvalue()))])
    assert answer.status_code == 422, answer.text
    problems = answer.json()["problems"]
    assert {p["file"] for p in problems} == {"plugins/grader.py", "plugins/rollout.py"}, problems
    assert all("64 MiB" in p["message"] and p["field"] == "plugins" for p in problems), problems
    assert str(home.home) not in answer.text  # the server's upload folder is not shown
    assert _unchanged(store, job_id) == before
    assert not list((home.home / "submissions").iterdir())  # the unpacked upload is gone


@pytest.mark.slow
def test_two_retries_at_once_keep_the_code_of_the_one_that_queued_the_job(
    tmp_path: Path, home: Settings, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second of two racing retries wrote its code into the job already queued with the first's
    (the job ran code its user was never told about) and then failed with IllegalTransitionError."""
    project = tmp_path / "task"
    job_id = _failed_job(project, store, home)
    first = revision.read(store, job_id, _fixed_copy(project, tmp_path / "first"))
    second_dir = _fixed_copy(project, tmp_path / "second")
    (second_dir / "plugins" / "grader.py").write_text(textwrap.dedent(FIXED).replace("0.75", "0.5"))
    second = revision.read(store, job_id, second_dir)
    keep = revision.keep
    raced: list[str] = []

    def keep_while_the_other_commits(s: Store, found: revision.Revision) -> dict[str, dict[str, Any]]:
        kept = keep(s, found)
        if found is first:  # the other retry is committed between this one's checks and its write
            raced.append(revision.commit(s, second))
        return kept

    monkeypatch.setattr(revision, "keep", keep_while_the_other_commits)
    with pytest.raises(RevisionError, match="is queued now .*this code was not applied"):
        revision.commit(store, first)
    job = store.get_job(job_id)
    assert job is not None and job.status == "queued"
    assert job.spec[revision.KEY]["code_hash"] == raced[0]  # the retry that queued it: its code
    assert job.spec[revision.KEY]["source"] == str(second_dir)
    assert [t.to_status for t in store.list_transitions(job_id)].count("queued") == 2  # submit, retry


@pytest.mark.slow
def test_a_remote_retry_waits_for_the_quick_test_and_says_what_a_timeout_means(
    tmp_path: Path, home: Settings, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`jobs retry --code DIR --server URL` gave up after the plain request timeout (120 s), shorter
    than the server's quick test (two groups, each call up to its timeout_s: 121 s measured for a
    grader that hangs), said "try again later", and the server queued the retry anyway."""
    project = tmp_path / "task"
    job_id = _failed_job(project, store, home)
    slow = _fixed_copy(project, tmp_path / "slow")
    grader = slow / "plugins" / "grader.py"
    grader.write_text(
        "import time\n" + grader.read_text().replace("return 0.75", "time.sleep(2)\n        return 0.75")
    )
    monkeypatch.setattr(remote, "TIMEOUT_S", 1.0)  # a request timeout shorter than the check
    retried: list[str] = []
    with serving(create_app(store, home=home.home, on_retry=retried.append)) as base:
        command = ["jobs", "retry", str(job_id), "--server", base, "--code", str(slow)]
        queued = runner.invoke(app, command)
        assert queued.exit_code == 0, (queued.output, queued.exception)
        assert f"job {job_id} is queued again, with code" in queued.output and retried == [str(job_id)]
        store.transition(job_id, "cancelled", "test: retry it again")
        monkeypatch.setattr(remote, "CODE_TIMEOUT_S", 1.0)  # a server slower than the client waits
        late = runner.invoke(app, command)
        assert late.exit_code == 2, late.output
        assert "did not answer within 1 s; it may still be checking the new code" in late.output
        assert f"{base}/jobs/{job_id}" in late.output
        for _ in range(300):  # it did: the server's answer came after the client left
            if retried == [str(job_id)] * 2:
                break
            time.sleep(0.1)
        assert retried == [str(job_id)] * 2


def _coded_job(store: Store, old: dict[str, bytes], new: dict[str, bytes]) -> int:
    """A job whose attempt 1 ran plugins/ as ``old`` and attempt 2 as ``new``."""
    sets = {}
    for name, files in (("old", old), ("new", new)):
        code_hash = snapshot.content_hash(files)
        store.put_code(code_hash, files)
        sets[name] = {"plugins/grader.py": {"code_hash": code_hash, "file": "grader.py", "path": "/p"}}
    job_id = store.create_job("coded", {"job_file": "/p/job.yaml", "submitted": {"plugins": sets["old"]}})
    for number, (name, start) in enumerate((("old", 0), ("new", 1)), 1):
        attempt = store.start_attempt(job_id, None, start)
        assert attempt == number
        store.record_attempt_code(job_id, attempt, set_hash(sets[name]), sets[name], name)
        store.end_attempt(job_id, attempt, "failed")
    store.update_job(job_id, steps_done=2)
    return job_id


def test_file_names_cannot_forge_diff_lines_and_equal_sized_binaries_still_differ(store: Store) -> None:
    """A file name with a newline wrote lines of its own into the diff (a forged `+++` header and
    `+` line on the page); a binary file changed to another of the same size showed no change."""
    forged = "x.py\n+++ b/plugins/grader.py\n+    return 1.0  # <script>alert(1)</script>"
    old = {"grader.py": b"a = 1\n", "model.bin": b"\0\1\2\3"}
    new = {"grader.py": b"a = 1\n", "model.bin": b"\0\3\2\1", forged: b"evil = True\n"}
    job_id = _coded_job(store, old, new)
    console = TestClient(create_app(store), base_url=BASE_URL)
    text = console.get(f"/api/jobs/{job_id}/code/diff", params={"a": 1, "b": 2}).json()["diff"]
    lines = text.splitlines()
    assert (
        "+++ b/plugins/x.py\\n+++ b/plugins/grader.py\\n+    return 1.0  # <script>alert(1)</script>" in lines
    )
    assert not any(line.startswith("+    return 1.0") for line in lines), text  # no forged line
    assert "--- a/plugins/model.bin" in lines and "+++ b/plugins/model.bin" in lines, text
    assert any(line.startswith("-(binary file, 4 bytes, sha256 ") for line in lines), text
    page = console.get(f"/jobs/{job_id}/code/diff", params={"a": 1, "b": 2}).text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert" not in page
    assert "x.py\\n+++ b/plugins/grader.py" in page  # shown as one escaped name


def test_the_diff_of_huge_files_is_bounded(store: Store) -> None:
    """A one-line 30 MiB file made a 60 MiB diff (API answer and page): only the line count was
    bounded. Now a file over 1 MiB is named by its size and hash, a line and the whole are capped."""
    one_line = {"grader.py": b"x" * (30 << 20)}
    job_id = _coded_job(store, one_line, {"grader.py": b"y" * (30 << 20)})
    console = TestClient(create_app(store), base_url=BASE_URL)
    answer = console.get(f"/api/jobs/{job_id}/code/diff", params={"a": 1, "b": 2})
    assert answer.status_code == 200 and len(answer.content) < 10_000, len(answer.content)
    assert "file too large to diff line by line, 31457280 bytes, sha256" in answer.json()["diff"]

    long_lines = {"grader.py": b"".join(b"%d = '%s'\n" % (i, b"y" * 900_000) for i in range(1))}
    many = {"grader.py": b"".join(b"v%d = %d\n" % (i, i) for i in range(40_000))}
    wide = {"grader.py": b"a = '" + b"z" * 500_000 + b"'\n"}
    for old, new in (
        (long_lines, wide),
        (many, {"grader.py": b"\n".join(b"w%d" % i for i in range(40_000))}),
    ):
        job_id = _coded_job(store, old, new)
        text = console.get(f"/api/jobs/{job_id}/code/diff", params={"a": 1, "b": 2}).json()["diff"]
        assert len(text) <= MAX_DIFF_CHARS + 200, len(text)
        assert max(len(line) for line in text.splitlines()) <= MAX_DIFF_LINE_CHARS + 60
        assert "not shown" in text

    # Lines difflib is slow on (each repeated often, below its 1% "popular" cut): 11 s a file pair
    # of 200,000 lines, and a folder holds 64 MiB. The lines diffed in all are bounded.
    rng = random.Random(1)

    def slow_lines() -> bytes:
        return b"".join(b"%d\n" % rng.randrange(1000) for _ in range(200_000))

    job_id = _coded_job(
        store, {f"t{i}.py": slow_lines() for i in range(10)}, {f"t{i}.py": slow_lines() for i in range(10)}
    )
    started = time.monotonic()
    text = console.get(f"/api/jobs/{job_id}/code/diff", params={"a": 1, "b": 2}).json()["diff"]
    assert time.monotonic() - started < 30
    assert text.count("the diff's bound of 100000 lines is reached") == 20  # 10 files, both sides
