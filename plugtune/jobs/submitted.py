"""What a job was submitted with, kept so that every attempt (and replay) runs exactly that.

When a job is created its job.yaml's text is its ``spec_yaml``; each plugin's folder is stored by
content hash (the files and bounds of the runtime's code snapshot) and each data file's sha256 and
size are recorded under the spec's ``submitted`` key. An attempt writes the stored folders into the
job's folder, validates the stored job.yaml with its plugins read from there, and refuses a data
file whose content changed since: editing job.yaml, a plugin or a dataset after submitting changes
nothing the job runs. A job recorded before this (no ``submitted`` key) is read from its files.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from plugtune.errors import InvalidDataError, InvalidValueError, Problem
from plugtune.jobs.plugins import ROLES
from plugtune.jobs.report import JOB_WARNINGS
from plugtune.runtime.snapshot import SnapshotError, collect, content_hash
from plugtune.spec.models import parse_entry
from plugtune.spec.validation import ValidatedJob, validate_job
from plugtune.store import Store
from plugtune.types import LogLine

log = logging.getLogger(__name__)

KEY = "submitted"  # the job spec's key for what is kept
REVISED_KEY = "code"  # the job spec's key for new plugin code a retry was given (jobs.revision)
DATA_KEYS = ("train", "validation")
CHUNK = 1 << 20


def keep(store: Store, job: ValidatedJob) -> dict[str, Any]:
    """Store each plugin folder's files and fingerprint the data files of a validated job; the record
    goes in the job's spec under :data:`KEY`. ``InvalidValueError`` naming the plugin's entry when its
    folder cannot be kept (over the runtime snapshot's bounds, a link out of it, ...)."""
    plugins: dict[str, dict[str, str]] = {}
    problems = []
    for ref in job.plugin_refs():
        file = parse_entry(ref.entry).file
        if ref.path is None or file is None or file in plugins:
            continue
        try:
            files = collect(ref.path.parent)
        except (SnapshotError, OSError) as exc:
            message = f"the plugin's folder cannot be kept with the job: {exc}"
            problems.append(Problem(str(job.job_file), message, ref.line, f"{ref.field}.entry"))
            continue
        code_hash = content_hash(files)
        store.put_code(code_hash, files)
        plugins[file] = {"code_hash": code_hash, "file": ref.path.name, "path": str(ref.path)}
    if problems:
        raise InvalidValueError(problems)
    paths = {"train": job.train_path, "validation": job.validation_path}
    data = {key: fingerprint(path) for key, path in paths.items() if path is not None}
    return {"plugins": plugins, "data": data}


def fingerprint(path: Path) -> dict[str, Any]:
    """``{"path", "sha256", "bytes"}`` of a data file."""
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as stream:
        while chunk := stream.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return {"path": str(path), "sha256": digest.hexdigest(), "bytes": size}


def has_snapshot(spec: dict[str, Any]) -> bool:
    return isinstance(spec.get(KEY), dict)


def plugins_to_run(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The plugin folders an attempt runs (job.yaml's plugin file -> ``{code_hash, file, path}``): the
    code of the newest ``jobs retry --code`` (:mod:`plugtune.jobs.revision`), else the submitted code."""
    revised = spec.get(REVISED_KEY)
    if isinstance(revised, dict) and isinstance(revised.get("plugins"), dict):
        return dict(revised["plugins"])
    kept = spec.get(KEY)
    return dict(kept.get("plugins") or {}) if isinstance(kept, dict) else {}


def load(store: Store, job_id: int, spec: dict[str, Any], folder: Path) -> ValidatedJob:
    """The job as it was submitted: its stored job.yaml validated with the plugins written from the
    store under ``folder`` and its data files checked against their fingerprints
    (``InvalidDataError`` naming a file that changed or went).

    A job that holds no snapshot (recorded by an older plugtune, or failed validation when it was
    submitted) is validated from its files as they are now, as before, and its log says so; what
    passes is kept for it then (its spec and job.yaml in the store become those), so the console
    shows what runs and its later retries run the same."""
    job_file = Path(str(spec["job_file"]))
    base_dir = spec.get("base_dir")
    if not has_snapshot(spec):
        message = (
            f"job {job_id} holds no snapshot of what was submitted (it was recorded by an older plugtune, "
            f"or failed validation when submitted): its job.yaml and plugins are read from {job_file} "
            "as they are now, and kept for its later retries"
        )
        log.warning("%s", message)
        store.write_batch(job_id, logs=[LogLine(time.time(), "WARNING", JOB_WARNINGS, message, "trainer")])
        job = validate_job(job_file, base_dir=base_dir)
        _adopt(store, job_id, spec, job)
        return job
    kept = spec[KEY]
    check_data(job_file, kept.get("data") or {})
    recorded = store.get_job(job_id)
    text = recorded.spec_yaml if recorded is not None else ""
    files = write_plugins(store, job_file, plugins_to_run(spec), folder)
    return validate_job(job_file, base_dir=base_dir, text=text, plugin_files=files)


def _adopt(store: Store, job_id: int, spec: dict[str, Any], job: ValidatedJob) -> None:
    where: dict[str, Any] = {k: spec[k] for k in ("job_file", "base_dir") if k in spec}
    kept = {**where, **job.spec.model_dump(mode="json"), KEY: keep(store, job)}
    store.update_job(job_id, spec=kept, spec_yaml=job.text, steps_total=job.spec.hyperparameters.steps)


def name_origins(store: Store, job_id: int, job: ValidatedJob, spec: dict[str, Any]) -> None:
    """Show each deployed plugin's entry as the file it was submitted from (``path:function``), not
    its copy in the job's folder that the runtime deployed (the code shown is the copy's: the same)."""
    kept = plugins_to_run(spec)
    for ref in job.plugin_refs():
        file = parse_entry(ref.entry).file
        origin = (kept.get(file) or {}).get("path") if file is not None else None
        if origin:
            store.upsert_plugin(job_id, ref.name, ROLES[ref.kind], f"{origin}:{ref.function}")


def check_data(job_file: Path, data: dict[str, Any]) -> None:
    """``InvalidDataError`` for each data file whose content is not the one the job was submitted with."""
    problems = []
    for key in DATA_KEYS:
        kept = data.get(key)
        if not isinstance(kept, dict):
            continue
        path = Path(str(kept["path"]))
        try:
            now = fingerprint(path)
        except OSError as exc:
            problems.append(_changed(job_file, key, path, f"can no longer be read ({exc.strerror or exc})"))
            continue
        if now["sha256"] != kept["sha256"]:
            was, size = kept["sha256"][:12], kept["bytes"]
            what = f"changed since the job was submitted (sha256 {was}..., {size} bytes then; "
            what += f"{now['sha256'][:12]}..., {now['bytes']} bytes now)"
            problems.append(_changed(job_file, key, path, what))
    if problems:
        raise InvalidDataError(problems)


def _changed(job_file: Path, key: str, path: Path, what: str) -> Problem:
    message = (
        f"data.{key} {path} {what}: a job trains on the data it was submitted with; restore the file, "
        "or submit the job again to train on the new data"
    )
    return Problem(str(path), message, None, f"data.{key}")


def write_plugins(store: Store, job_file: Path, plugins: dict[str, Any], folder: Path) -> dict[str, Path]:
    """Write each kept plugin folder from the store under ``folder/<code hash>`` (once; rewritten when
    what is there differs) and return job.yaml's plugin file -> its copy."""
    out: dict[str, Path] = {}
    for file, kept in plugins.items():
        code_hash = str(kept["code_hash"])
        target = folder / code_hash
        if not _holds(target, code_hash):
            files = store.get_code(code_hash)
            if not files:
                message = (
                    f"the code of plugin file {file} kept when the job was submitted ({code_hash[:12]}) is "
                    "not in the store; submit the job again"
                )
                raise InvalidDataError([Problem(str(job_file), message, None, "plugins")])
            _write(files, target)
        out[file] = target / str(kept["file"])
    return out


def _holds(target: Path, code_hash: str) -> bool:
    try:
        return target.is_dir() and content_hash(collect(target)) == code_hash
    except (SnapshotError, OSError):
        return False


def _write(files: dict[str, bytes], target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".staging-"))
    for rel, data in files.items():
        dest = staging / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
