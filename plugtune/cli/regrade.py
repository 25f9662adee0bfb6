"""``plugtune regrade`` (a job's graders again on its stored trajectories) and ``plugtune fixture add``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from plugtune.cli.base import JSON_OPTION, app, echo_json, job_or_exit, opened_store

fixture_app = typer.Typer(help="Turn a job's trajectories into grader fixtures.", no_args_is_help=True)
app.add_typer(fixture_app, name="fixture")


def regrade(
    job_id: int = typer.Argument(..., help="Job id."),
    grader: str = typer.Option(
        "", "--grader", help="FILE:FN: grade with this grader in place of the job's one of its name."
    ),
    steps: str = typer.Option("", "--steps", help="Only these steps: A..B (both included) or A."),
    failed_only: bool = typer.Option(
        False,
        "--failed-only",
        help="Re-run only the grader calls that failed, and store the new grades as a labelled "
        "re-grade beside the originals (which stay as trained).",
    ),
    save: bool = typer.Option(
        False,
        "--save",
        help="Store this re-grade too, labelled (--failed-only always does): the console shows it.",
    ),
    label: str = typer.Option(
        "", "--label", help="The stored re-grade's label (default: failed-only <time> or regrade <time>)."
    ),
    concurrency: int = typer.Option(8, min=1, max=256, help="Grader calls at once."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Run graders again on a job's stored trajectories, without generating: the job's graders
    from the code that ran in it (or --grader in place of one), in the function runtime's sandbox
    with their limits, on each trajectory's recorded messages and dataset row; group graders on each
    group. Reports what flipped (1→0, 0→1, scored→unscorable, scored→failed, failed→scored,
    unscorable→scored, changed) with each trajectory's console link. The job's trajectories are
    never rewritten. Exits 0 after a report, 2 when the job, --steps or --grader is not usable."""
    from plugtune.errors import DataError
    from plugtune.pretest.regrade import RegradeError, parse_steps
    from plugtune.pretest.regrade import regrade as regrade_job
    from plugtune.pretest.replay import ReplayError

    with opened_store() as (_, store):
        try:
            job_or_exit(store, job_id)
            doc = regrade_job(
                store,
                job_id,
                grader=grader or None,
                steps=parse_steps(steps) if steps else None,
                failed_only=failed_only,
                save=save,
                label=label,
                concurrency=concurrency,
            )
        except (RegradeError, ReplayError, DataError) as exc:
            typer.echo(f"plugtune regrade: {exc}", err=True)
            raise typer.Exit(2) from None
    if as_json:
        echo_json(doc)
        return
    _print_report(doc)


def _print_report(doc: dict[str, Any]) -> None:
    what = "failed grader calls of " if doc["failed_only"] else ""
    with_grader = f" with {doc['grader']}" if doc["grader"] else ""
    typer.echo(
        f"job {doc['job_id']}: re-graded the {what}{doc['regraded']} of {doc['trajectories']} trajectories"
        f"{with_grader} ({doc['skipped']} not re-graded) in {doc['wall_s']:.1f}s; sandbox: {doc['sandbox']}"
    )
    for kind, n in doc["counts"].items():
        if n or kind == "unchanged":
            typer.echo(f"  {kind:<18} {n}")
    for flip in doc["flips"]:
        before, after = flip["before"], flip["after"]
        error = f"  ({after['error']})" if after["error"] else ""
        typer.echo(
            f"{flip['kind']:<18} {flip['trajectory_id']:<20} step {flip['step']:>4}  "
            f"{_grade(before)} → {_grade(after)}{error}  {flip['link']}"
        )
    if doc["stored_label"]:
        typer.echo(
            f"stored as re-grade {doc['stored_label']!r} (the console: /jobs/{doc['job_id']}/regrades); "
            "the job's own rewards are unchanged"
        )


def _grade(g: dict[str, Any]) -> str:
    if g["status"] != "success":
        return g["status"]
    return "unscorable" if g["reward"] is None else f"{g['reward']:.3f}"


def fixture_add(
    job_id: int = typer.Argument(..., help="Job id."),
    trajectory_id: str = typer.Argument(..., help="Trajectory id (`plugtune trajectories JOB` lists them)."),
    file: Path = typer.Option(Path("fixtures.jsonl"), "--file", help="The fixtures file to append to."),
    grader: str = typer.Option("", "--grader", help="Only this grader's fixture (job.yaml name)."),
    expect: str = typer.Option(
        "",
        "--expect",
        help="The right result instead of the recorded one: a number, null, failure, "
        "retry, discard or error.",
    ),
    regrade_label: str = typer.Option("", "--regrade", help="Expect what this stored re-grade gave."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Append one fixture per grader to --file (`plugtune test --expect FILE` reads it): the
    trajectory's dataset row and messages, and what each grader gave it (or --expect). Exits 2 when
    the job, trajectory or --expect is not usable."""
    from plugtune.pretest.fixtures import VERDICTS
    from plugtune.pretest.regrade import RegradeError, fixture_rows

    wanted: float | str | None = None
    if expect:
        if expect == "null" or expect in VERDICTS:
            wanted = None if expect == "null" else expect
        else:
            try:
                wanted = float(expect)
            except ValueError:
                typer.echo(
                    f"plugtune fixture add: --expect {expect!r}: a number, null or one of "
                    f"{', '.join(VERDICTS)}",
                    err=True,
                )
                raise typer.Exit(2) from None
    with opened_store() as (_, store):
        try:
            job_or_exit(store, job_id)
            rows = fixture_rows(
                store,
                job_id,
                trajectory_id,
                grader=grader or None,
                expect=wanted,
                has_expect=bool(expect),
                label=regrade_label or None,
            )
        except RegradeError as exc:
            typer.echo(f"plugtune fixture add: {exc}", err=True)
            raise typer.Exit(2) from None
    with file.open("a", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    if as_json:
        echo_json({"file": str(file), "fixtures": rows})
        return
    for row in rows:
        typer.echo(f"{file}: + {row['name']} (row {row['row']}, expect {row['expect']!r})")
