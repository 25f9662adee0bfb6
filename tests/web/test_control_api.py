"""The control plane's routes on the real app and store: submit (job.yaml body, multipart archive or
files, dry run), the 422 problems, hostile archives, cancel, delete and the events stream."""

from __future__ import annotations

import io
import json
import tarfile
import threading
import time
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from plugtune.jobs import submission
from plugtune.jobs.submission import pack
from plugtune.spec.reach import SubmissionPolicy
from plugtune.store import Store
from plugtune.types import ErrorRecord
from plugtune.web import create_app
from tests.jobs.jobkit import make_job
from tests.web.conftest import BASE_URL


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def db(store: Store) -> Store:
    """The web tests' store: SQLite in a temp dir, and PostgreSQL (a fresh schema) when reachable."""
    return store


@pytest.fixture
def woken() -> list[str]:
    return []


@pytest.fixture
def api(db: Store, home: Path, woken: list[str]) -> TestClient:
    return TestClient(create_app(db, home=home, on_retry=woken.append), base_url=BASE_URL)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_job(tmp_path / "my-task").parent


def _tar(entries: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        for info, data in entries:
            info.size = len(data) if info.isfile() else 0
            archive.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return out.getvalue()


def _file(name: str, data: bytes = b"x = 1\n") -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def _device() -> tarfile.TarInfo:
    info = tarfile.TarInfo("null")
    info.type = tarfile.CHRTYPE
    return info


def _zip(entries: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
        for name, target in (links or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o120777 << 16  # a symbolic link
            archive.writestr(info, target)
    return out.getvalue()


def _post(api: TestClient, spec: str | None, archive: bytes | None, *, dry_run: bool = False) -> Any:
    data = {"spec": spec} if spec is not None else {}
    files = {"project": ("project.tar.gz", archive, "application/gzip")} if archive is not None else None
    if files is None:  # still multipart: an empty file part named otherwise
        files = {"unused": ("unused.txt", b"", "text/plain")}
    return api.post(f"/api/jobs{'?dry_run=true' if dry_run else ''}", data=data, files=files)


def _submissions(home: Path) -> list[Path]:
    folder = home / "submissions"
    return sorted(folder.iterdir()) if folder.is_dir() else []


def test_a_multipart_archive_is_unpacked_validated_and_queued(
    api: TestClient, db: Store, home: Path, project: Path, woken: list[str]
) -> None:
    answer = _post(api, (project / "job.yaml").read_text(), pack(project))
    assert answer.status_code == 201, answer.text
    body = answer.json()
    assert body == {"job_id": body["job_id"], "status": "queued", "url": f"/jobs/{body['job_id']}"}
    job = db.get_job(body["job_id"])
    assert job is not None and job.status == "queued" and job.name == "my-task"
    folder = Path(job.spec["job_file"]).parent
    assert folder.parent == home / "submissions"
    assert (folder / "plugins" / "rollout.py").read_text() == (project / "plugins" / "rollout.py").read_text()
    assert woken == [str(body["job_id"])]  # the scheduler is told at once
    kept = job.spec["submitted"]  # what its attempts run: the submission's own files, as sent
    assert kept["data"]["train"]["path"] == str((folder / "data" / "train.jsonl").resolve())
    code = db.get_code(kept["plugins"]["plugins/rollout.py"]["code_hash"])
    assert code["rollout.py"] == (project / "plugins" / "rollout.py").read_bytes()


def test_a_dry_run_validates_and_creates_nothing(
    api: TestClient, db: Store, home: Path, project: Path
) -> None:
    answer = _post(api, (project / "job.yaml").read_text(), pack(project), dry_run=True)
    assert (answer.status_code, answer.json()) == (200, {"ok": True, "problems": []})
    assert db.count_jobs() == 0 and _submissions(home) == []


def test_a_yaml_body_resolves_relative_paths_against_the_servers_folder(
    db: Store, home: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = SubmissionPolicy(shared_dirs=(project.parent,))  # `plugtune serve --shared-dir`
    api = TestClient(create_app(db, home=home, submission_policy=shared), base_url=BASE_URL)
    monkeypatch.chdir(project)
    text = (project / "job.yaml").read_text()
    answer = api.post("/api/jobs", content=text, headers={"content-type": "application/x-yaml"})
    assert answer.status_code == 201, answer.text
    job = db.get_job(answer.json()["job_id"])
    assert job is not None and job.spec["base_dir"] == str(project.resolve())
    monkeypatch.chdir(project.parent)
    refused = api.post("/api/jobs?dry_run=true", content=text, headers={"content-type": "text/yaml"})
    assert refused.status_code == 422
    looked = [p["message"] for p in refused.json()["problems"] if "looked in" in p["message"]]
    assert looked and all(str(project.parent) in m for m in looked), refused.json()


def test_validation_problems_name_file_line_and_field_and_record_the_job_failed(
    api: TestClient, db: Store, project: Path
) -> None:
    (project / "data" / "train.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n{bad\n')
    spec = (project / "job.yaml").read_text().replace("steps: 2", "steps: -3")
    dry = _post(api, spec, pack(project), dry_run=True)
    assert dry.status_code == 422 and "job_id" not in dry.json() and db.count_jobs() == 0
    answer = _post(api, spec, pack(project))
    assert answer.status_code == 422
    body = answer.json()
    where = {(p["file"], p["field"]) for p in body["problems"]}
    assert ("job.yaml", "hyperparameters.steps") in where, body
    bad_row = [p for p in body["problems"] if p["file"] == "data/train.jsonl" and p["line"] == 2]
    assert bad_row and bad_row[0]["message"] and bad_row[0]["hint"], body
    steps = next(p for p in body["problems"] if p["field"] == "hyperparameters.steps")
    assert steps["line"] == spec.splitlines().index("  steps: -3") + 1
    assert steps["hint"].startswith("A value in job.yaml or the dataset is invalid")
    assert "submissions" not in json.dumps(body)  # the server's folders are not shown
    job = db.get_job(body["job_id"])
    assert job is not None and job.status == "failed" and job.error is not None
    assert job.name == "my-task"  # job.yaml's name, not the submission folder's random id
    assert job.error.type in ("Invalid value", "Invalid data") and str(body["job_id"]) in body["detail"]


def test_a_missing_data_file_is_named_inside_the_project(api: TestClient, project: Path) -> None:
    (project / "data" / "train.jsonl").unlink()
    body = _post(api, (project / "job.yaml").read_text(), pack(project), dry_run=True).json()
    missing = [p for p in body["problems"] if p["file"] == "data/train.jsonl"]
    assert missing and "job.yaml:" in missing[0]["message"], body
    assert "submissions" not in json.dumps(body) and missing[0]["hint"].startswith("A data file is missing")


def test_job_yaml_comes_from_the_archive_when_no_spec_is_sent(api: TestClient, project: Path) -> None:
    assert _post(api, None, pack(project), dry_run=True).json() == {"ok": True, "problems": []}
    (project / "job.yaml").unlink()
    missing = _post(api, None, pack(project))
    assert missing.status_code == 422
    assert (
        missing.json()["problems"][0]["file"] == "job.yaml"
        and "missing" in missing.json()["problems"][0]["message"]
    )


def test_a_zipped_folder_with_its_top_folder_is_the_project(api: TestClient, project: Path) -> None:
    entries = {
        f"my-task/{p.relative_to(project).as_posix()}": p.read_bytes()
        for p in project.rglob("*")
        if p.is_file()
    }
    answer = _post(api, None, _zip(entries), dry_run=True)
    assert answer.json() == {"ok": True, "problems": []}, answer.text


def test_loose_project_files_are_written_like_an_archive(api: TestClient, db: Store, project: Path) -> None:
    files = [
        ("project_files", (p.relative_to(project).as_posix(), p.read_bytes(), "application/octet-stream"))
        for p in project.rglob("*")
        if p.is_file() and p.name != "job.yaml"
    ]
    answer = api.post("/api/jobs", data={"spec": (project / "job.yaml").read_text()}, files=files)
    assert answer.status_code == 201, answer.text
    hostile = [("project_files", ("../../evil.py", b"x", "text/plain"))]
    refused = api.post("/api/jobs", data={"spec": "name: x\n"}, files=hostile)
    assert refused.status_code == 422
    assert refused.json()["problems"][0]["field"] == "project_files", refused.json()


def _tar_link(kind: bytes) -> bytes:
    link = tarfile.TarInfo("data")
    link.type, link.linkname = kind, "/etc/passwd"
    return _tar([_file("job.yaml", b"name: x\n"), (link, b"")])


HOSTILE = {
    "zip slip": (_zip({"../../escaped.py": b"boom"}), "'..'"),
    "tar slip": (_tar([_file("plugins/../../../escaped.py")]), "'..'"),
    "absolute path": (_tar([_file("/tmp/plugtune-absolute.py")]), "absolute"),
    "windows absolute path": (_zip({"C:\\Windows\\evil.py": b"x"}), "absolute"),
    "tar symlink": (_tar_link(tarfile.SYMTYPE), "link"),
    "tar hard link": (_tar_link(tarfile.LNKTYPE), "link"),
    "zip symlink": (_zip({"job.yaml": b"name: x\n"}, links={"data": "/etc"}), "link"),
    "device": (_tar([(_device(), b"")]), "special file"),
    "not an archive": (b"this is not an archive at all" * 10, "not a .zip or .tar.gz"),
    "damaged gzip": (b"\x1f\x8b\x08\x00" + b"\x00" * 40, "not a .zip or .tar.gz"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_archives_are_a_422_naming_the_entry_and_nothing_is_written(
    api: TestClient, db: Store, home: Path, tmp_path: Path, case: str
) -> None:
    archive, says = HOSTILE[case]
    answer = _post(api, "name: x\n", archive)
    assert answer.status_code == 422, answer.text
    body = answer.json()
    assert says in json.dumps(body) and body["problems"][0]["field"] == "project", body
    assert "job_id" not in body and db.count_jobs() == 0
    assert _submissions(home) == []  # the folder it started is removed
    assert not (home / "escaped.py").exists() and not (tmp_path / "escaped.py").exists()
    assert not Path("/tmp/plugtune-absolute.py").exists()


def test_an_archive_that_unpacks_past_the_limit_is_refused(
    api: TestClient, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(submission, "MAX_UNPACKED_BYTES", 1 << 20)
    bomb = _zip({"data/zeros.bin": b"\0" * (3 << 20)})  # ~3 KB compressed
    assert len(bomb) < 100_000
    answer = _post(api, "name: x\n", bomb)
    assert answer.status_code == 422 and "unpacks to more than 1048576 bytes" in answer.text
    assert _submissions(home) == []
    many = _zip({f"f{i}.txt": b"" for i in range(submission.MAX_FILES + 1)})
    assert "at most 2000" in _post(api, "name: x\n", many).text


def test_an_upload_over_the_limit_is_a_413_naming_it_and_other_routes_keep_1_mib(
    api: TestClient, db: Store
) -> None:
    big = b"\0" * (submission.MAX_UPLOAD_BYTES + 1)
    answer = api.post("/api/jobs", content=big, headers={"content-type": "application/x-yaml"})
    assert answer.status_code == 413
    assert f"POST /api/jobs accepts at most {submission.MAX_UPLOAD_BYTES} (32 MiB)" in answer.json()["detail"]
    two_mib = api.post(
        "/api/jobs/1/retry", content=b"{}" + b" " * (2 << 20), headers={"content-type": "application/json"}
    )
    assert two_mib.status_code == 413 and "1 MiB" in two_mib.json()["detail"]


def test_an_unreadable_multipart_body_is_a_400_saying_what_to_send(api: TestClient) -> None:
    huge = api.post(
        "/api/jobs", data={"spec": "x: " + "a" * (2 << 20)}, files={"u": ("u", b"", "text/plain")}
    )
    assert huge.status_code == 400
    assert "cannot be read (Part exceeded maximum size" in huge.json()["detail"]
    assert "as a file part" in huge.json()["detail"]
    as_file = api.post(
        "/api/jobs?dry_run=true", files={"spec": ("job.yaml", b"x: " + b"a" * (2 << 20), "text/yaml")}
    )
    assert as_file.status_code == 422  # read as job.yaml, judged by validation


def test_wrong_content_types_are_clear(api: TestClient) -> None:
    as_json = api.post("/api/jobs", json={"spec": "name: x"})
    assert as_json.status_code == 400 and "application/x-yaml" in as_json.json()["detail"]
    xml = api.post("/api/jobs", content=b"<x/>", headers={"content-type": "application/xml"})
    assert xml.status_code == 415 and "multipart/form-data" in xml.json()["detail"]
    latin = api.post("/api/jobs", content="name: é".encode("latin-1"), headers={"content-type": "text/yaml"})
    assert latin.status_code == 400 and "UTF-8" in latin.json()["detail"]


def test_writes_go_through_origin_csrf_and_token_checks(db: Store, home: Path, project: Path) -> None:
    open_app = TestClient(create_app(db, home=home), base_url=BASE_URL)
    forged = open_app.post(
        "/api/jobs",
        content=b"name: x\n",
        headers={"content-type": "text/yaml", "origin": "http://evil.example"},
    )
    assert forged.status_code == 403 and "cross-origin" in forged.json()["detail"]
    no_csrf = open_app.post(
        "/api/jobs/1/cancel", headers={"origin": BASE_URL}
    )  # a browser's write without the CSRF token
    assert no_csrf.status_code == 403 and "CSRF" in no_csrf.json()["detail"]
    locked = TestClient(create_app(db, home=home, api_token="s3cret"), base_url=BASE_URL)
    assert locked.delete("/api/jobs/1").status_code == 401
    assert locked.post("/api/jobs/1/cancel").status_code == 401
    answer = _post(locked, (project / "job.yaml").read_text(), pack(project), dry_run=True)
    assert answer.status_code == 401
    signed = locked.post(
        "/api/jobs?dry_run=true",
        data={"spec": (project / "job.yaml").read_text()},
        files={"project": ("p.tar.gz", pack(project), "application/gzip")},
        headers={"authorization": "Bearer s3cret"},
    )
    assert signed.json() == {"ok": True, "problems": []}
    assert db.count_jobs() == 0


def test_cancel_a_queued_job_then_nothing_is_left_to_cancel(
    api: TestClient, db: Store, project: Path
) -> None:
    job_id = _post(api, (project / "job.yaml").read_text(), pack(project)).json()["job_id"]
    answer = api.post(f"/api/jobs/{job_id}/cancel")
    assert answer.status_code == 202
    assert answer.json() == {"job_id": job_id, "status": "cancelled", "message": f"job {job_id} is cancelled"}
    again = api.post(f"/api/jobs/{job_id}/cancel")
    assert again.status_code == 409 and "nothing to cancel" in again.json()["detail"]
    assert api.post("/api/jobs/999/cancel").status_code == 404


def test_a_job_waiting_for_its_automatic_retry_can_be_cancelled(api: TestClient, db: Store) -> None:
    job_id = db.create_job("retrying", {})
    db.transition(job_id, "running")
    db.transition(job_id, "failed", "internal error")
    db.update_job(job_id, next_retry_at=4e9)
    assert api.delete(f"/api/jobs/{job_id}").status_code == 409  # not final while a retry is pending
    answer = api.post(f"/api/jobs/{job_id}/cancel")
    assert answer.status_code == 202 and answer.json()["status"] == "cancelled"


def test_delete_an_ended_job_removes_its_rows_and_files_but_not_a_queued_one(
    api: TestClient, db: Store, home: Path, project: Path
) -> None:
    job_id = _post(api, (project / "job.yaml").read_text(), pack(project)).json()["job_id"]
    folder = Path(db.get_job(job_id).spec["job_file"]).parent  # type: ignore[union-attr]
    queued = api.delete(f"/api/jobs/{job_id}")
    assert queued.status_code == 409 and "cancel it first" in queued.json()["detail"]
    other = db.create_job("other", {})
    db.write_batch(other, logs=[])
    api.post(f"/api/jobs/{job_id}/cancel")
    files = home / "jobs" / str(job_id) / "checkpoints"
    files.mkdir(parents=True)
    (files / "weights.bin").write_bytes(b"w")
    db.set_job_error(job_id, ErrorRecord("internal error", "platform", "", "m"))
    answer = api.delete(f"/api/jobs/{job_id}")
    assert answer.status_code == 204 and answer.content == b""
    assert (
        db.get_job(job_id) is None and db.list_job_errors(job_id) == [] and db.list_transitions(job_id) == []
    )
    assert not (home / "jobs" / str(job_id)).exists() and not folder.exists()
    assert db.get_job(other) is not None
    assert api.delete(f"/api/jobs/{job_id}").status_code == 404
    assert api.get(f"/api/jobs/{job_id}").status_code == 404


def test_events_of_an_ended_job_send_its_state_then_end(api: TestClient, db: Store) -> None:
    job_id = db.create_job("done", {})
    db.update_job(job_id, steps_total=2, steps_done=2)
    db.transition(job_id, "running")
    db.transition(job_id, "succeeded")
    with api.stream("GET", f"/api/jobs/{job_id}/events") as answer:
        assert answer.headers["content-type"].startswith("text/event-stream")
        text = "".join(answer.iter_text())
    events = _parse_events(text)
    assert [name for name, _ in events] == ["job", "end"]
    data = events[0][1]
    assert (data["id"], data["status"], data["steps_done"], data["steps_total"]) == (
        job_id,
        "succeeded",
        2,
        2,
    )
    assert set(data) == {
        "id",
        "status",
        "steps_done",
        "steps_total",
        "error_cause",
        "updated_at",
        "queue_position",
        "waiting",
    }
    assert api.get("/api/jobs/999/events").status_code == 404


def _parse_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in text.split("\n\n"):
        lines = dict(
            line.split(": ", 1) for line in block.splitlines() if ": " in line and not line.startswith(":")
        )
        if "event" in lines:
            out.append((lines["event"], json.loads(lines["data"])))
    return out


def test_the_jobs_list_filters_by_name_status_and_cause_with_limit_offset_and_total(
    api: TestClient, db: Store
) -> None:
    ids = [db.create_job(name, {}) for name in ("Adder-a", "adder-b", "sorter", "adder_c%")]
    db.transition(ids[1], "running")
    db.transition(ids[1], "failed", "x")
    db.set_job_error(ids[1], ErrorRecord("Call plugin error", "plugin", "Timeout", ""))
    page = api.get("/api/jobs?q=ADDER&limit=2&offset=0").json()
    assert [j["id"] for j in page["items"]] == [ids[3], ids[1]] and page["total"] == 3
    assert (page["limit"], page["offset"]) == (2, 0)
    rest = api.get("/api/jobs?q=adder&limit=2&offset=2").json()
    assert [j["id"] for j in rest["items"]] == [ids[0]] and rest["total"] == 3
    assert api.get("/api/jobs?q=_c%25").json()["total"] == 1  # LIKE wildcards are literal
    failed = api.get("/api/jobs?status=failed&cause=Timeout").json()
    assert [j["id"] for j in failed["items"]] == [ids[1]] and failed["total"] == 1
    assert api.get("/api/jobs?cause=EOF").json() == {**api.get("/api/jobs?cause=EOF").json(), "total": 0}
    queued = api.get("/api/jobs?status=queued").json()["items"]
    assert [j["queue_position"] for j in queued] == [3, 2, 1]  # the oldest runs next
    assert api.get("/api/jobs?status=bogus").status_code == 400
    assert api.get("/api/jobs?limit=0").status_code == 422


def test_events_follow_a_live_job_with_keepalives_and_a_bounded_stream(
    api: TestClient, db: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from plugtune.web import control_api

    monkeypatch.setattr(control_api, "KEEPALIVE_S", 0.3)
    ahead, job_id = db.create_job("ahead", {}), db.create_job("live", {})
    db.update_job(job_id, steps_total=2)
    # Each change is made once the stream has shown the state before it (and a keepalive has
    # had time to go out), so a slow start or a late poll cannot merge two states into one.
    changes = [
        lambda: db.transition(ahead, "cancelled"),
        lambda: db.transition(job_id, "running"),
        lambda: db.update_job(job_id, steps_done=1),
        lambda: db.update_job(job_id, steps_done=2),
        lambda: db.transition(job_id, "succeeded"),
    ]
    text = ""
    deadline = time.monotonic() + 60
    with api.stream("GET", f"/api/jobs/{job_id}/events") as answer:
        for chunk in answer.iter_text():
            text += chunk
            assert time.monotonic() < deadline, text
            whole = text[: text.rfind("\n\n") + 1]  # events complete so far
            shown = sum(1 for n, _ in _parse_events(whole) if n == "job")
            if changes and shown == 6 - len(changes):
                time.sleep(1.2)  # > KEEPALIVE_S and two polls: a keepalive goes out first
                changes.pop(0)()
    seen = [(d["status"], d["steps_done"], d["queue_position"]) for n, d in _parse_events(text) if n == "job"]
    assert seen == [
        ("queued", 0, 2),
        ("queued", 0, 1),
        ("running", 0, None),
        ("running", 1, None),
        ("running", 2, None),
        ("succeeded", 2, None),
    ], seen
    assert text.startswith("retry: 2000\n\n") and ": keepalive\n\n" in text
    assert _parse_events(text)[-1][0] == "end"
    monkeypatch.setattr(control_api, "MAX_STREAM_S", 0.5)
    endless = db.create_job("endless", {})
    with api.stream("GET", f"/api/jobs/{endless}/events") as answer:
        bounded = "".join(answer.iter_text())
    assert [n for n, _ in _parse_events(bounded)] == ["job"]  # closed by the bound, without `end`


def test_streams_that_follow_one_job_share_its_store_reads(db: Store, home: Path) -> None:
    from tests.web.browsing import serving

    app = create_app(db, home=home)
    job_id = db.create_job("watched", {})
    db.transition(job_id, "running")
    texts: list[str] = []

    def follow(base: str) -> None:
        with urllib.request.urlopen(f"{base}/api/jobs/{job_id}/events", timeout=30) as answer:
            texts.append(answer.read().decode())

    with serving(app) as base:
        followers = [threading.Thread(target=follow, args=(base,)) for _ in range(8)]
        for follower in followers:
            follower.start()
        time.sleep(2.0)
        db.transition(job_id, "succeeded")
        for follower in followers:
            follower.join(30)
    assert len(texts) == 8
    for text in texts:
        assert [d["status"] for n, d in _parse_events(text) if n == "job"][-1] == "succeeded"
        assert _parse_events(text)[-1][0] == "end"
    # ~2.5 s at one poll per 0.5 s: one stream alone reads about 6 times; 8 of them still ~6, not ~48
    assert app.state.job_watch.reads <= 16, app.state.job_watch.reads
