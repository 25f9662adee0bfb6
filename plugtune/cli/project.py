"""Commands on a project before it runs: ``version``, ``lint``, ``init`` and ``test``."""

from __future__ import annotations

import json

import typer

from plugtune.cli.base import JSON_OPTION


def version() -> None:
    """Print plugtune's version."""
    from plugtune import __version__

    typer.echo(__version__)


def lint(
    paths: list[str] = typer.Argument(None, help="Files or folders to check (default: the current folder)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """Check plugins statically: blocking calls in async code, NaN-prone graders, swallowed errors,
    missing decorators, signatures the runtime rejects and reward functions written for TRL or
    verl. Exits 1 when anything is found; when nothing is, says which files, plugins and rules it
    checked. Also notes (on stderr and in --json's summary, never as a finding or in the exit
    status) each grader of a job.yaml that no fixture in the fixtures.jsonl beside it covers."""

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
    inject: str = typer.Option(
        "",
        help="Inject faults: a list of timeout,eof,oom,500,nan (in the plugins' calls) and, with --faas, "
        "dependency-429,dependency-5xx,dependency-unreachable,dependency-hang (met by connections to "
        "job.yaml's dependencies under network: policy-only, as from the service).",
    ),
    inject_rate: float = typer.Option(
        0.2, help="Share of calls (of connections, for dependency faults) that get an injected fault (0..1]."
    ),
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
        "failure, retry, discard or error; tolerance, grader, name; a group grader's: completions and "
        "expect a list of rewards): check each grader call against its expected result instead of "
        "running rollouts.",
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
    if injection is not None and injection.dependency_faults and not faas:
        typer.echo(
            "plugtune test: --inject dependency-...: dependency faults are met in the function "
            "runtime's relay; add --faas",
            err=True,
        )
        raise typer.Exit(2)
    if backend not in ("", "local", "ray"):
        typer.echo(f"plugtune test: --backend {backend!r}: use 'local' or 'ray'", err=True)
        raise typer.Exit(2)
    options = TestOptions(
        job_file, samples, policy_url, policy_api_key, policy_model, concurrency, injection, backend
    )
    raise typer.Exit(test_command(options, faas=faas, as_json=as_json))
