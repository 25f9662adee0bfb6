"""Commands that explain a job: ``logs``, ``trajectories``, ``replay`` and ``doctor``."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import typer

from plugtune.cli.base import JSON_OPTION, echo_error, echo_json, job_or_exit, opened_store

if TYPE_CHECKING:
    from plugtune.store.records import LogRow
    from plugtune.web.models import ListedLogOut


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
    with opened_store() as (_, store):
        job_or_exit(store, job_id)
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
            listed = [_listed(r) for r in rows]
            echo_json({"logs": [line.model_dump(mode="json") for line in listed], "older_not_shown": older})
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


def _listed(row: LogRow) -> ListedLogOut:
    """A log line as ``logs --json`` prints it: the API's LogOut with its job and instance ids."""
    from plugtune.web.models import ListedLogOut
    from plugtune.web.views import log_out

    return ListedLogOut(**dict(log_out(row)), job_id=row.job_id, instance_id=row.instance_id)


def _print_logs(rows: list[Any], last: int) -> int:
    for r in rows:
        stamp = time.strftime("%H:%M:%S", time.localtime(r.time))
        typer.echo(f"{stamp} {r.level:<7} {r.plugin} [{r.trajectory_id or '-'}] {r.message}")
        last = max(last, r.id)
    return last


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
    from plugtune.web.views import summary_out

    with opened_store() as (_, store):
        job_or_exit(store, job_id)
        rows = store.trajectories(job_id, status=status or None, step=None if step < 0 else step, limit=limit)
        if as_json:
            ids = [r.trajectory_id for r in rows]
            records = {t.trajectory_id: t for t in store.trajectory_records(job_id, ids)}
            whole = [
                {**records[r.trajectory_id].to_dict(), **r.to_dict()}
                for r in rows
                if r.trajectory_id in records
            ]
            echo_json({"trajectories": whole})
            return
        for t in (summary_out(r) for r in rows):
            reward = "-" if t.reward is None else f"{t.reward:.3f}"
            cause = f"  {t.error_cause}" if t.error_cause else ""
            why = f"  — {t.discard_reason}" if t.discard_reason else ""
            typer.echo(f"{t.id:<20} step {t.step:>4}  {t.status:<8} reward {reward}{cause}{why}")


def replay(
    job_id: int = typer.Argument(..., help="Job id."),
    trajectory_id: str = typer.Argument(
        ..., help="Trajectory id (`plugtune trajectories JOB` lists them); with --group, a group id too."
    ),
    group: bool = typer.Option(
        False,
        "--group",
        help="Replay the whole prompt group of a step that the trajectory belongs to (or the group id "
        "names): every rollout at once with its own recorded answers, its graders, then the group "
        "graders; one verdict per trajectory.",
    ),
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
    "ended differently" (it succeeded in the job). With --group, every trajectory of the group gets
    its verdict (the group graders see the whole group, as in the step). Exits 0 when reproduced
    (every trajectory, with --group), 1 otherwise, 2 when the job, trajectory, group, code or data is
    missing, or an in-process replay as root is refused."""
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
    from plugtune.pretest.group_replay import render_group_replay, replay_group

    run = replay_group if group else replay_trajectory
    with opened_store() as (_, store):
        try:
            doc = run(
                store, job_id, trajectory_id, in_process=in_process, unsandboxed_as_root=unsandboxed_as_root
            )
        except (ReplayError, DataError) as exc:
            typer.echo(f"plugtune replay: {exc}", err=True)
            raise typer.Exit(2) from None
    if as_json:
        typer.echo(dumps(doc))
    else:
        from rich.console import Console

        render = render_group_replay if group else render_replay
        render(Console(highlight=False, soft_wrap=True), doc)
    raise typer.Exit(0 if doc["reproduced"] else 1)


def doctor(job_id: int = typer.Argument(..., help="Job id."), as_json: bool = JSON_OPTION) -> None:
    """Explain a failed job: the classified error, owner and hint, the service it failed on (a
    dependency: its name, address, cause, status and what to do), the failing plugin's traceback at
    your line, the worst trajectories and the resource metrics around the failure."""
    from plugtune.jobs.report import doctor_document

    with opened_store() as (_, store):
        job_or_exit(store, job_id)
        doc = doctor_document(store, job_id)
        if as_json:
            echo_json(doc)
            return
        job = doc["job"]
        typer.echo(
            f"job {job['id']} {job['name']}: {job['status']} ({job['steps_done']}/{job['steps_total']} steps)"
        )
        _echo_quarantined(doc["quarantined_rows"], job["id"])
        if not doc["error"]:
            typer.echo("no error recorded")
            return
        echo_error(doc["error"])
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


def _echo_quarantined(rows: list[dict[str, Any]], job_id: int) -> None:
    """The dataset rows the job quarantined (poison rows): Invalid data, by file and line."""
    if not rows:
        return
    typer.echo(f"Invalid data (data): {len(rows)} dataset row(s) quarantined, no longer sampled:")
    for r in rows:
        steps = ", ".join(map(str, r["steps"]))
        typer.echo(
            f"  {r['file']}:{r['line']}: {r['cause']} in {r['plugin'] or 'a plugin'} on every trajectory, "
            f"steps {steps} (e.g. trajectory {r['trajectory_id']})"
        )
    typer.echo(f"  the dataset without them: plugtune data quarantine {job_id} --export clean.jsonl")


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
