"""A job's plugin code revised for a retry (``plugtune jobs retry ID --code DIR``), and which code each
attempt ran.

``DIR`` is a project root laid out as the job's: each plugin file job.yaml names (``plugins/grader.py``
of ``entry: plugins/grader.py:exact``) is read at that path under ``DIR``, with its folder, as
submission keeps it (:mod:`plugtune.jobs.submitted`). Everything else stays as submitted: the stored
job.yaml (DIR's own job.yaml, if any, is not read), its data (checked against its fingerprints) and
hyperparameters. A revision is validated here without writing anything; :func:`commit` stores its
folders by content hash, records it in the job's spec under :data:`KEY` (the code every later attempt
runs, until another revision) and queues the retry. Each attempt records the code it ran
(``Store.record_attempt_code``): :func:`timeline` turns that into attempt -> code -> step range.
"""

from __future__ import annotations

import difflib
import hashlib
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plugtune.errors import InvalidValueError, Problem
from plugtune.jobs.scheduler import require
from plugtune.jobs.submitted import KEY as SUBMITTED
from plugtune.jobs.submitted import REVISED_KEY, check_data, has_snapshot, plugins_to_run
from plugtune.runtime.snapshot import SnapshotError, collect, content_hash
from plugtune.spec.reach import Reach
from plugtune.spec.validation import ValidatedJob, validate_job
from plugtune.store import IllegalTransitionError, Store

KEY = REVISED_KEY  # the job spec's key for the revised code later attempts run
SUBMITTED_SOURCE = "submitted"
RETRYABLE = ("failed", "cancelled")
MAX_DIFF_LINES = 5_000
MAX_DIFF_CHARS = 1 << 20  # the whole diff's text (a page and an API answer, not the code store)
MAX_DIFF_LINE_CHARS = 2_000  # one line of it (a minified or one-line file)
MAX_DIFF_FILE_BYTES = 1 << 20  # a file larger than this on either side is named, not diffed line by line
MAX_DIFF_INPUT_LINES = 100_000  # lines diffed in all (both sides); the files past them are named
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class RevisionError(ValueError):
    """Raised when a job cannot be retried with new code (its state, or a --code folder that does not
    hold its plugins); the message says which and what to do."""


@dataclass(frozen=True)
class Revision:
    """New plugin code for a job, validated against its stored job.yaml: ``job`` (its plugin refs
    point into ``code_dir``) and each plugin file job.yaml names -> its file under ``code_dir``."""

    job_id: int
    code_dir: Path
    job: ValidatedJob
    files: dict[str, Path]


@dataclass(frozen=True)
class CodeSpan:
    """Attempt ``attempt`` ran ``code_hash`` (from ``source``) over steps ``first_step..last_step``
    (``last_step < first_step``: it trained no step)."""

    attempt: int
    status: str
    code_hash: str
    source: str
    first_step: int
    last_step: int
    plugins: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "status": self.status,
            "code_hash": self.code_hash,
            "source": self.source,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "plugins": {f: str(p.get("code_hash", "")) for f, p in self.plugins.items()},
        }


def source_of(spec: dict[str, Any]) -> str:
    revised = spec.get(KEY)
    return str(revised.get("source") or "") if isinstance(revised, dict) else SUBMITTED_SOURCE


def set_hash(plugins: dict[str, dict[str, Any]]) -> str:
    """One hash for a job's whole plugin code: over each plugin file's name and folder hash."""
    digest = hashlib.sha256()
    for file in sorted(plugins):
        digest.update(f"{file}\0{plugins[file].get('code_hash', '')}\n".encode())
    return digest.hexdigest()


def record_attempt(store: Store, job_id: int, attempt: int, spec: dict[str, Any]) -> None:
    """Record the code attempt ``attempt`` runs (a job with no snapshot records none)."""
    plugins = plugins_to_run(spec)
    if plugins:
        store.record_attempt_code(job_id, attempt, set_hash(plugins), plugins, source_of(spec))


def read(store: Store, job_id: int, code_dir: Path) -> Revision:
    """Validate ``code_dir``'s plugin files against the job's stored job.yaml and data; writes
    nothing. ``RevisionError`` for a job that cannot take it, ``InvalidValueError`` /
    ``InvalidDataError`` listing every problem of the code (a plugin file it lacks, by name)."""
    require(store, job_id)
    job = store.get_job(job_id)
    if job is None or job.status not in RETRYABLE:
        raise RevisionError(
            f"job {job_id} is {job.status if job else 'gone'}; only a failed or cancelled job can be retried"
        )
    if "engine" in job.spec:
        raise RevisionError(
            f"job {job_id} was run by {job.spec['engine']} from its own launcher; run it again there"
        )
    if not has_snapshot(job.spec):
        raise RevisionError(
            f"job {job_id} holds no snapshot of what was submitted (it failed validation, or an older "
            "plugtune recorded it), so no plugin path to take from --code: retry it without --code, "
            "or submit it again"
        )
    root = code_dir.resolve()
    if not root.is_dir():
        raise RevisionError(
            f"--code {code_dir}: no such folder (give the project folder holding the plugins)"
        )
    job_file = Path(str(job.spec["job_file"]))
    files, problems = {}, []
    reach = Reach.of(job_file, None)
    for file in plugins_to_run(job.spec):
        if Path(file).is_absolute():  # root / file would be the file on disk, not DIR's
            message = (
                f"job.yaml names plugin file {file} by its absolute path, so --code {code_dir} cannot "
                "hold it: retry without --code (the job runs its stored code), or submit the job again "
                "with the plugin's entry relative to job.yaml"
            )
            problems.append(Problem(file, message, None, "plugins"))
            continue
        path = root / file
        if path.is_file() and reach.holds_home(path.parent):
            message = (
                f"the folder of {file} ({path.parent}) holds PLUGTUNE_HOME ({reach.home}), and a plugin's "
                "whole folder is kept with the job: give --code a project folder outside it"
            )
            problems.append(Problem(str(path), message, None, "plugins"))
            continue
        if path.is_file():
            files[file] = path
            continue
        message = (
            f"--code {code_dir} has no {file}: job.yaml names plugin file {file}, so the folder must hold it "
            "at that path (--code is the project folder, laid out as the job's)"
        )
        problems.append(Problem(str(path), message, None, "plugins"))
    problems.extend(_unkeepable(files))
    if problems:
        raise InvalidValueError(problems)
    validated = validate_job(
        job_file, base_dir=job.spec.get("base_dir"), text=job.spec_yaml, plugin_files=files
    )
    check_data(job_file, job.spec[SUBMITTED].get("data") or {})
    return Revision(job_id, root, validated, files)


def _unkeepable(files: dict[str, Path]) -> list[Problem]:
    """A problem for each plugin file whose folder a snapshot cannot keep (a link out of it, too many
    or too large files): found before the code is linted or run, as ``keep`` would find it after."""
    problems: list[Problem] = []
    found: dict[Path, str] = {}  # folder -> why it cannot be kept ("" when it can); each read once
    for path in files.values():
        if path.parent not in found:
            try:
                collect(path.parent)  # as keep() will
                found[path.parent] = ""
            except (SnapshotError, OSError) as exc:
                found[path.parent] = str(exc)
        if found[path.parent]:
            message = f"the plugin's folder cannot be kept with the job: {found[path.parent]}"
            problems.append(Problem(str(path), message, None, "plugins"))
    return problems


def keep(store: Store, revision: Revision) -> dict[str, dict[str, Any]]:
    """Store each plugin folder of the revision by content hash (as submission keeps them: the
    plugin file's whole folder); plugin file -> its record."""
    plugins: dict[str, dict[str, Any]] = {}
    contents: dict[str, dict[str, bytes]] = {}
    problems = []
    for file, path in revision.files.items():
        try:
            files = collect(path.parent)
        except (SnapshotError, OSError) as exc:
            message = f"the plugin's folder cannot be kept with the job: {exc}"
            problems.append(Problem(str(path), message, None, "plugins"))
            continue
        code_hash = content_hash(files)
        contents[code_hash] = files
        plugins[file] = {"code_hash": code_hash, "file": path.name, "path": str(path)}
    if problems:
        raise InvalidValueError(problems)
    for code_hash, files in contents.items():
        store.put_code(code_hash, files)
    return plugins


def commit(store: Store, revision: Revision, *, source: str | None = None) -> str:
    """Store the revision's code, make it the code of the job's next attempts and queue the retry;
    returns the code set's hash. ``source``: where the code came from (default: its folder)."""
    job = store.get_job(revision.job_id)
    if job is None or job.status not in RETRYABLE:  # retried or deleted while its code was tested
        state = job.status if job is not None else "deleted"
        raise RevisionError(
            f"job {revision.job_id} is {state} now; only a failed or cancelled job can be retried"
        )
    plugins = keep(store, revision)
    code_hash = set_hash(plugins)
    source = source or str(revision.code_dir)
    revised = {"plugins": plugins, "code_hash": code_hash, "source": source, "at": time.time()}
    reason = f"manual retry with code {code_hash[:12]} from {source}"
    store.update_job(revision.job_id, next_retry_at=None)
    try:  # the code and the retry in one step: a retry that raced this one keeps its own code
        store.transition(revision.job_id, "queued", reason, spec={**job.spec, KEY: revised})
    except IllegalTransitionError as exc:
        raise RevisionError(
            f"job {revision.job_id} is {exc.current} now (another retry queued it while this code was "
            "checked); only a failed or cancelled job can be retried: this code was not applied"
        ) from None
    return code_hash


def timeline(store: Store, job_id: int) -> list[CodeSpan]:
    """Each attempt with the code it ran and the steps that stand from it: from its resume point to
    the next attempt's (whose resume discarded the steps after it), the last one to ``steps_done``.
    An attempt recorded before attempts kept their code shows the submitted code."""
    job = store.get_job(job_id)
    attempts = store.list_attempts(job_id)
    if job is None or not attempts:
        return []
    code = {c.attempt: c for c in store.attempt_code(job_id)}
    submitted = dict((job.spec.get(SUBMITTED) or {}).get("plugins") or {}) if has_snapshot(job.spec) else {}
    spans = []
    for i, a in enumerate(attempts):
        end = attempts[i + 1].resumed_from_step if i + 1 < len(attempts) else job.steps_done
        ran = code.get(a.number)
        plugins = ran.plugins if ran is not None else submitted
        spans.append(
            CodeSpan(
                attempt=a.number,
                status=a.status,
                code_hash=ran.code_hash if ran is not None else (set_hash(plugins) if plugins else ""),
                source=ran.source if ran is not None else SUBMITTED_SOURCE,
                first_step=a.resumed_from_step + 1,
                last_step=end,
                plugins=plugins,
            )
        )
    return spans


def diff(store: Store, before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> str:
    """A unified diff of two plugin code sets, file by file (``a/<plugin folder>/<file>``); "" when equal.

    Bounded in size and time: at most MAX_DIFF_LINES lines of at most MAX_DIFF_LINE_CHARS characters,
    MAX_DIFF_CHARS in all (then the rest is left out, not computed); a binary file, one over
    MAX_DIFF_FILE_BYTES, or files past MAX_DIFF_INPUT_LINES lines diffed show as their size and hash.
    Control characters in file names are escaped (``\\n``), so a name cannot add lines of its own."""
    out: list[str] = []
    chars = 0
    budget = MAX_DIFF_INPUT_LINES  # lines still to give difflib (its time grows faster than them)
    done: set[tuple[str, str, str]] = set()  # plugin files of one folder share its code: diffed once
    for plugin in sorted({*before, *after}):
        folder = str(Path(plugin).parent)
        pair = (folder, _hash(before.get(plugin)), _hash(after.get(plugin)))
        if pair in done:
            continue
        done.add(pair)
        old = _files(store, before.get(plugin))
        new = _files(store, after.get(plugin))
        for rel in sorted({*old, *new}):
            if old.get(rel) == new.get(rel):
                continue
            name = _CONTROL.sub(lambda m: repr(m.group())[1:-1], f"{folder}/{rel}")
            a, b = _lines(old.get(rel)), _lines(new.get(rel))
            if len(a) + len(b) > budget:
                a, b = _summary(old.get(rel)), _summary(new.get(rel))
            budget -= len(a) + len(b)
            for line in difflib.unified_diff(
                a, b, f"a/{name}" if rel in old else "/dev/null", f"b/{name}" if rel in new else "/dev/null"
            ):
                line = line if line.endswith("\n") else line + "\n"
                if len(line) > MAX_DIFF_LINE_CHARS:
                    cut = len(line) - MAX_DIFF_LINE_CHARS
                    line = f"{line[:MAX_DIFF_LINE_CHARS]} ... ({cut} more characters not shown)\n"
                if len(out) >= MAX_DIFF_LINES or chars + len(line) > MAX_DIFF_CHARS:
                    out.append(
                        f"... the rest of the diff is not shown (over {MAX_DIFF_LINES} lines or "
                        f"{MAX_DIFF_CHARS} characters)\n"
                    )
                    return "".join(out)
                out.append(line)
                chars += len(line)
    return "".join(out)


def _hash(record: dict[str, Any] | None) -> str:
    return str((record or {}).get("code_hash") or "")


def _files(store: Store, record: dict[str, Any] | None) -> dict[str, bytes]:
    if not record or not record.get("code_hash"):
        return {}
    return store.get_code(str(record["code_hash"]))


def _lines(data: bytes | None) -> list[str]:
    if data is None:
        return []
    if b"\0" in data[:8192] or len(data) > MAX_DIFF_FILE_BYTES:
        return _summary(data)
    return data.decode("utf-8", "replace").splitlines(keepends=True)


def _summary(data: bytes | None) -> list[str]:
    """A file named by its size and content hash (one line), for one not diffed line by line."""
    if data is None:
        return []
    if b"\0" in data[:8192]:
        kind = "binary file"
    elif len(data) > MAX_DIFF_FILE_BYTES:
        kind = "file too large to diff line by line"
    else:
        kind = f"file not diffed line by line: the diff's bound of {MAX_DIFF_INPUT_LINES} lines is reached"
    return [f"({kind}, {len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()[:12]})\n"]
