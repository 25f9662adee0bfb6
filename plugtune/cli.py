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


if __name__ == "__main__":
    app()
