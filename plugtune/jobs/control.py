"""What a user does to jobs: create (with validation), retry and delete them; cancelling them, and the
server's loop that runs them (``Scheduler``), are :mod:`plugtune.jobs.scheduler`'s."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from plugtune.errors import DataError
from plugtune.jobs import submitted
from plugtune.jobs.classify import classify
from plugtune.jobs.scheduler import require
from plugtune.spec import job_yaml
from plugtune.spec.reach import Confinement, is_submission, submission_root
from plugtune.spec.validation import validate_job
from plugtune.store import Store


class NotRetryableError(ValueError):
    """Raised when retrying a job an engine ran (TRL, verl): its launcher, not plugtune, starts it."""


class NotDeletableError(ValueError):
    """Raised when deleting a job that has not ended (queued, running, or awaiting a retry)."""


ENDED = ("succeeded", "failed", "cancelled")
MAX_QUEUE = 1000  # queued jobs given a position; later ones show none


def create_job(
    store: Store, job_file: str | Path, *, base_dir: Path | None = None, confine: Confinement | None = None
) -> tuple[int, DataError | None]:
    """Record a job from ``job.yaml`` and validate it before any compute.

    A job that fails validation is still recorded (failed, with its classified error) so that
    ``jobs show`` and the console explain it; the error is returned too. ``base_dir``: where the
    relative paths of job.yaml start (default: its folder), kept for the job's attempts. ``confine``:
    where a job submitted over the API may read (see ``validate_job``).

    A valid job is kept as submitted (:mod:`plugtune.jobs.submitted`): the job.yaml text validated,
    each plugin's folder and its data files' fingerprints; every attempt runs that.
    """
    path = Path(job_file).resolve()
    text = path.read_text(errors="replace") if path.is_file() else ""
    name = _declared_name(text) or (path.parent.name if path.name == "job.yaml" else path.stem)
    where = {"job_file": str(path), **({"base_dir": str(base_dir.resolve())} if base_dir else {})}
    try:
        job = validate_job(path, base_dir=base_dir, confine=confine)
        kept = submitted.keep(store, job)
    except DataError as exc:
        job_id = store.create_job(name, where, spec_yaml=text)
        store.set_job_error(job_id, classify(exc), attempt=None)
        store.transition(job_id, "failed", exc.type)
        return job_id, exc
    spec = {**where, **job.spec.model_dump(mode="json"), submitted.KEY: kept}
    job_id = store.create_job(job.spec.name, spec, spec_yaml=job.text)
    store.update_job(job_id, steps_total=job.spec.hyperparameters.steps)
    return job_id, None


def _declared_name(text: str) -> str | None:
    """job.yaml's ``name:`` when the file parses that far (an invalid job keeps the name it asked for,
    not its folder's, which for a submission over the API is a random id)."""
    try:
        raw = job_yaml.load(text)
    except yaml.YAMLError:
        return None
    name = raw.get("name") if isinstance(raw, dict) else None
    return name.strip()[:200] or None if isinstance(name, str) else None


def check_job(
    job_file: Path, *, base_dir: Path | None = None, confine: Confinement | None = None
) -> DataError | None:
    """Validate a job.yaml as ``create_job`` does, recording nothing (a dry run)."""
    try:
        validate_job(job_file, base_dir=base_dir, confine=confine)
    except DataError as exc:
        return exc
    return None


def delete_job(store: Store, home: Path, job_id: int) -> None:
    """Remove an ended job's rows and its files ($PLUGTUNE_HOME/jobs/<id>, and the submission folder
    the API unpacked it into); NotDeletableError while it is queued, running or awaiting a retry."""
    require(store, job_id)
    job = store.get_job(job_id)
    if job is None or job.status not in ENDED or job.next_retry_at is not None:
        state = (
            "waiting for its automatic retry" if job and job.next_retry_at else (job.status if job else "")
        )
        raise NotDeletableError(
            f"job {job_id} is {state}; only a succeeded, failed or cancelled job can be deleted: "
            f"cancel it first (`plugtune jobs cancel {job_id}`)"
        )
    job_file = Path(str(job.spec.get("job_file") or ""))
    store.delete_job(job_id)
    shutil.rmtree(home / "jobs" / str(job_id), ignore_errors=True)
    if job_file.name and is_submission(home, job_file):
        shutil.rmtree(submission_root(home, job_file), ignore_errors=True)


def queue_positions(store: Store) -> dict[int, int]:
    """Queued job id -> its place in the queue (1 starts next: the scheduler takes the oldest)."""
    queued = store.list_jobs("queued", limit=MAX_QUEUE)
    return {j.id: i + 1 for i, j in enumerate(reversed(queued))}


def retry_job(store: Store, job_id: int, *, reason: str = "manual retry") -> None:
    """Put a failed or cancelled job back in the queue now; it resumes from its last checkpoint.
    ``reason`` (its status history's) starts with "manual retry"."""
    require(store, job_id)
    job = store.get_job(job_id)
    if job is not None and "engine" in job.spec:
        raise NotRetryableError(
            f"job {job_id} was run by {job.spec['engine']} from its own launcher, which plugtune "
            "cannot start again: run that script (or command) again; it records a new job"
        )
    store.update_job(job_id, next_retry_at=None)
    store.transition(job_id, "queued", reason)
