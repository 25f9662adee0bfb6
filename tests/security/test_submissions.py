"""A hostile submitter against job.yaml, its upload and its snapshot (issue 23, items 1, 6, 7, 8, 10, 14).

Each test sends what an attacker sent: a real request to the real app (POST /api/jobs, as the
New job page's live check and `plugtune submit --server` do) or a real job.yaml through the real
validation, and asserts a clear refusal (422 / Invalid value / Invalid data naming file, line and
field) that costs little, and that nothing of the server (its files, store, environment) was read.
"""

from __future__ import annotations

import gzip
import io
import os
import socket
import sqlite3
import struct
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from plugtune.cli import app as cli
from plugtune.errors import InvalidDataError, InvalidValueError
from plugtune.jobs.submission import pack
from plugtune.runtime.snapshot import SnapshotError, take
from plugtune.spec.reach import SubmissionPolicy
from plugtune.spec.validation import validate_job
from plugtune.store import Store
from plugtune.web import create_app
from tests.jobs.jobkit import make_job

BASE_URL = "http://127.0.0.1:8321"
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown, a file only root can read)")


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """PLUGTUNE_HOME with its SQLite store, as `plugtune serve` has it."""
    home = tmp_path / "state"
    monkeypatch.setenv("PLUGTUNE_HOME", str(home))
    monkeypatch.setenv("PLUGTUNE_DATABASE_URL", f"sqlite:///{home / 'plugtune.db'}")
    return home


@pytest.fixture
def store(state: Path) -> Iterator[Store]:
    opened = Store.open(f"sqlite:///{state / 'plugtune.db'}")
    yield opened
    opened.close()


def _client(store: Store, state: Path, policy: SubmissionPolicy | None = None) -> TestClient:
    return TestClient(create_app(store, home=state, submission_policy=policy), base_url=BASE_URL)


@pytest.fixture
def api(store: Store, state: Path) -> TestClient:
    return _client(store, state)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_job(tmp_path / "my-task").parent


def _spec(project: Path, **changes: Any) -> str:
    spec = yaml.safe_load((project / "job.yaml").read_text())
    spec.update(changes)
    return yaml.safe_dump(spec, sort_keys=False)


def _dry_run(api: TestClient, spec: str, archive: bytes | None = None, *, create: bool = False) -> Any:
    files = {"project": ("project.tar.gz", archive, "application/gzip")} if archive is not None else None
    url = "/api/jobs" if create else "/api/jobs?dry_run=true"
    return api.post(url, data={"spec": spec}, files=files or {"unused": ("u.txt", b"", "text/plain")})


def _problem(answer: Any, field: str) -> dict[str, Any]:
    assert answer.status_code == 422, answer.text
    found = [p for p in answer.json()["problems"] if p["field"] == field]
    assert found, answer.json()
    return found[0]


# --- 1. loader and interpreter variables -----------------------------------------------------

LOADER_NAMES = [
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "PYTHONPATH",
    "PYTHONSTARTUP",
    "GCONV_PATH",
    "GLIBC_TUNABLES",
    "MALLOC_CHECK_",
    "BASH_ENV",
    "PERL5OPT",
    "NODE_OPTIONS",
    "OPENSSL_CONF",
]


@pytest.mark.parametrize("name", LOADER_NAMES)
def test_loader_variables_in_env_or_secrets_are_invalid_value_at_their_line(
    tmp_path: Path, name: str
) -> None:
    job_file = make_job(tmp_path / "job", extra={"env": {"MODE": "x", name: "/x/evil.so"}, "secrets": [name]})
    with pytest.raises(InvalidValueError) as info:
        validate_job(job_file)
    lines = job_file.read_text().splitlines()
    by_field = {p.field: p for p in info.value.problems}
    for field, text in ((f"env.{name}", f"{name}:"), ("secrets[0]", f"- {name}")):
        problem = by_field[field]
        assert problem.file == str(job_file) and problem.line is not None, info.value.problems
        assert lines[problem.line - 1].strip().startswith(text)
        assert f"variable {name} is refused" in problem.message and "remove it" in problem.message
    assert "env.MODE" not in by_field  # ordinary variables stay allowed


def test_harmless_python_variables_stay_allowed(tmp_path: Path) -> None:
    job = validate_job(
        make_job(tmp_path / "job", extra={"env": {"PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "1"}})
    )
    assert job.spec.env == {"PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "1"}


def test_ld_preload_to_an_uploaded_library_is_a_422_over_the_api(api: TestClient, project: Path) -> None:
    (project / "plugins" / "evil.so").write_bytes(b"\x7fELF")
    spec = _spec(project, env={"LD_PRELOAD": "/anywhere/code/evil.so"})
    problem = _problem(_dry_run(api, spec, pack(project)), "env.LD_PRELOAD")
    assert problem["file"] == "job.yaml" and problem["line"] and "refused" in problem["message"]


# --- 6. the server's own store as data -------------------------------------------------------


def test_the_servers_store_named_as_data_is_refused_without_touching_it(
    api: TestClient, store: Store, state: Path, project: Path
) -> None:
    store.create_job("before", {})
    db = state / "plugtune.db"
    for train in (str(db), f"{db}-wal", "../../state/plugtune.db"):
        answer = _dry_run(api, _spec(project, data={"train": train}), pack(project))
        problem = _problem(answer, "data.train")
        assert "outside the submitted project" in problem["message"], problem
        assert "/" not in problem["message"].replace(repr(train), "")  # no server path but its own
    assert sqlite3.connect(db).execute("pragma integrity_check").fetchone() == ("ok",)
    assert store.count_jobs() == 1  # the store still answers


def test_a_local_job_never_reads_plugtune_home_or_the_store_as_data(
    state: Path, store: Store, tmp_path: Path
) -> None:
    (state / "jobs" / "1").mkdir(parents=True)
    (state / "jobs" / "1" / "rows.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    linked = tmp_path / "store-link.jsonl"
    os.link(state / "plugtune.db", linked)  # another name for the store's file
    for train in (str(state / "plugtune.db"), str(state / "jobs" / "1" / "rows.jsonl"), str(linked)):
        job_file = make_job(tmp_path / "job", extra={"data": {"train": train}})
        with pytest.raises(InvalidDataError) as info:
            validate_job(job_file)
        (problem,) = [p for p in info.value.problems if p.field == "data.train"]
        assert "never read as a job's data" in problem.message and "PLUGTUNE_HOME" in problem.message
        assert problem.line is not None and problem.file == str(job_file)
    validate_job(make_job(state / "my-project"))  # a user's own folder in the home is theirs


def test_a_plugin_folder_holding_plugtune_home_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_file = make_job(tmp_path / "job")
    monkeypatch.setenv("PLUGTUNE_HOME", str(tmp_path / "job" / "plugins" / "state"))
    with pytest.raises(InvalidValueError) as info:
        validate_job(job_file)
    assert any("holds PLUGTUNE_HOME" in p.message for p in info.value.problems), info.value.problems


# --- 7 and 14. a job.yaml that costs a lot to read --------------------------------------------


def _alias_bomb(levels: int) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]")
    return (
        "name: bomb\nmodel: builtin:tiny-chat\n" + "\n".join(lines) + f"\ndata: {{train: *a{levels - 1}}}\n"
    )


HOSTILE_SPECS = {
    "alias bomb": (_alias_bomb(6), "aliases", 7),
    "deep nesting": (
        "name: deep\nmodel: builtin:tiny-chat\nx: " + "[" * 20_000 + "]" * 20_000 + "\n",
        "nested",
        3,
    ),
    "huge integer": ("name: big\nmodel: builtin:tiny-chat\nseed: " + "9" * 5_000 + "\n", "integer", 3),
    "recursive alias": ("name: loop\nx: &x [1, *x]\n", "recursive", 2),
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", list(HOSTILE_SPECS))
def test_a_costly_job_yaml_is_a_clear_422_in_the_live_check_and_on_submit(
    api: TestClient, store: Store, kind: str
) -> None:
    text, says, line = HOSTILE_SPECS[kind]
    for create in (False, True):
        answer = api.post(
            "/api/jobs" if create else "/api/jobs?dry_run=true",
            content=text,
            headers={"content-type": "application/x-yaml"},
        )
        assert answer.status_code == 422, answer.text[:500]
        (problem,) = answer.json()["problems"]
        assert problem["file"] == "job.yaml" and problem["line"] == line, problem
        assert "job.yaml cannot be read" in problem["message"] and says in problem["message"], problem
    (job,) = store.list_jobs()
    assert job.status == "failed" and job.error is not None and job.error.type == "Invalid value"


def test_an_oversized_job_yaml_is_refused_before_it_is_parsed_or_stored(
    api: TestClient, store: Store, project: Path
) -> None:
    text = (project / "job.yaml").read_text() + "# " + "x" * (2 << 20) + "\n"
    answer = api.post("/api/jobs", content=text, headers={"content-type": "application/x-yaml"})
    problem = _problem(answer, "spec")
    assert problem["file"] == "job.yaml" and "at most 1048576" in problem["message"], problem
    assert store.count_jobs() == 0  # no failed job carrying 2 MiB of text


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["alias bomb", "deep nesting", "huge integer"])
def test_a_costly_job_yaml_is_a_clear_error_from_plugtune_run(state: Path, tmp_path: Path, kind: str) -> None:
    job_file = tmp_path / "job.yaml"
    job_file.write_text(HOSTILE_SPECS[kind][0])
    result = CliRunner().invoke(cli, ["run", str(job_file)])
    assert result.exit_code == 1, result.output
    assert "Invalid value" in result.output and "job.yaml cannot be read" in result.output, result.output
    assert "Traceback" not in result.output


# --- 8. tar header bombs ---------------------------------------------------------------------


def _header(kind: bytes, size: int, name: str = "././@LongLink") -> bytes:
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, size
    return info.tobuf(format=tarfile.GNU_FORMAT)


def _padded(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 512)


def _pax(records: dict[str, str]) -> bytes:
    out = b""
    for key, value in records.items():
        body = f" {key}={value}\n".encode()
        n = len(body) + len(str(len(body)))
        n = len(body) + len(str(n))  # the length counts its own digits
        out += str(n).encode() + body
    return out


def _gz_tar(project: Path, before: list[bytes]) -> bytes:
    """The project as a .tar.gz with raw header blocks ``before`` its members."""
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=6) as stream:
        for chunk in before:
            stream.write(chunk)
        with tarfile.open(fileobj=stream, mode="w|", format=tarfile.GNU_FORMAT) as archive:
            for path in sorted(project.rglob("*")):
                if path.is_file():
                    archive.add(path, arcname=path.relative_to(project).as_posix())
    return out.getvalue()


def _long_name(size: int) -> list[bytes]:
    return [_header(tarfile.GNUTYPE_LONGNAME, size), b"a" * size + b"\0" * (-size % 512)]


def _global_pax(size: int) -> list[bytes]:
    data = _pax({"comment": "x" * (size - 20)})
    return [_header(tarfile.XGLTYPE, len(data), "pax_global_header"), _padded(data)]


TAR_BOMBS = {
    "a 64 MiB GNU long name": (lambda: _long_name(64 << 20), "byte pax or long-name header"),
    "a 1 MiB global pax header": (lambda: _global_pax(1 << 20), "byte pax or long-name header"),
    "7,000 global pax headers": (lambda: _global_pax(100) * 7000, "tar headers"),
    "a sparse member": (lambda: [_header(tarfile.GNUTYPE_SPARSE, 0, "s")], "sparse file"),
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", list(TAR_BOMBS))
def test_tar_header_bombs_are_refused_before_they_are_read(
    api: TestClient, state: Path, project: Path, kind: str
) -> None:
    make, says = TAR_BOMBS[kind]
    archive = _gz_tar(project, make())
    assert len(archive) < 2 << 20  # small on the wire
    problem = _problem(_dry_run(api, (project / "job.yaml").read_text(), archive), "project")
    assert says in problem["message"] and "pack it again" in problem["message"], problem
    assert not any((state / "submissions").iterdir())  # nothing left behind


def _zip_of_empty_entries(count: int, *, claimed: int) -> bytes:
    """A zip of ``count`` empty entries whose end record claims ``claimed`` (zipfile parses them all)."""
    out, offsets = io.BytesIO(), []
    for i in range(count):
        offsets.append(out.tell())
        name = b"%x" % i
        out.write(struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 0, 0, 0, 0, 0, 0, len(name), 0) + name)
    start = out.tell()
    for i, offset in enumerate(offsets):
        name = b"%x" % i
        entry = struct.pack(
            "<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, 0, 0, 0, 0, 0, 0, len(name), 0, 0, 0, 0, 0, offset
        )
        out.write(entry + name)
    size = out.tell() - start
    out.write(struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, claimed, claimed, size, start, 0))
    return out.getvalue()


@pytest.mark.timeout(30)
def test_a_zip_directory_bomb_is_counted_before_zipfile_parses_it(api: TestClient, project: Path) -> None:
    archive = _zip_of_empty_entries(60_000, claimed=10)  # 2.8 MB: zipfile built 60,000 entries first
    problem = _problem(_dry_run(api, (project / "job.yaml").read_text(), archive), "project")
    assert "holds 2001 or more entries" in problem["message"], problem  # counted up to the bound only


def test_a_plain_archive_with_pax_headers_still_unpacks(api: TestClient, project: Path) -> None:
    (project / "plugins" / ("long_" + "n" * 150 + ".py")).write_text("x = 1\n")  # needs a pax path
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz", format=tarfile.PAX_FORMAT) as archive:
        for path in sorted(project.rglob("*")):
            archive.add(path, arcname=path.relative_to(project).as_posix(), recursive=False)
    answer = _dry_run(api, (project / "job.yaml").read_text(), out.getvalue())
    assert answer.json() == {"ok": True, "problems": []}, answer.text


# --- 10. the server's files and environment --------------------------------------------------


@AS_ROOT
def test_a_submission_cannot_read_a_server_file_nor_learn_whether_it_exists(
    api: TestClient, project: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "root-only.jsonl"
    secret.write_text('{"messages": [{"role": "user", "content": "the root password is x"}]}\n' * 3)
    secret.chmod(0o600)
    answers = [
        _dry_run(api, _spec(project, data={"train": str(path)}), pack(project))
        for path in (secret, tmp_path / "absent.jsonl")
    ]
    messages = [_problem(a, "data.train")["message"] for a in answers]
    assert all("outside the submitted project" in m for m in messages), messages
    assert messages[0].replace(str(secret), "P") == messages[1].replace(str(tmp_path / "absent.jsonl"), "P")
    assert "3" not in messages[0].replace(str(secret), "") and "password" not in answers[0].text


def test_a_plugin_file_on_the_server_is_refused(api: TestClient, project: Path, tmp_path: Path) -> None:
    elsewhere = make_job(tmp_path / "elsewhere")
    plugins = {
        "rollout": {"entry": "plugins/rollout.py:answer"},
        "graders": [{"entry": f"{elsewhere.parent / 'plugins' / 'grader.py'}:exact"}],
    }
    problem = _problem(
        _dry_run(api, _spec(project, plugins=plugins), pack(project)), "plugins.graders[0].entry"
    )
    assert "outside the submitted project" in problem["message"], problem


def test_a_yaml_body_reads_only_folders_the_operator_shares(
    store: Store, state: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(project)
    text = (project / "job.yaml").read_text()
    headers = {"content-type": "application/x-yaml"}
    refused = _client(store, state).post("/api/jobs?dry_run=true", content=text, headers=headers)
    assert "outside the submitted project" in _problem(refused, "data.train")["message"]
    shared = _client(store, state, SubmissionPolicy(shared_dirs=(project,)))
    assert shared.post("/api/jobs?dry_run=true", content=text, headers=headers).json()["ok"] is True


def test_secrets_of_a_submission_come_from_the_operators_allow_list(
    store: Store, state: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTHER_TEAM_KEY", "sk-other-team")
    monkeypatch.setenv("JUDGE_KEY", "sk-judge")
    spec = _spec(project, secrets=["JUDGE_KEY", "OTHER_TEAM_KEY"])
    policy = SubmissionPolicy(secrets=frozenset({"JUDGE_KEY"}))
    answer = _dry_run(_client(store, state, policy), spec, pack(project))
    problem = _problem(answer, "secrets[1]")
    assert "secret OTHER_TEAM_KEY is not one this server hands" in problem["message"]
    assert "plugtune serve --secret OTHER_TEAM_KEY" in problem["message"] and problem["line"]
    assert [p["field"] for p in answer.json()["problems"]] == ["secrets[1]"]  # JUDGE_KEY is allowed
    assert "sk-" not in answer.text
    created = _dry_run(_client(store, state), spec, pack(project), create=True)  # default: no secret
    assert {p["field"] for p in created.json()["problems"]} == {"secrets[0]", "secrets[1]"}
    allowed = SubmissionPolicy(secrets=frozenset({"JUDGE_KEY", "OTHER_TEAM_KEY"}))
    assert _dry_run(_client(store, state, allowed), spec, pack(project)).json()["ok"] is True


def test_serve_refuses_a_loader_variable_as_an_allowed_secret(state: Path) -> None:
    result = CliRunner().invoke(cli, ["serve", "--host", "256.0.0.1", "--secret", "LD_PRELOAD"])
    assert result.exit_code == 1 and "LD_PRELOAD" in result.output and "refused" in result.output, (
        result.output
    )


@pytest.mark.timeout(120)
def test_plugtune_serve_hands_out_only_the_secrets_and_folders_its_operator_allows(
    tmp_path: Path, project: Path
) -> None:
    shared = tmp_path / "datasets"
    shared.mkdir()
    (project / "data" / "train.jsonl").rename(shared / "big.jsonl")
    spec = _spec(
        project, data={"train": str(shared / "big.jsonl")}, secrets=["JUDGE_KEY", "ENV_KEY", "OTHER_TEAM_KEY"]
    )
    port, log = _free_port(), tmp_path / "serve.log"
    env = dict(os.environ, PLUGTUNE_HOME=str(tmp_path / "home"), PLUGTUNE_SUBMIT_SECRETS="ENV_KEY")
    env.update(JUDGE_KEY="j", ENV_KEY="e", OTHER_TEAM_KEY="o")
    for name in ("PLUGTUNE_DATABASE_URL", "PLUGTUNE_API_TOKEN", "PLUGTUNE_SHARED_DIRS"):
        env.pop(name, None)
    argv = [sys.executable, "-m", "plugtune.cli", "serve", "--port", str(port)]
    argv += ["--secret", "JUDGE_KEY", "--shared-dir", str(shared)]
    with open(log, "wb") as out:
        server = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_listening(port, server, log)
        answer = httpx.post(
            f"http://127.0.0.1:{port}/api/jobs?dry_run=true",
            data={"spec": spec},
            files={"project": ("project.tar.gz", pack(project), "application/gzip")},
            timeout=60,
        )
        assert answer.status_code == 422, answer.text
        (problem,) = answer.json()["problems"]  # the shared data and the two allowed secrets pass
        assert problem["field"] == "secrets[2]" and "--secret OTHER_TEAM_KEY" in problem["message"]
    finally:
        server.kill()
        server.wait(10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int, server: subprocess.Popen[bytes], log: Path) -> None:
    for _ in range(600):  # 60 s at most: the CLI imports the platform first
        if server.poll() is not None:
            raise AssertionError(f"plugtune serve exited {server.returncode}: {log.read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"plugtune serve did not listen within 60 s: {log.read_text()}")


# --- 14. hard links in a local plugin folder --------------------------------------------------


@AS_ROOT
def test_a_hard_link_to_a_root_only_file_is_not_copied_into_the_snapshot(tmp_path: Path) -> None:
    shadow = tmp_path / "shadow"
    shadow.write_text("root:$6$secret\n")
    shadow.chmod(0o600)
    folder = tmp_path / "plugin"
    folder.mkdir()
    (folder / "grader.py").write_text("def f():\n    return 1\n")
    os.link(shadow, folder / "notes.txt")
    for path in (folder, folder / "grader.py"):
        os.chown(path, 1000, 1000)  # the submitter's own folder and code
    with pytest.raises(SnapshotError, match=r"notes.txt: is a hard link to a file of user 0"):
        take(folder / "grader.py", tmp_path / "runtime")
    assert not (tmp_path / "runtime" / "code").exists() or not any((tmp_path / "runtime" / "code").iterdir())
    (folder / "notes.txt").unlink()
    os.link(folder / "grader.py", folder / "same.py")  # a link among the owner's own files is fine
    assert "same.py" in take(folder / "grader.py", tmp_path / "runtime").files()
