"""``plugtune jobs``: list, show, retry and cancel jobs."""

from __future__ import annotations

import time

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
    from plugtune.jobs.control import queue_positions

    with opened_store() as (_, store):
        jobs = store.list_jobs(status or None, limit=limit)
        places = queue_positions(store)
        if as_json:
            echo_json({"jobs": [{**j.to_dict(), "queue_position": places.get(j.id)} for j in jobs]})
            return
        for job in jobs:
            failure = f"  {error_title(job.error.to_dict())}" if job.error else ""
            place = f"  (#{places[job.id]} in the queue)" if job.id in places else ""
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(job.updated_at))
            steps = f"{job.steps_done:>4}/{job.steps_total:<4}"
            typer.echo(f"{job.id:>5}  {job.status:<10} {steps} {when}  {job.name}{failure}{place}")


def jobs_show(job_id: int = typer.Argument(..., help="Job id."), as_json: bool = JSON_OPTION) -> None:
    """Show a job: status, progress, the classified error with its hint, warnings (off-policy
    training, dropped policy tokens, steps whose groups gave no gradient, replies cut at
    max_new_tokens, each with example trajectory ids), the dependency outage a running job waits
    out, attempts, plugins, and each plugin's ctx.metric values of the newest step (mean, min,
    max, count)."""
    from plugtune.jobs.caller import waiting_summary
    from plugtune.jobs.control import queue_positions

    with opened_store() as (_, store):
        doc = {**job_or_exit(store, job_id), "queue_position": queue_positions(store).get(job_id)}
        latest = {m.name: m.value for m in store.latest_metrics([job_id], plugin="")}
        doc["waiting"] = (waiting_summary(latest) or None) if doc["status"] == "running" else None
        if as_json:
            echo_json(doc)
            return
        typer.echo(
            f"job {doc['id']} {doc['name']}: {doc['status']} ({doc['steps_done']}/{doc['steps_total']} steps)"
        )
        if doc["queue_position"] is not None:
            ahead = doc["queue_position"] - 1
            typer.echo(f"  #{doc['queue_position']} in the queue ({ahead} queued job(s) start before it)")
        if doc["waiting"]:
            typer.echo(f"  {doc['waiting']}")
        if doc["error"]:
            echo_error(doc["error"])
        if doc["next_retry_at"] and doc["status"] == "failed":
            wait = max(0, doc["next_retry_at"] - time.time())
            retry = f"automatic retry {doc['auto_retries']} in {wait:.0f} s"
            typer.echo(f"{retry} (or now: plugtune jobs retry {job_id})")
        for a in doc["attempts"]:
            cause = f" — {error_title(a['error'])}" if a.get("error") else ""
            typer.echo(f"  attempt {a['number']}: {a['status']} (from step {a['resumed_from_step']}){cause}")
        for warning in doc["warnings"]:
            typer.secho(f"  warning: {warning}", fg="yellow")
        for p in doc["plugins"]:
            reason = f" — {p['failure_reason']}" if p["failure_reason"] else ""
            typer.echo(
                f"  plugin {p['name']} ({p['role']}): {p['status']} code {p['code_hash'][:12]}{reason}"
            )
        if doc["metrics"]:
            shown = {
                k: v
                for k, v in doc["metrics"].items()
                if k in ("reward/mean", "loss", "kl", "response_length")
            }
            typer.echo("  latest: " + ", ".join(f"{k}={v:.4g}" for k, v in shown.items()))
        _echo_plugin_metrics(doc["plugin_metrics"])


def _echo_plugin_metrics(found: dict[str, dict[str, dict[str, float]]], most: int = 20) -> None:
    rows = [(plugin, name, v) for plugin, names in found.items() for name, v in names.items()]
    for plugin, name, v in rows[:most]:
        typer.echo(
            f"  metric {plugin} {name} (step {v.get('step', 0):.0f}): mean {v.get('mean', 0):.4g}, "
            f"min {v.get('min', 0):.4g}, max {v.get('max', 0):.4g}, {v.get('count', 0):.0f} values"
        )
    if len(rows) > most:
        typer.echo(f"  ... and {len(rows) - most} more plugin metrics (jobs show --json has them all)")


def jobs_retry(job_id: int = typer.Argument(..., help="Job id.")) -> None:
    """Retry a failed or cancelled job now; it resumes from its last checkpoint.

    `plugtune serve` runs the retried job (it reads the same store)."""
    from plugtune.jobs.control import NotRetryableError, retry_job
    from plugtune.jobs.scheduler import JobNotFoundError
    from plugtune.store import IllegalTransitionError

    with opened_store() as (_, store):
        try:
            retry_job(store, job_id)
        except (JobNotFoundError, IllegalTransitionError, NotRetryableError) as exc:
            typer.echo(f"plugtune: {exc}", err=True)
            raise typer.Exit(2) from None
        typer.echo(f"job {job_id} queued for retry; it resumes from its last checkpoint")


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
