"""Commands that run a job: ``run``, ``submit`` (here or to a server), ``eval`` and ``demo``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from plugtune.cli.base import JSON_OPTION, echo_error, echo_json, job_or_exit, opened_store, supervising_alone

if TYPE_CHECKING:
    from plugtune.store import Store


def run(job_file: str = typer.Argument(..., help="The job's job.yaml.")) -> None:
    """Validate and run a job in the foreground with a progress bar; Ctrl-C cancels it cleanly.

    Exits 0 when the job succeeds and prints where the trained model is
    ($PLUGTUNE_HOME/jobs/<id>/final/, a Hugging Face folder); 1 when it fails (the classified
    error is printed); 2 when a `plugtune serve` is serving the store (submit the job to it)."""
    from plugtune.jobs.control import create_job
    from plugtune.jobs.progress import run_with_progress

    with opened_store(create=True) as (settings, store), supervising_alone(settings, "run"):
        job_id, invalid = create_job(store, job_file)
        if invalid is not None:
            typer.echo(f"job {job_id} failed validation before any compute:", err=True)
            _echo_job_error(store, job_id)
            raise typer.Exit(1)
        status = run_with_progress(store, settings, job_id)
        doc = job_or_exit(store, job_id)
        typer.echo(f"job {job_id} {status} after {doc.steps_done}/{doc.steps_total} steps")
        final = settings.home / "jobs" / str(job_id) / "final"
        if status == "succeeded" and final.is_dir():
            typer.echo(f"trained model: {final.resolve()} (AutoModelForCausalLM.from_pretrained(path))")
        for warning in doc.warnings:  # what trained silently wrong, e.g. steps with no gradient
            typer.secho(f"warning: {warning}", fg="yellow", err=True)
        if status == "cancelled":
            typer.echo(f"`plugtune jobs retry {job_id}` resumes it from its last checkpoint", err=True)
        if status != "succeeded":
            if doc.error:
                if status == "cancelled":
                    typer.echo("before it was cancelled, its last attempt had failed with:", err=True)
                echo_error(doc.error)
            typer.echo(f"evidence: plugtune doctor {job_id}", err=True)
            raise typer.Exit(1)


def _echo_job_error(store: Store, job_id: int) -> None:
    """The job's classified error (a job that failed validation has one)."""
    error = job_or_exit(store, job_id).error
    if error is not None:
        echo_error(error)


def submit(
    job_file: str = typer.Argument(..., help="The job's job.yaml."),
    server: str = typer.Option(
        "",
        "--server",
        metavar="URL",
        help="Submit to the `plugtune serve` at URL over its API (token: $PLUGTUNE_API_TOKEN): the "
        "job.yaml's folder is packed (without .plugtune/, .venv/, __pycache__/, .git/) and sent.",
    ),
) -> None:
    """Validate a job and queue it for the server started with `plugtune serve` (same store), or with
    --server for a server elsewhere.

    Exits 0 when the job is queued (its id and console URL are printed), 1 when it fails validation
    (every problem with file, line and field), 2 when the server cannot be reached or refuses."""
    from pathlib import Path

    if server:
        _submit_remote(server, Path(job_file))
        return
    from plugtune.jobs.control import create_job
    from plugtune.jobs.remote import serving_url

    with opened_store(create=True) as (settings, store):
        job_id, invalid = create_job(store, job_file)
        if invalid is not None:
            typer.echo(f"job {job_id} failed validation before any compute:", err=True)
            _echo_job_error(store, job_id)
            raise typer.Exit(1)
        url = serving_url(settings.home)
        if url is None:
            typer.echo(
                f"job {job_id} queued; no `plugtune serve` is running on this store ({settings.home}): "
                "start one to run it"
            )
        else:
            typer.echo(f"job {job_id} queued; `plugtune serve` runs it (console: {url}jobs/{job_id})")


def _submit_remote(server: str, job_file: Any) -> None:
    import os

    from plugtune.jobs.remote import RemoteError, submit_remote

    try:
        outcome = submit_remote(server, job_file, os.environ.get("PLUGTUNE_API_TOKEN") or None)
    except RemoteError as exc:
        typer.echo(f"plugtune submit: {exc}", err=True)
        raise typer.Exit(2) from None
    base = server.rstrip("/")
    if isinstance(outcome, int):
        typer.echo(f"job {outcome} queued on {base} (console: {base}/jobs/{outcome})")
        return
    if outcome.job_id is not None:
        typer.echo(f"job {outcome.job_id} failed validation before any compute:", err=True)
    typer.secho(outcome.detail, fg="red", err=True)
    for problem in outcome.problems:
        typer.echo(f"  - {problem}", err=True)
    for hint in outcome.hints:
        typer.echo(f"  what to do: {hint}", err=True)
    raise typer.Exit(1)


def eval_model(
    model: str = typer.Argument(
        ...,
        metavar="CHECKPOINT_OR_MODEL",
        help="A checkpoint (.plugtune/jobs/ID/checkpoints/step-N), a job's final model "
        "(.plugtune/jobs/ID/final), any Hugging Face model folder, or builtin:tiny-chat.",
    ),
    job_file: str = typer.Argument(
        ..., help="The job.yaml whose data.validation, plugins and eval: are used."
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Evaluate a model alone on a job's data.validation, through the job's plugins and runtime.

    Prints pass@1 (one greedy reply per row), pass@k (eval.k of eval.samples replies sampled at the
    job's temperature), the mean reward per grader and the response length; nothing is stored.
    Exits 0 when the evaluation ran, 1 when the job or a plugin call failed (the error is printed)."""
    import asyncio

    from plugtune.errors import PlugtuneError
    from plugtune.jobs.caller import JobStop
    from plugtune.jobs.classify import classify
    from plugtune.jobs.evaluate import evaluate_model
    from plugtune.settings import Settings
    from plugtune.spec.validation import validate_job

    try:
        job = validate_job(job_file)
        done = asyncio.run(evaluate_model(model, job, Settings.from_env()))
    except JobStop as stop:
        echo_error(classify(stop.error, evidence={"decision": stop.reason}).to_dict())
        raise typer.Exit(1) from None
    except PlugtuneError as exc:
        echo_error(classify(exc).to_dict())
        raise typer.Exit(1) from None
    metrics, s = done.result.metrics, done.settings
    if as_json:
        echo_json({"model": str(done.model), "rows_file": str(done.rows_file), "metrics": metrics})
        return
    sampled = (
        f"pass@{s.k} of {s.samples} sampled at temperature {s.temperature:g}" if s.samples else "greedy only"
    )
    typer.echo(f"model: {done.model}")
    rows = f"{done.rows_file} ({metrics['eval/rows']:.0f})"
    typer.echo(f"rows:  {rows}; {sampled}; pass: reward >= {s.pass_threshold:g}")
    width = max(len(name) for name in metrics)
    for name, value in metrics.items():
        shown = f"{value:.4g}" if value == value else "- (none scored)"  # NaN: nothing to average
        typer.echo(f"  {name:<{width}}  {shown}")


def demo() -> None:
    """Train the example project end to end (tiny model, arithmetic data, rollout + grader plugins)."""
    from plugtune.jobs.demo import run_demo

    with opened_store(create=True) as (settings, store), supervising_alone(settings, "demo"):
        raise typer.Exit(run_demo(store, settings, typer.echo))
