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


if __name__ == "__main__":
    app()
