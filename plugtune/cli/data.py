"""``plugtune data``: what a job found wrong in its dataset (poison rows), and the dataset without it."""

from __future__ import annotations

from pathlib import Path

import typer

from plugtune.cli.base import JSON_OPTION, app, echo_json, job_or_exit, opened_store

data_app = typer.Typer(help="A job's dataset findings: the rows it quarantined.", no_args_is_help=True)
app.add_typer(data_app, name="data")


def quarantine(
    job_id: int = typer.Argument(..., help="Job id."),
    export: Path | None = typer.Option(
        None, "--export", help="Write the job's training dataset without the quarantined lines here."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite --export's file if it exists."),
    as_json: bool = JSON_OPTION,
) -> None:
    """List the dataset rows the job quarantined (poison rows: every trajectory of the row failed with
    the same non-transient cause on hyperparameters.poison_after steps), by file and line, with the
    cause and an example trajectory; with --export, write the dataset without them (never over the
    dataset itself)."""
    from plugtune.jobs.quarantine import export_clean, quarantined_rows

    with opened_store() as (_, store):
        job_or_exit(store, job_id)
        rows = quarantined_rows(store, job_id)
        written = None
        if export is not None:
            try:
                written = export_clean(store, job_id, export, force=force)
            except (ValueError, OSError) as exc:
                typer.echo(f"error: {exc}", err=True)
                raise typer.Exit(1) from None
        if as_json:
            doc: dict[str, object] = {"job": job_id, "quarantined": [r.to_dict() for r in rows]}
            if written is not None:
                doc["export"] = {
                    "source": str(written.source),
                    "path": str(written.target),
                    "rows": written.lines_kept,
                    "lines_dropped": written.lines_dropped,
                }
            echo_json(doc)
            return
        if not rows:
            typer.echo(f"job {job_id} quarantined no dataset row")
        for r in rows:
            steps = ", ".join(map(str, r.steps))
            typer.echo(
                f"{r.file}:{r.line} (row {r.row}): {r.cause} in {r.plugin or 'a plugin'} on steps {steps} "
                f"— e.g. trajectory {r.trajectory_id}"
            )
        if written is not None:
            typer.echo(
                f"wrote {written.target}: {written.lines_kept} rows, without line(s) "
                f"{', '.join(map(str, written.lines_dropped))} of {written.source}"
            )
