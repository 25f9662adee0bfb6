"""Reaching a `plugtune serve` from the command line: the address a local server recorded, and a job
submitted to a remote one over its API (``plugtune submit --server URL``)."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from plugtune.errors import Problem
from plugtune.home import private_dir
from plugtune.jobs.submission import SubmissionError, pack

SERVE_FILE = "serve.json"  # in $PLUGTUNE_HOME while `plugtune serve` runs
TIMEOUT_S = 120.0
#: A retry with new code waits this long for its answer: the server lints the code and replays the
#: job's failed groups in the sandbox first, each plugin call up to its own timeout_s.
CODE_TIMEOUT_S = 1800.0


class RemoteError(Exception):
    """Raised when a submission to a server fails before the server judged the job; one line to print."""


@dataclass(frozen=True)
class Rejected:
    """The server's 422: what is wrong, and the job it recorded as failed (None for a refused upload)."""

    detail: str
    problems: list[Problem]
    hints: list[str] = field(default_factory=list)
    job_id: int | None = None


def record_serve(home: Path, url: str) -> Path:
    """Write where this process serves the console (``$PLUGTUNE_HOME/serve.json``)."""
    private_dir(home)
    path = home / SERVE_FILE
    path.write_text(json.dumps({"url": url, "pid": os.getpid()}))
    return path


def forget_serve(home: Path) -> None:
    """Remove serve.json if this process wrote it."""
    path = home / SERVE_FILE
    if _read_serve(path).get("pid") == os.getpid():
        path.unlink(missing_ok=True)


def serving_url(home: Path) -> str | None:
    """The console URL of the `plugtune serve` running on this home, or None when none runs (a file
    left by a killed server names a process that is gone)."""
    record = _read_serve(home / SERVE_FILE)
    pid, url = record.get("pid"), record.get("url")
    if not isinstance(pid, int) or not isinstance(url, str) or not _is_serve(pid):
        return None
    return url


def _is_serve(pid: int) -> bool:
    """Is ``pid`` a live `plugtune serve` (not another process that got the number of a dead one)?"""
    try:
        return "serve" in psutil.Process(pid).cmdline()
    except psutil.Error:
        return False


def read_serve(home: Path) -> dict[str, Any]:
    """What serve.json says (``url``, ``pid``); {} when there is none. Only a hint: a server killed
    with -9 leaves it behind (``supervisor_lock`` knows whether a server runs)."""
    return _read_serve(home / SERVE_FILE)


def _read_serve(path: Path) -> dict[str, Any]:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def submit_remote(server: str, job_file: Path, token: str | None) -> int | Rejected:
    """Pack the job's folder (without .plugtune/, .venv/, __pycache__/, .git/), post it with its
    job.yaml to ``server``'s ``POST /api/jobs``: the new job's id, or the server's 422."""

    base = server.rstrip("/")
    if not job_file.is_file():
        raise RemoteError(f"{job_file} does not exist; name the job's job.yaml")
    try:
        archive = pack(job_file.resolve().parent)
    except SubmissionError as exc:
        raise RemoteError(str(exc)) from None
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    spec = {"spec": job_file.read_text(encoding="utf-8", errors="replace")}
    files = {"project": ("project.tar.gz", archive, "application/gzip")}
    answer = _post(server, "/api/jobs", TIMEOUT_S, data=spec, files=files, headers=headers)
    return _answer(base, answer, token)


def _post(server: str, path: str, read_s: float, late: str = "", **request: Any) -> Any:
    """POST ``request`` to ``server``'s ``path`` (reading its answer for up to ``read_s``); httpx's
    failures as a ``RemoteError`` saying what to do (``late``: what a read timeout means, when more
    than "try again later")."""
    import httpx

    base = server.rstrip("/")
    try:
        return httpx.post(f"{base}{path}", timeout=httpx.Timeout(TIMEOUT_S, read=read_s), **request)
    except httpx.ConnectError as exc:
        raise RemoteError(
            f"cannot reach {base} ({_reason(exc)}); is `plugtune serve` running there? Check --server"
        ) from None
    except httpx.ReadTimeout:
        raise RemoteError(f"{base} did not answer within {read_s:g} s; {late or 'try again later'}") from None
    except httpx.TimeoutException:
        raise RemoteError(f"{base} did not answer within {TIMEOUT_S:g} s; try again later") from None
    except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
        raise RemoteError(f"--server {server!r} is not a usable URL ({exc}); e.g. http://host:8321") from None
    except httpx.HTTPError as exc:
        raise RemoteError(f"the request to {base} failed: {exc}") from None


def _answer(base: str, answer: Any, token: str | None) -> int | Rejected:
    body = _json(answer)
    detail = str(body.get("detail") or answer.text[:300] or answer.reason_phrase)
    if answer.status_code == 201:
        return int(body["job_id"])
    if answer.status_code == 422 and isinstance(body.get("problems"), list):
        problems = [_problem(p) for p in body["problems"] if isinstance(p, dict)]
        hints = list(dict.fromkeys(str(p.get("hint")) for p in body["problems"] if p.get("hint")))
        job_id = body.get("job_id")
        return Rejected(detail, problems, hints, job_id if isinstance(job_id, int) else None)
    if answer.status_code == 401:
        if token:
            raise RemoteError(f"{base} refused the API token in PLUGTUNE_API_TOKEN (401): {detail}")
        raise RemoteError(
            f"{base} requires an API token (401): export PLUGTUNE_API_TOKEN=<the server's token>"
        )
    if answer.status_code == 413:
        raise RemoteError(f"{base} refused the upload as too large (413): {detail}")
    raise RemoteError(f"{base} answered {answer.status_code}: {detail}")


def _json(answer: Any) -> dict[str, Any]:
    try:
        body = answer.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _problem(raw: dict[str, Any]) -> Problem:
    line = raw.get("line")
    return Problem(
        file=str(raw.get("file") or "job.yaml"),
        message=str(raw.get("message") or ""),
        line=line if isinstance(line, int) else None,
        field=str(raw["field"]) if raw.get("field") else None,
    )


def _reason(exc: Exception) -> str:
    text = str(exc)
    return "connection refused" if "refused" in text.lower() else text or type(exc).__name__


def retry_remote(
    server: str, job_id: int, code_dir: Path | None, token: str | None
) -> dict[str, Any] | Rejected:
    """``POST /api/jobs/{id}/retry`` on ``server``: with ``code_dir`` its folder packed (as
    :func:`submit_remote` packs a job's) as the new plugin code; the server's answer (``status``,
    ``message`` and, with code, ``code_hash``, ``previous_code_hash``, ``tested``, ``notes``), or its
    422 refusal. RemoteError for anything else (409: the job cannot be retried now; 404; unreachable)."""

    base = server.rstrip("/")
    files = None
    if code_dir is not None:
        if not code_dir.is_dir():
            raise RemoteError(
                f"--code {code_dir}: no such folder (give the project folder holding the plugins)"
            )
        try:
            files = {"project": ("project.tar.gz", pack(code_dir.resolve()), "application/gzip")}
        except SubmissionError as exc:
            raise RemoteError(str(exc)) from None
    headers = {"Accept": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    wait = CODE_TIMEOUT_S if code_dir is not None else TIMEOUT_S
    late = (
        f"it may still be checking the new code and then queue the retry: see {base}/jobs/{job_id} "
        "before retrying again"
        if code_dir is not None
        else ""
    )
    answer = _post(server, f"/api/jobs/{job_id}/retry", wait, late, files=files, headers=headers)
    body = _json(answer)
    if answer.status_code == 200:
        return body
    if answer.status_code == 422 and isinstance(body.get("problems"), list):
        problems = [_problem(p) for p in body["problems"] if isinstance(p, dict)]
        problems = [  # a check's problem names no file (its message does)
            dataclasses.replace(p, file="") if not raw.get("file") else p
            for p, raw in zip(problems, [r for r in body["problems"] if isinstance(r, dict)], strict=True)
        ]
        return Rejected(str(body.get("detail") or "refused"), problems, [], job_id)
    detail = str(body.get("detail") or answer.text[:300] or answer.reason_phrase)
    if answer.status_code == 401:
        raise RemoteError(
            f"{base} requires an API token (401): export PLUGTUNE_API_TOKEN=<the server's token>"
        )
    raise RemoteError(f"{base} answered {answer.status_code}: {detail}")
