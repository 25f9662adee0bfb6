"""What every command shares: the ``plugtune`` app and its ``jobs`` group, the store opened
for a command, and how errors and JSON documents are printed."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from plugtune.settings import Settings
    from plugtune.store import Store
    from plugtune.web.models import ErrorOut, JobReportOut


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
def opened_store(create: bool = False) -> Iterator[tuple[Settings, Store]]:
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


def echo_json(document: Any) -> None:
    typer.echo(json.dumps(document, indent=2, default=str))


def error_title(error: dict[str, Any] | ErrorOut) -> str:
    """``type: cause``; an error without a cause (a validation failure) shows its message's first
    problem instead of an empty cause."""
    error = _error_fields(error)
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


def echo_error(error: dict[str, Any] | ErrorOut) -> None:
    error = _error_fields(error)
    cause = f": {error['cause']}" if error.get("cause") else ""
    typer.secho(f"{error.get('type')} ({error.get('owner')}){cause}", fg="red", err=True)
    typer.echo(f"  {error.get('message')}", err=True)
    typer.echo(f"  what to do: {error.get('hint')}", err=True)


def _error_fields(error: dict[str, Any] | ErrorOut) -> dict[str, Any]:
    return error if isinstance(error, dict) else error.model_dump()


def job_or_exit(store: Store, job_id: int) -> JobReportOut:
    """The job as ``jobs show --json`` prints it (the API's typed model); exit 2 when there is none."""
    from plugtune.web.service import Missing, job_report

    try:
        return job_report(store, job_id)
    except Missing:
        typer.echo(
            f"plugtune: there is no job {job_id} in {store.url}; `plugtune jobs list` shows them", err=True
        )
        raise typer.Exit(2) from None


@contextmanager
def supervising_alone(settings: Settings, command: str) -> Iterator[None]:
    """While a command supervises a job here, no `plugtune serve` runs the store's queue (exit 2)."""
    from plugtune.jobs.supervisor_lock import StoreServedError, running_alone

    try:
        with running_alone(settings.home):
            yield
    except StoreServedError as exc:  # raised before the job is even created
        typer.echo(f"plugtune {command}: {exc}", err=True)
        raise typer.Exit(2) from None
