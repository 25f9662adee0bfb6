"""The ``plugtune`` command line. Each command's docstring is its ``--help``."""

from __future__ import annotations

import errno
import json
import signal
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from plugtune.settings import Settings
    from plugtune.store import Store

app = typer.Typer(
    name="plugtune",
    help="RL fine-tuning whose rollouts and graders are your own plugins, failing precisely.",
    no_args_is_help=True,
    add_completion=False,
)
jobs_app = typer.Typer(help="List, inspect, retry and cancel jobs.", no_args_is_help=True)
app.add_typer(jobs_app, name="jobs")

JSON_OPTION = typer.Option(False, "--json", help="Print one JSON document.")


@app.callback()
def _reveal_bidi_controls() -> None:
    # Every command prints text a plugin or a dataset wrote (logs, errors, replies): its bidi
    # controls are shown as ⟨U+202E⟩, as the console shows them, never obeyed by the terminal.
    from plugtune.bidi import RevealingStream

    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if not isinstance(stream, RevealingStream):
            setattr(sys, name, RevealingStream(stream))


@contextmanager
def _opened_store(create: bool = False) -> Iterator[tuple[Settings, Store]]:
    """The store named by the environment; a database problem is a clear message, not a traceback.

    Only commands that start work (``create=True``) make a new store; the others say where they
    looked when there is none, instead of answering from a new, empty one. While a command that
    starts work runs, what it (and the attempts it starts) writes is owner-only (umask 077)."""
    from plugtune.home import owner_only_files

    with owner_only_files() if create else nullcontext():
        with _store_or_exit(create) as opened:
            yield opened


@contextmanager
def _store_or_exit(create: bool) -> Iterator[tuple[Settings, Store]]:
    from plugtune.errors import PlugtuneError
    from plugtune.settings import Settings, store_source
    from plugtune.store import Store, sqlite_file

    try:
        settings = Settings.from_env()
        missing = sqlite_file(settings.database_url)
        if not create and missing is not None and not missing.is_file():
            typer.echo(
                f"plugtune: there is no plugtune store at {missing} ({store_source()}); nothing ran "
                "with it. Run this where you ran `plugtune run` / `plugtune serve`, or point at that "
                "store: export PLUGTUNE_HOME=/path/to/.plugtune (or PLUGTUNE_DATABASE_URL)",
                err=True,
            )
            raise typer.Exit(2)
        store = Store.open(settings.database_url)
    except (PlugtuneError, ValueError) as exc:
        typer.echo(f"plugtune: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        yield settings, store
    finally:
        store.close()


def _echo_json(document: Any) -> None:
    typer.echo(json.dumps(document, indent=2, default=str))


def _error_title(error: dict[str, Any]) -> str:
    """``type: cause``; an error without a cause (a validation failure) shows its message's first
    problem instead of an empty cause."""
    detail = str(error.get("cause") or "")
    if not detail:
        lines = [line.strip() for line in str(error.get("message") or "").splitlines() if line.strip()]
        if len(lines) > 1 and lines[0].endswith(":"):  # "N problems found:" then one line each
            more = f" (and {len(lines) - 2} more)" if len(lines) > 2 else ""
            detail = lines[1].removeprefix("- ") + more
        else:
            detail = lines[0] if lines else ""
        detail = detail if len(detail) <= 160 else detail[:159] + "…"
    return f"{error.get('type')}: {detail}" if detail else str(error.get("type"))


def _echo_error(error: dict[str, Any]) -> None:
    cause = f": {error['cause']}" if error.get("cause") else ""
    typer.secho(f"{error.get('type')} ({error.get('owner')}){cause}", fg="red", err=True)
    typer.echo(f"  {error.get('message')}", err=True)
    typer.echo(f"  what to do: {error.get('hint')}", err=True)


def _job_or_exit(store: Store, job_id: int) -> dict[str, Any]:
    from plugtune.jobs.report import job_document

    try:
        return job_document(store, job_id)
    except LookupError:
        typer.echo(
            f"plugtune: there is no job {job_id} in {store.url}; `plugtune jobs list` shows them", err=True
        )
        raise typer.Exit(2) from None


@app.command()
def version() -> None:
    """Print plugtune's version."""
    from plugtune import __version__

    typer.echo(__version__)


# Commands are added below by their modules' owners; keep each command a thin wrapper.


@app.command()
def lint(
    paths: list[str] = typer.Argument(None, help="Files or folders to check (default: the current folder)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """Check plugins statically: blocking calls in async code, NaN-prone graders, swallowed errors,
    missing decorators, signatures the runtime rejects and reward functions written for TRL or
    verl. Exits 1 when anything is found; when nothing is, says which files, plugins and rules it
    checked. Also notes (on stderr and in --json's summary, never as a finding or in the exit
    status) each grader of a job.yaml that no fixture in the fixtures.jsonl beside it covers."""
    import json

    from plugtune.lint import lint_paths

    try:
        report = lint_paths(paths or ["."])
    except FileNotFoundError as exc:
        typer.echo(f"plugtune lint: {exc}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    else:
        for finding in report.findings:
            typer.echo(str(finding))
        if report.findings:
            typer.echo(f"{len(report.findings)} finding(s) in {len(report.files)} file(s)", err=True)
        else:
            typer.echo(report.checked(), err=True)
        for note in report.notes():
            typer.echo(note, err=True)
    raise typer.Exit(1 if report.findings else 0)


@app.command()
def init(
    directory: str = typer.Argument(..., help="Folder to create (it must be new or empty)."),
    name: str = typer.Option("", help="Job name in job.yaml (default: the folder's name)."),
) -> None:
    """Create a ready project: plugins/rollout.py, plugins/grader.py, data/train.jsonl, job.yaml."""
    from plugtune.init_project import ProjectExistsError, create_project

    try:
        written = create_project(directory, name or None)
    except ProjectExistsError as exc:
        typer.echo(f"plugtune init: {exc}", err=True)
        raise typer.Exit(1) from None
    for path in written:
        typer.echo(f"  created {path}")
    typer.echo(f"\nNext: cd {directory} && plugtune lint && plugtune test && plugtune run job.yaml")


@app.command("test")
def test_plugins(
    job_file: str = typer.Argument("job.yaml", help="The job's job.yaml."),
    samples: int = typer.Option(
        4, min=1, max=100_000, help="Dataset rows to run: one rollout each, group_size with group graders."
    ),
    faas: bool = typer.Option(
        False, "--faas", help="Run in the function runtime with the real limits, at the job's concurrency."
    ),
    concurrency: int = typer.Option(
        0, min=0, max=10_000, help="--faas: rollouts at once (default: batch_size × group_size)."
    ),
    backend: str = typer.Option(
        "",
        "--backend",
        help="--faas: run instances as 'local' processes or 'ray' actors (on $PLUGTUNE_RAY_ADDRESS, "
        "else a local Ray head); default: job.yaml's plugins.runtime_backend.",
    ),
    inject: str = typer.Option("", help="Inject faults: a list of timeout,eof,oom,500,nan."),
    inject_rate: float = typer.Option(0.2, help="Share of calls that get an injected fault (0..1]."),
    seed: int = typer.Option(0, help="Seed of the fault draws."),
    policy_url: str = typer.Option("", help="An OpenAI-compatible endpoint instead of the job's model."),
    policy_model: str = typer.Option("", help="The model name to ask --policy-url for."),
    policy_api_key: str = typer.Option(
        "", envvar="PLUGTUNE_POLICY_API_KEY", show_default=False, help="The API key of --policy-url."
    ),
    expect: str = typer.Option(
        "",
        "--expect",
        help="Grader fixtures (JSONL: row or sample, completion or messages, expect: a reward, null, "
        "failure, retry, discard or error; tolerance, grader, name): check each grader call against "
        "its expected result instead of running rollouts.",
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Run the job's rollout and graders on a few dataset rows and show trajectories, rewards, logs and
    every error with its cause and hint; with --faas, load-test them in the function runtime (QPS,
    latency, errors by cause, the calls that failed on a declared dependency by service and cause,
    apart from the plugins' own errors, memory, instances, event-loop blocking, trainer demand). With
    --expect FILE, run the graders on fixtures whose result is known and print a pass/fail table (exit
    1 when one fails: for CI).

    Without --faas the plugins run in this process, UNSANDBOXED, with your user and files (it is your
    own code; as root a warning says so); --faas runs them in the runtime's sandbox.

    Exits 0 when every call succeeded, 1 when one failed, 2 when the job itself is invalid."""
    from plugtune.pretest.command import TestOptions, fixtures_command, test_command
    from plugtune.pretest.faas import Injection

    if expect:
        raise typer.Exit(fixtures_command(job_file, expect, faas=faas, as_json=as_json))
    try:
        injection = Injection.parse(inject, inject_rate, seed) if inject else None
    except ValueError as exc:
        typer.echo(f"plugtune test: {exc}", err=True)
        raise typer.Exit(2) from None
    if backend not in ("", "local", "ray"):
        typer.echo(f"plugtune test: --backend {backend!r}: use 'local' or 'ray'", err=True)
        raise typer.Exit(2)
    options = TestOptions(
        job_file, samples, policy_url, policy_api_key, policy_model, concurrency, injection, backend
    )
    raise typer.Exit(test_command(options, faas=faas, as_json=as_json))


@app.command()
def run(job_file: str = typer.Argument(..., help="The job's job.yaml.")) -> None:
    """Validate and run a job in the foreground with a progress bar; Ctrl-C cancels it cleanly.

    Exits 0 when the job succeeds and prints where the trained model is
    ($PLUGTUNE_HOME/jobs/<id>/final/, a Hugging Face folder); 1 when it fails (the classified
    error is printed); 2 when a `plugtune serve` is serving the store (submit the job to it)."""
    from plugtune.jobs.control import create_job
    from plugtune.jobs.progress import run_with_progress

    with _opened_store(create=True) as (settings, store), _supervising_alone(settings, "run"):
        job_id, invalid = create_job(store, job_file)
        if invalid is not None:
            typer.echo(f"job {job_id} failed validation before any compute:", err=True)
            _echo_error(_job_or_exit(store, job_id)["error"])
            raise typer.Exit(1)
        status = run_with_progress(store, settings, job_id)
        doc = _job_or_exit(store, job_id)
        typer.echo(f"job {job_id} {status} after {doc['steps_done']}/{doc['steps_total']} steps")
        final = settings.home / "jobs" / str(job_id) / "final"
        if status == "succeeded" and final.is_dir():
            typer.echo(f"trained model: {final.resolve()} (AutoModelForCausalLM.from_pretrained(path))")
        for warning in doc["warnings"]:  # what trained silently wrong, e.g. steps with no gradient
            typer.secho(f"warning: {warning}", fg="yellow", err=True)
        if status == "cancelled":
            typer.echo(f"`plugtune jobs retry {job_id}` resumes it from its last checkpoint", err=True)
        if status != "succeeded":
            if doc["error"]:
                if status == "cancelled":
                    typer.echo("before it was cancelled, its last attempt had failed with:", err=True)
                _echo_error(doc["error"])
            typer.echo(f"evidence: plugtune doctor {job_id}", err=True)
            raise typer.Exit(1)


@app.command()
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

    with _opened_store(create=True) as (settings, store):
        job_id, invalid = create_job(store, job_file)
        if invalid is not None:
            typer.echo(f"job {job_id} failed validation before any compute:", err=True)
            _echo_error(_job_or_exit(store, job_id)["error"])
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


@app.command("eval")
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
        _echo_error(classify(stop.error, evidence={"decision": stop.reason}))
        raise typer.Exit(1) from None
    except PlugtuneError as exc:
        _echo_error(classify(exc))
        raise typer.Exit(1) from None
    metrics, s = done.result.metrics, done.settings
    if as_json:
        _echo_json({"model": str(done.model), "rows_file": str(done.rows_file), "metrics": metrics})
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


@jobs_app.command("list")
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

    with _opened_store() as (_, store):
        jobs = store.list_jobs(status or None, limit=limit)
        places = queue_positions(store)
        if as_json:
            _echo_json({"jobs": [{**j.to_dict(), "queue_position": places.get(j.id)} for j in jobs]})
            return
        for job in jobs:
            failure = f"  {_error_title(job.error.to_dict())}" if job.error else ""
            place = f"  (#{places[job.id]} in the queue)" if job.id in places else ""
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(job.updated_at))
            steps = f"{job.steps_done:>4}/{job.steps_total:<4}"
            typer.echo(f"{job.id:>5}  {job.status:<10} {steps} {when}  {job.name}{failure}{place}")


@jobs_app.command("show")
def jobs_show(job_id: int = typer.Argument(..., help="Job id."), as_json: bool = JSON_OPTION) -> None:
    """Show a job: status, progress, the classified error with its hint, warnings (off-policy
    training, dropped policy tokens, steps whose groups gave no gradient, replies cut at
    max_new_tokens, each with example trajectory ids), the dependency outage a running job waits
    out, attempts, plugins, and each plugin's ctx.metric values of the newest step (mean, min,
    max, count)."""
    from plugtune.jobs.caller import waiting_summary
    from plugtune.jobs.control import queue_positions

    with _opened_store() as (_, store):
        doc = {**_job_or_exit(store, job_id), "queue_position": queue_positions(store).get(job_id)}
        latest = {m.name: m.value for m in store.latest_metrics([job_id], plugin="")}
        doc["waiting"] = (waiting_summary(latest) or None) if doc["status"] == "running" else None
        if as_json:
            _echo_json(doc)
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
            _echo_error(doc["error"])
        if doc["next_retry_at"] and doc["status"] == "failed":
            wait = max(0, doc["next_retry_at"] - time.time())
            retry = f"automatic retry {doc['auto_retries']} in {wait:.0f} s"
            typer.echo(f"{retry} (or now: plugtune jobs retry {job_id})")
        for a in doc["attempts"]:
            cause = f" — {_error_title(a['error'])}" if a.get("error") else ""
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


@jobs_app.command("retry")
def jobs_retry(job_id: int = typer.Argument(..., help="Job id.")) -> None:
    """Retry a failed or cancelled job now; it resumes from its last checkpoint.

    `plugtune serve` runs the retried job (it reads the same store)."""
    from plugtune.jobs.control import JobNotFoundError, NotRetryableError, retry_job
    from plugtune.store import IllegalTransitionError

    with _opened_store() as (_, store):
        try:
            retry_job(store, job_id)
        except (JobNotFoundError, IllegalTransitionError, NotRetryableError) as exc:
            typer.echo(f"plugtune: {exc}", err=True)
            raise typer.Exit(2) from None
        typer.echo(f"job {job_id} queued for retry; it resumes from its last checkpoint")


@jobs_app.command("cancel")
def jobs_cancel(job_id: int = typer.Argument(..., help="Job id.")) -> None:
    """Cancel a queued, running or retry-pending job (one waiting for its automatic retry)."""
    from plugtune.jobs.control import JobNotFoundError, NotCancellableError, request_cancel
    from plugtune.store import IllegalTransitionError

    with _opened_store() as (_, store):
        try:
            request_cancel(store, job_id)
        except (JobNotFoundError, NotCancellableError, IllegalTransitionError) as exc:
            typer.echo(f"plugtune: {exc}", err=True)
            raise typer.Exit(2) from None
        typer.echo(f"job {job_id} cancelled")


@app.command()
def logs(
    job_id: int = typer.Argument(..., help="Job id."),
    plugin: str = typer.Option("", help="Only this plugin's lines."),
    trajectory: str = typer.Option("", help="Only this trajectory's lines."),
    level: str = typer.Option("", help="Only this level (DEBUG, INFO, WARNING, ERROR)."),
    text: str = typer.Option("", help="Only lines containing this text."),
    limit: int = typer.Option(
        100, min=1, max=1_000_000, help="How many lines (the newest); the older ones are counted on stderr."
    ),
    every: bool = typer.Option(False, "--all", help="Every line from the oldest (instead of --limit)."),
    follow: bool = typer.Option(
        False, "--follow", "-f", help="Then print every new line, once and in order, until Ctrl-C."
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Print plugin log lines, oldest first: the newest --limit of them (or --all), then with
    --follow each new line as it is stored. Lines left out are counted, never dropped silently."""
    with _opened_store() as (_, store):
        _job_or_exit(store, job_id)
        filters: dict[str, Any] = {
            "plugin": plugin or None,
            "trajectory_id": trajectory or None,
            "level": level.upper() or None,
            "text": text or None,
        }
        if every:
            rows = list(store.logs_after(job_id, 0, **filters))
        else:
            rows = store.newest_logs(job_id, limit, **filters)
        older = store.count_logs(job_id, before_id=rows[0].id, **filters) if rows and not every else 0
        if as_json:
            _echo_json({"logs": [r.to_dict() for r in rows], "older_not_shown": older})
            return
        if older:
            typer.echo(f"({older} older lines not shown: raise --limit, or --all prints them)", err=True)
        last = _print_logs(rows, 0)
        while follow:
            try:
                time.sleep(1.0)
                for r in store.logs_after(job_id, last, **filters):
                    last = _print_logs([r], last)
            except KeyboardInterrupt:
                break


def _print_logs(rows: list[Any], last: int) -> int:
    for r in rows:
        stamp = time.strftime("%H:%M:%S", time.localtime(r.time))
        typer.echo(f"{stamp} {r.level:<7} {r.plugin} [{r.trajectory_id or '-'}] {r.message}")
        last = max(last, r.id)
    return last


@app.command()
def trajectories(
    job_id: int = typer.Argument(..., help="Job id."),
    status: str = typer.Option("", help="Only success, failed or discard."),
    step: int = typer.Option(-1, help="Only this step."),
    limit: int = typer.Option(50, min=1, max=100_000, help="How many, newest first."),
    as_json: bool = JSON_OPTION,
) -> None:
    """List a job's trajectories with status, reward, error cause and, when one gave the policy no
    gradient (discarded, failed and dropped, unscorable, equal rewards, a step not applied), why.

    With --json each one is its whole record: messages, prompt_ids, response_ids, response_mask
    (1 = sampled by the policy), response_logprobs, reward per grader, errors and metrics."""
    with _opened_store() as (_, store):
        _job_or_exit(store, job_id)
        rows = store.trajectories(job_id, status=status or None, step=None if step < 0 else step, limit=limit)
        if as_json:
            ids = [r.trajectory_id for r in rows]
            records = {t.trajectory_id: t for t in store.trajectory_records(job_id, ids)}
            whole = [
                {**records[r.trajectory_id].to_dict(), **r.to_dict()}
                for r in rows
                if r.trajectory_id in records
            ]
            _echo_json({"trajectories": whole})
            return
        for r in rows:
            reward = "-" if r.reward is None else f"{r.reward:.3f}"
            cause = f"  {r.error_cause}" if r.error_cause else ""
            why = f"  — {r.discard_reason}" if r.discard_reason else ""
            typer.echo(f"{r.trajectory_id:<20} step {r.step:>4}  {r.status:<8} reward {reward}{cause}{why}")


@app.command()
def replay(
    job_id: int = typer.Argument(..., help="Job id."),
    trajectory_id: str = typer.Argument(..., help="Trajectory id (`plugtune trajectories JOB` lists them)."),
    in_process: bool = typer.Option(
        False,
        "--in-process",
        help="Run the plugins in this process (a debugger works) instead of the function runtime's "
        "sandbox: UNSANDBOXED, with this process's user and files.",
    ),
    unsandboxed_as_root: bool = typer.Option(
        False,
        "--unsandboxed-as-root",
        help="With --in-process as root: run the job's recorded code anyway (refused without it).",
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Re-run one trajectory's rollout and graders from the exact code that ran in the job, with the
    policy's recorded answers played back (no model needed). That code is the job submitter's: it
    runs in the function runtime's sandbox (its own user, limits), as `plugtune test --faas` does;
    --in-process runs it in this process (a debugger works) with no sandbox, refused as root unless
    --unsandboxed-as-root is given too.

    The verdict: "reproduced" (the same failure: type, cause, plugin and, for a raise, the exception
    class; or the same status and reward), "failed differently" (both failed, not alike; both
    messages shown), "did not reproduce" (the job's trajectory failed, the replay did not) or
    "ended differently" (it succeeded in the job). Exits 0 when reproduced, 1 otherwise, 2 when the
    job, trajectory, code or data is missing, or an in-process replay as root is refused."""
    from plugtune.errors import DataError
    from plugtune.pretest.replay import ReplayError
    from plugtune.pretest.replay import replay as replay_trajectory
    from plugtune.pretest.report import dumps, render_replay

    if in_process:
        typer.secho(
            "plugtune replay: --in-process: the job's recorded plugin code runs in this process, "
            "UNSANDBOXED (this process's user and files)",
            fg="yellow",
            err=True,
        )
    with _opened_store() as (_, store):
        try:
            doc = replay_trajectory(
                store, job_id, trajectory_id, in_process=in_process, unsandboxed_as_root=unsandboxed_as_root
            )
        except (ReplayError, DataError) as exc:
            typer.echo(f"plugtune replay: {exc}", err=True)
            raise typer.Exit(2) from None
    if as_json:
        typer.echo(dumps(doc))
    else:
        from rich.console import Console

        render_replay(Console(highlight=False, soft_wrap=True), doc)
    raise typer.Exit(0 if doc["reproduced"] else 1)


@app.command()
def doctor(job_id: int = typer.Argument(..., help="Job id."), as_json: bool = JSON_OPTION) -> None:
    """Explain a failed job: the classified error, owner and hint, the service it failed on (a
    dependency: its name, address, cause, status and what to do), the failing plugin's traceback at
    your line, the worst trajectories and the resource metrics around the failure."""
    from plugtune.jobs.report import doctor_document

    with _opened_store() as (_, store):
        _job_or_exit(store, job_id)
        doc = doctor_document(store, job_id)
        if as_json:
            _echo_json(doc)
            return
        job = doc["job"]
        typer.echo(
            f"job {job['id']} {job['name']}: {job['status']} ({job['steps_done']}/{job['steps_total']} steps)"
        )
        if not doc["error"]:
            typer.echo("no error recorded")
            return
        _echo_error(doc["error"])
        _echo_dependency(doc["dependency"])
        if doc["traceback"]:
            typer.echo("\ntraceback (your code first):\n" + doc["traceback"])
        if doc["plugin"]:
            p = doc["plugin"]
            typer.echo(f"plugin {p['name']}: {p['status']} — code {p['code_hash'][:12]} ({p['entry']})")
        for name, points in doc["metrics_window"].items():
            if points:
                peak = max(pt["value"] for pt in points)
                typer.echo(f"  {name}: last {points[-1]['value']:.4g}, peak {peak:.4g} (last 10 min)")
        _echo_loss_nan_batch(doc)
        for t in doc["failed_trajectories"]:
            typer.echo(f"  failed trajectory {t['trajectory_id']} (step {t['step']})")
        for line in doc["recent_logs"][-10:]:
            typer.echo(f"  log {line['level']} {line['plugin']}: {line['message']}")


def _echo_dependency(dep: dict[str, Any] | None) -> None:
    """The service a job failed on (doctor_document's ``dependency``): not the plugin's code."""
    if dep is None:
        return
    name = dep["name"] or "(not declared in job.yaml)"
    status = f", HTTP {dep['status']}" if dep["status"] is not None else ""
    typer.echo(f"dependency {name} at {dep['address'] or 'an unknown address'}: {dep['cause']}{status}")
    typer.echo("  the plugin's code is not at fault; what to do:")
    for line in dep["what_to_do"]:
        typer.echo(f"  - {line}")


def _echo_loss_nan_batch(doc: dict[str, Any], most: int = 10) -> None:
    batch = doc["loss_nan_batch"]
    if not batch:
        return
    step = (doc["error"].get("evidence") or {}).get("step", "?")
    typer.echo(f"  the {len(batch)} trajectories of step {step}, the largest rewards first:")
    for b in batch[:most]:
        reward = "not stored" if not b["stored"] else f"reward {b['reward']}"
        typer.echo(f"    {b['trajectory_id']} ({reward})")
    if len(batch) > most:
        typer.echo(f"    ... and {len(batch) - most} more (doctor --json lists them all)")


@app.command()
def functions(
    end_stale: bool = typer.Option(
        False,
        "--end-stale",
        help="End what attempts that were killed left on this machine: their functions' processes "
        "(a daemon a plugin started), uid leases and cgroups. Running jobs are never touched.",
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """The functions in use: each one's job, limits, instances and memory; the quota and its use;
    what killed attempts left behind.

    Functions in use are read from the store (each attempt records its plugins and samples their
    instances and memory every few seconds); leftovers from this machine (uid leases under
    /run/plugtune/uids and instance cgroups whose runtime process is gone). The quota holds each
    job's runtime on its own; raise it with the options of `plugtune serve` (--max-functions,
    --max-instances, --total-memory-mb), or PLUGTUNE_MAX_FUNCTIONS, PLUGTUNE_MAX_INSTANCES and
    PLUGTUNE_TOTAL_MEMORY_MB for `plugtune run`. Exits 1 when --end-stale could not end everything
    (it names what is left)."""
    from dataclasses import asdict

    from plugtune.jobs.functions import end_stale as end_leftovers
    from plugtune.jobs.functions import functions_view

    with _opened_store() as (settings, store):
        if end_stale:
            found, ended = end_leftovers(store)
            if as_json:
                _echo_json({"found": [asdict(x) for x in found], "ended": asdict(ended)})
            else:
                _print_ended(found, ended)
            if ended.problems:
                raise typer.Exit(1)
            return
        view = functions_view(store, settings)
    if as_json:
        _echo_json(view.to_dict())
        return
    _print_functions(view)


def _print_functions(view: Any) -> None:
    q = view.quota
    typer.echo(
        f"quota of each job's runtime: {q['max_functions']} functions, {q['max_instances']} instances, "
        f"{q['total_memory_mb']} MiB of instances' memory_mb (plugtune serve --max-functions, "
        "--max-instances, --total-memory-mb)"
    )
    typer.echo(
        f"monitoring data of an ended plugin is kept {view.retention_days:g} days "
        "(plugtune serve --retention-days)"
    )
    for use in view.use:
        attempt = f" attempt {use.attempt}" if use.attempt is not None else ""
        typer.echo(
            f"\njob {use.job_id}{attempt}: {use.functions} of {q['max_functions']} functions, "
            f"{use.instances} of {q['max_instances']} instances, {use.memory_reserved_mb} of "
            f"{q['total_memory_mb']} MiB"
        )
        for f in (r for r in view.functions if r.job_id == use.job_id and r.attempt == use.attempt):
            typer.echo(f"  {_function_line(f)}")
            for proc in f.processes:
                typer.echo(f"    pid {proc.pid} {proc.role}: {proc.rss_mb:g} MiB resident")
    if not view.functions:
        typer.echo("\nno function is in use (no job is deploying or running plugins)")
    for note in view.notes:
        typer.echo(f"note: {note}")
    if view.leftovers:
        typer.echo("\nleft by attempts that were killed (end them: plugtune functions --end-stale):")
        for x in view.leftovers:
            typer.echo(f"  {_leftover_line(x)}")


def _function_line(f: Any) -> str:
    limits = f.limits
    if not limits:
        shown = "limits known once deployed"
    else:
        shown = (
            f"memory_mb {limits.get('memory_mb')}, cpu {limits.get('cpu')}, timeout_s "
            f"{limits.get('timeout_s')}, instances {limits.get('min_instances')}-"
            f"{limits.get('max_instances')}, max_concurrency {limits.get('max_concurrency')}, tmp_mb "
            f"{limits.get('tmp_mb')}, max_pids {limits.get('max_pids')}, network {limits.get('network')}"
        )
    now = "not sampled yet" if f.instances is None else f"{f.instances} instance(s)"
    if f.memory_used_mb is not None:
        now += f", fullest uses {f.memory_used_mb:g} of {f.memory_mb} MiB"
    return f"{f.plugin} ({f.role}) {f.status}: {now}; {shown}"


def _leftover_line(x: Any) -> str:
    job = f"job {x.job_id} ({x.job_status}) attempt {x.attempt}" if x.job_id is not None else "no job"
    procs = f"{len(x.processes)} process(es) still run: {' '.join(map(str, x.processes[:10]))}"
    return f"{x.kind} {x.what}: {job}, its runtime (pid {x.holder_pid}) is gone; " + (
        procs if x.processes else "no process runs"
    )


def _print_ended(found: list[Any], ended: Any) -> None:
    if not found:
        typer.echo("nothing to end: no killed attempt left a function behind")
        return
    for x in found:
        typer.echo(f"found {_leftover_line(x)}")
    typer.echo(
        f"ended {len(ended.processes)} process(es); gave back {len(ended.uids)} uid(s); removed "
        f"{len(ended.cgroups)} cgroup(s)"
    )
    for problem in ended.problems:
        typer.echo(f"could not end: {problem}", err=True)


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(8321, min=1, max=65535, help="Port to listen on."),
    allowed_host: list[str] = typer.Option(
        [],
        "--allowed-host",
        metavar="NAME",
        help="A name the console may be reached by besides localhost, 127.0.0.1, ::1 and --host "
        "(repeatable; also PLUGTUNE_ALLOWED_HOSTS). Requests with any other Host header are refused.",
    ),
    max_running: int = typer.Option(
        1,
        "--max-running",
        min=1,
        max=64,
        help="Jobs run at once; the others wait in the queue, oldest first.",
    ),
    secret: list[str] = typer.Option(
        [],
        "--secret",
        metavar="NAME",
        help="A variable of this server's environment that jobs submitted over the API may import as "
        "`secrets:` (repeatable; also PLUGTUNE_SUBMIT_SECRETS). Any other secret is refused (422).",
    ),
    shared_dir: list[str] = typer.Option(
        [],
        "--shared-dir",
        metavar="DIR",
        help="A folder of this server whose files jobs submitted over the API may name as data or "
        "plugins (repeatable; also PLUGTUNE_SHARED_DIRS). Otherwise they read only the files they sent.",
    ),
    max_functions: int | None = typer.Option(
        None,
        "--max-functions",
        min=1,
        max=100_000,
        help="Quota of each job's function runtime: functions deployed at once (default 32; also "
        "PLUGTUNE_MAX_FUNCTIONS). Going over it is a Create faas fault.",
    ),
    max_instances: int | None = typer.Option(
        None,
        "--max-instances",
        min=1,
        max=100_000,
        help="Quota of each job's function runtime: instances running at once, all its functions "
        "together (default 64; also PLUGTUNE_MAX_INSTANCES).",
    ),
    total_memory_mb: int | None = typer.Option(
        None,
        "--total-memory-mb",
        min=1,
        max=64 << 20,
        help="Quota of each job's function runtime: the memory_mb of its running instances together "
        "(default 16384; also PLUGTUNE_TOTAL_MEMORY_MB).",
    ),
    retention_days: float | None = typer.Option(
        None,
        "--retention-days",
        min=0.001,
        max=36_500,
        help="How long a plugin's monitoring data (metrics, log lines) is kept after it ended (default "
        "7; also PLUGTUNE_RETENTION_DAYS); the Plugin tab says when it expires.",
    ),
) -> None:
    """Start the control plane: JSON API (/docs), web console, scheduler for submitted jobs.

    Its address is kept in $PLUGTUNE_HOME/serve.json while it runs (`plugtune submit` prints it), and
    `plugtune run` on its store is refused meanwhile; while a `plugtune run` supervises a job of the
    store, the scheduler waits for it to end (the console works). Exits 1 without starting anything
    when the port cannot be listened on (choose another with --port).

    `plugtune functions` (and the console's Functions page) shows the functions in use against the
    quota that --max-functions, --max-instances and --total-memory-mb set."""
    import uvicorn

    from plugtune.jobs.control import Scheduler
    from plugtune.jobs.remote import forget_serve, record_serve
    from plugtune.jobs.supervisor_lock import ServeLock
    from plugtune.web import create_app

    _export_settings(
        PLUGTUNE_MAX_FUNCTIONS=max_functions,
        PLUGTUNE_MAX_INSTANCES=max_instances,
        PLUGTUNE_TOTAL_MEMORY_MB=total_memory_mb,
        PLUGTUNE_RETENTION_DAYS=retention_days,
    )
    policy = _submission_policy(secret, shared_dir)
    sock = _listening_socket(host, port)  # before anything is printed or started
    with sock, _opened_store(create=True) as (settings, store):
        scheduler = Scheduler(store, settings, max_running=max_running)
        bound = [host] if host not in ("0.0.0.0", "::", "") else []
        hosts = [*bound, *settings.allowed_hosts, *allowed_host]
        app_ = create_app(
            store,
            api_token=settings.api_token,
            on_retry=scheduler.wake,
            on_cancel=scheduler.cancel,
            allowed_hosts=hosts,
            home=settings.home,
            submission_policy=policy,
        )
        lock = ServeLock(settings.home)  # one supervisor of the store's jobs: this server, or runs
        runs = lock.start(scheduler.start)
        url = _console_url(host, sock.getsockname()[1])
        record_serve(settings.home, url)
        previous = signal.signal(signal.SIGTERM, _forget_serve_then_end(settings.home))
        if runs:
            typer.echo(
                f"plugtune serve: a plugtune run (pid {', '.join(map(str, runs))}) supervises a job of "
                "this store: the scheduler starts when it ends (the console works meanwhile)",
                err=True,
            )
        typer.echo(f"plugtune console: {url}  (API docs: {url}docs)")
        try:
            uvicorn.Server(uvicorn.Config(app_, host=host, port=port, log_level="warning")).run([sock])
        finally:
            forget_serve(settings.home)
            signal.signal(signal.SIGTERM, previous)
            lock.close(scheduler.stop)


def _export_settings(**given: float | None) -> None:
    """Options given to `serve` as the variables Settings reads, so the store and every attempt this
    server starts (they inherit its environment) use them."""
    import os

    for name, value in given.items():
        if value is not None:
            os.environ[name] = f"{value:g}" if isinstance(value, float) else str(value)


def _forget_serve_then_end(home: Any) -> Any:
    """SIGTERM's handler once uvicorn has shut down (it hands the signal back): remove serve.json,
    then end by the signal as before (the jobs' attempts end with this process; the next server
    resumes them: ``recover_interrupted``)."""
    from plugtune.jobs.remote import forget_serve

    def end(signum: int, frame: Any) -> None:
        forget_serve(home)
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)

    return end


def _submission_policy(secrets: list[str], shared: list[str]) -> Any:
    """The secrets and folders `serve` lets submitted jobs use; exit 1 naming a bad one."""
    from pathlib import Path

    from plugtune.settings import Settings
    from plugtune.spec.models import check_env_name
    from plugtune.spec.reach import SubmissionPolicy

    settings = Settings.from_env()

    names = frozenset([*settings.submit_secrets, *secrets])
    for name in sorted(names):
        try:
            check_env_name(name)
        except ValueError as exc:
            typer.echo(f"plugtune serve: --secret {name!r}: {exc}", err=True)
            raise typer.Exit(1) from None
    dirs = tuple(d.resolve() for d in [*settings.shared_dirs, *map(Path, shared)])
    for folder in dirs:
        home = settings.home
        if not folder.is_dir() or folder.is_relative_to(home) or home.is_relative_to(folder):
            typer.echo(
                f"plugtune serve: --shared-dir {folder} must be an existing folder apart from "
                f"PLUGTUNE_HOME ({settings.home})",
                err=True,
            )
            raise typer.Exit(1)
    return SubmissionPolicy(shared_dirs=dirs, secrets=names)


def _console_url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host
    return f"http://[{shown}]:{port}/" if ":" in shown else f"http://{shown}:{port}/"


def _listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port``, or a one-line error saying what to do (exit 1)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        typer.echo(f"plugtune serve: --host {host!r} is not an address here ({exc.strerror})", err=True)
        raise typer.Exit(1) from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: restarts at once
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            why = "is already in use (another `plugtune serve`?); stop that process or choose a free port"
        elif exc.errno == errno.EACCES:
            why = "needs privileges to listen on; choose a port above 1023"
        else:
            why = f"cannot be listened on ({exc.strerror}); check --host or choose another port"
        typer.echo(f"plugtune serve: port {port} on {host} {why} with --port", err=True)
        raise typer.Exit(1) from None
    return sock


@app.command()
def demo() -> None:
    """Train the example project end to end (tiny model, arithmetic data, rollout + grader plugins)."""
    from plugtune.jobs.demo import run_demo

    with _opened_store(create=True) as (settings, store), _supervising_alone(settings, "demo"):
        raise typer.Exit(run_demo(store, settings, typer.echo))


@contextmanager
def _supervising_alone(settings: Settings, command: str) -> Iterator[None]:
    """While a command supervises a job here, no `plugtune serve` runs the store's queue (exit 2)."""
    from plugtune.jobs.supervisor_lock import StoreServedError, running_alone

    try:
        with running_alone(settings.home):
            yield
    except StoreServedError as exc:  # raised before the job is even created
        typer.echo(f"plugtune {command}: {exc}", err=True)
        raise typer.Exit(2) from None


if __name__ == "__main__":
    sys.exit(app())
