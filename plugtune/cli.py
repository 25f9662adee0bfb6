"""The ``plugtune`` command line. Each command's docstring is its ``--help``."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="plugtune",
    help="RL fine-tuning whose rollouts and graders are your own plugins, failing precisely.",
    no_args_is_help=True,
    add_completion=False,
)


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
    missing decorators and signatures the runtime rejects. Exits 1 when anything is found."""
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


if __name__ == "__main__":
    app()
