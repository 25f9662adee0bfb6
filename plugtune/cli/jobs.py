"""``plugtune jobs``: list, show, retry and cancel jobs."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from plugtune.cli.base import JSON_OPTION, echo_error, echo_json, error_title, job_or_exit, opened_store


def jobs_list(
    status: str = typer.Option(
        "", help="Only jobs in this status (queued, running, succeeded, failed, ...)."
    ),
    limit: int = typer.Option(50, min=1, max=10_000, help="How many jobs, newest first."),
    as_json: bool = JSON_OPTION,
) -> None:
    """List jobs, newest first."""
    from plugtune.store import JobStatus

    if status and status not in {s.value for s in JobStatus}:
        typer.echo(
            f"plugtune: unknown status {status!r}; one of {', '.join(s.value for s in JobStatus)}", err=True
        )
        raise typer.Exit(2)
    from plugtune.web.service import job_listing

    with opened_store() as (_, store):
        jobs = job_listing(store, store.list_jobs(status or None, limit=limit))
    if as_json:
        echo_json({"jobs": [j.model_dump(mode="json") for j in jobs]})
        return
    for job in jobs:
        failure = f"  {error_title(job.error)}" if job.error else ""
        place = f"  (#{job.queue_position} in the queue)" if job.queue_position is not None else ""
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(job.updated_at))
        steps = f"{job.steps_done:>4}/{job.steps_total:<4}"
        typer.echo(f"{job.id:>5}  {job.status:<10} {steps} {when}  {job.name}{failure}{place}")


def jobs_show(job_id: int = typer.Argument(..., help="Job id."), as_json: bool = JSON_OPTION) -> None:
    """Show a job: status, progress, the classified error with its hint, warnings (off-policy
    training, dropped policy tokens, steps whose groups gave no gradient, replies cut at
    max_new_tokens, each with example trajectory ids), the dependency outage a running job waits
    out, attempts, plugins, and each plugin's ctx.metric values of the newest step (mean, min,
    max, count)."""
    from plugtune.jobs.report import task_lines
    from plugtune.jobs.revision import timeline

    with opened_store() as (_, store):
        job = job_or_exit(store, job_id)
        code = {span.attempt: span for span in timeline(store, job_id)}
    if as_json:
        echo_json(job.model_dump(mode="json"))
        return
    typer.echo(f"job {job.id} {job.name}: {job.status} ({job.steps_done}/{job.steps_total} steps)")
    if job.queue_position is not None:
        ahead = job.queue_position - 1
        typer.echo(f"  #{job.queue_position} in the queue ({ahead} queued job(s) start before it)")
    if job.waiting:
        typer.echo(f"  {job.waiting}")
    if job.error:
        echo_error(job.error)
    if job.next_retry_at and job.status == "failed":
        wait = max(0, job.next_retry_at - time.time())
        retry = f"automatic retry {job.auto_retries} in {wait:.0f} s"
        typer.echo(f"{retry} (or now: plugtune jobs retry {job_id})")
    for a in job.attempts:
        cause = f" — {error_title(a.error)}" if a.error else ""
        span = code.get(a.number)
        ran = f", code {span.code_hash[:12]} ({span.source})" if span is not None and span.code_hash else ""
        typer.echo(f"  attempt {a.number}: {a.status} (from step {a.resumed_from_step}{ran}){cause}")
    for warning in job.warnings:
        typer.secho(f"  warning: {warning}", fg="yellow")
    for p in job.plugins:
        reason = f" — {p.failure_reason}" if p.failure_reason else ""
        typer.echo(f"  plugin {p.name} ({p.role}): {p.status} code {p.code_hash[:12]}{reason}")
    if job.metrics:
        headline = ("reward/mean", "loss", "kl", "response_length")
        shown = {k: v for k, v in job.metrics.items() if k in headline}
        typer.echo("  latest: " + ", ".join(f"{k}={v:.4g}" for k, v in shown.items()))
        for line in task_lines(job.metrics):  # a multi-task job: each task's own numbers
            typer.echo(f"  {line}")
    _echo_plugin_metrics(job.plugin_metrics)


def _echo_plugin_metrics(found: dict[str, dict[str, dict[str, float]]], most: int = 20) -> None:
    rows = [(plugin, name, v) for plugin, names in found.items() for name, v in names.items()]
    for plugin, name, v in rows[:most]:
        typer.echo(
            f"  metric {plugin} {name} (step {v.get('step', 0):.0f}): mean {v.get('mean', 0):.4g}, "
            f"min {v.get('min', 0):.4g}, max {v.get('max', 0):.4g}, {v.get('count', 0):.0f} values"
        )
    if len(rows) > most:
        typer.echo(f"  ... and {len(rows) - most} more plugin metrics (jobs show --json has them all)")


def jobs_retry(
    job_id: int = typer.Argument(..., help="Job id."),
    code: Path | None = typer.Option(
        None,
        "--code",
        help="Resume with the plugin code in this project folder (each plugin file at the path job.yaml "
        "names, e.g. DIR/plugins/grader.py), after it passes lint and a quick test on the job's own "
        "trajectories; job.yaml, data and hyperparameters stay as submitted.",
        file_okay=False,
    ),
    server: str = typer.Option(
        "",
        "--server",
        metavar="URL",
        help="Retry on the `plugtune serve` at URL over its API (POST /api/jobs/ID/retry, the console's "
        "too; --code's folder is uploaded; token: $PLUGTUNE_API_TOKEN) instead of in the local store.",
    ),
) -> None:
    """Retry a failed or cancelled job now; it resumes from its last checkpoint. Without --code it
    runs the code it was submitted with (or its last --code), never the files on disk. With --code
    DIR the new code is first validated against the stored job.yaml, linted and run in the function
    runtime's sandbox on the job's newest failed groups (the policy's recorded answers played back):
    any problem refuses it (exit 1, nothing changed); otherwise it is stored by content hash and the
    job's next attempts run it. `plugtune serve` runs the retried job (it reads the same store)."""
    from plugtune.jobs.control import NotRetryableError, retry_job
    from plugtune.jobs.scheduler import JobNotFoundError
    from plugtune.store import IllegalTransitionError

    if server:
        _retry_remote(server, job_id, code)
        return
    if code is not None:
        _retry_with_code(job_id, code)
        return
    with opened_store() as (_, store):
        try:
            retry_job(store, job_id)
        except (JobNotFoundError, IllegalTransitionError, NotRetryableError) as exc:
            typer.echo(f"plugtune: {exc}", err=True)
            raise typer.Exit(2) from None
        typer.echo(f"job {job_id} queued for retry; it resumes from its last checkpoint")


def _retry_remote(server: str, job_id: int, code: Path | None) -> None:
    import os

    from plugtune.jobs.remote import Rejected, RemoteError, retry_remote

    try:
        answer = retry_remote(server, job_id, code, os.environ.get("PLUGTUNE_API_TOKEN") or None)
    except RemoteError as exc:
        typer.echo(f"plugtune: {exc}", err=True)
        raise typer.Exit(2) from None
    if isinstance(answer, Rejected):
        typer.echo(f"plugtune: {answer.detail}:", err=True)
        for p in answer.problems:
            where = (f"{p.file}:{p.line}" if p.line else p.file) + (f" [{p.field}]" if p.field else "")
            typer.echo(f"  - {where + ': ' if where else ''}{p.message}", err=True)
        raise typer.Exit(1)
    for line in answer.get("tested") or []:
        typer.echo(f"  tested: {line}")
    for line in answer.get("notes") or []:
        typer.secho(f"  note: {line}", fg="yellow")
    typer.echo(str(answer.get("message") or f"job {job_id} queued for retry"))


def _retry_with_code(job_id: int, code: Path) -> None:
    from plugtune.errors import DataError
    from plugtune.jobs.revision import RevisionError
    from plugtune.jobs.scheduler import JobNotFoundError
    from plugtune.web.code_retry import CodeRefusedError, retry_with_code
    from plugtune.web.service import retry_note

    with opened_store() as (_, store):
        try:
            done = retry_with_code(store, job_id, code)
        except (JobNotFoundError, RevisionError) as exc:
            typer.echo(f"plugtune: {exc}", err=True)
            raise typer.Exit(2) from None
        except DataError as exc:
            refused = f"plugtune: job {job_id}: the code in {code} is refused; nothing was changed:"
            typer.echo(refused, err=True)
            for p in exc.problems:
                where = f"{p.file}:{p.line}" if p.line else p.file
                field = f" [{p.field}]" if p.field else ""
                typer.echo(f"  - {where}{field}: {p.message}", err=True)
            raise typer.Exit(1) from None
        except CodeRefusedError as exc:
            typer.echo(f"plugtune: {exc}", err=True)
            raise typer.Exit(1) from None
        job = store.get_job(job_id)
        note = retry_note(store, job) if job is not None else ""
    for line in done.tested:
        typer.echo(f"  tested: {line}")
    for line in done.notes:
        typer.secho(f"  note: {line}", fg="yellow")
    typer.echo(
        f"job {job_id} queued for retry with code {done.code_hash[:12]} (was {done.previous_hash[:12]}); "
        f"it {note}"
    )


def jobs_cancel(job_id: int = typer.Argument(..., help="Job id.")) -> None:
    """Cancel a queued, running or retry-pending job (one waiting for its automatic retry)."""
    from plugtune.jobs.scheduler import JobNotFoundError, NotCancellableError, request_cancel
    from plugtune.store import IllegalTransitionError

    with opened_store() as (_, store):
        try:
            request_cancel(store, job_id)
        except (JobNotFoundError, NotCancellableError, IllegalTransitionError) as exc:
            typer.echo(f"plugtune: {exc}", err=True)
            raise typer.Exit(2) from None
        typer.echo(f"job {job_id} cancelled")
