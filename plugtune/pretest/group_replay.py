"""``plugtune replay JOB ID --group``: re-run every trajectory of one prompt group of a step together.

The group's rollouts run at once, as the step ran them, each with its own recorded policy turns
played back and its own ids in ``ctx``; each trajectory's graders, then the group graders over the
whole group (which a one-trajectory replay cannot show). The code is the one the group ran (its
records' code hashes, from the store) in the function runtime's sandbox, or in this process with
``in_process``; or, with ``code``, a validated job's plugins as they are on disk (what
``jobs retry --code`` tests new code with before it stores it). The report has one verdict per
trajectory (:func:`plugtune.pretest.replay.verdict`) and a summary.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from plugtune.jobs.plugins import JobFunction
from plugtune.pretest.deployment import deploy_job
from plugtune.pretest.local import ExitsAsEof, exits_raise
from plugtune.pretest.relay import PolicyRelay, RelayError
from plugtune.pretest.replay import (
    IN_PROCESS,
    Playback,
    ReplayError,
    as_recorded,
    check_in_process,
    deploy_recorded,
    grader_weights,
    outcome_of,
    recorded_env,
    recorded_plugins,
    sample_of,
    verdict,
    with_recorded_entries,
)
from plugtune.pretest.trial import TrialResult, run_trial
from plugtune.runtime import InProcessRuntime, LocalRuntime
from plugtune.runtime.runtime import BaseRuntime
from plugtune.sdk import Context, Sample
from plugtune.spec.validation import ValidatedJob
from plugtune.store import Plugin, Store
from plugtune.types import CallOutcome, TrajectoryRecord

ROLLOUT_SUFFIX = re.compile(r"-r(\d+)$")  # a trial's trajectory id ends with its rollout index


class GroupPlayback:
    """Answers each rollout of the group with its own recording's assistant turns."""

    def __init__(self, records: list[TrajectoryRecord], model: str) -> None:
        self.playbacks = [Playback(r.messages, model) for r in records]

    def __call__(self, trajectory_id: str, body: dict[str, Any]) -> dict[str, Any]:
        found = ROLLOUT_SUFFIX.search(trajectory_id)
        index = int(found.group(1)) if found else -1
        if not 0 <= index < len(self.playbacks):
            raise RelayError(409, f"no recorded trajectory for rollout {trajectory_id!r} of the group")
        return self.playbacks[index](trajectory_id, body)


class AsRecordedGroup(JobFunction):
    """A deployed function whose calls for the trial's rollout ``i`` carry the ids of the group's
    ``i``-th recorded trajectory (a group grader's call belongs to none and is left as it is)."""

    def __init__(self, jf: JobFunction, records: list[TrajectoryRecord]) -> None:
        super().__init__(jf.fn, jf.spec.weight, jf.spec.name)
        self.inner = jf
        self.records = records

    async def invoke(self, ctx: Context, *args: Any) -> CallOutcome:
        if 0 <= ctx.rollout_index < len(self.records):
            record = self.records[ctx.rollout_index]
            ctx = dataclasses.replace(
                ctx, rollout_index=record.rollout_index, trajectory_id=record.trajectory_id
            )
        return await self.inner.invoke(ctx, *args)


def group_records(store: Store, job_id: int, ident: str) -> list[TrajectoryRecord]:
    """The trajectories of the group ``ident`` names (a group id, or the id of one of its
    trajectories), one per rollout index; ReplayError naming what is missing."""
    records = store.group(job_id, ident)
    if not records:
        one = store.get_trajectory(job_id, ident)
        if one is None:
            raise ReplayError(
                f"job {job_id} has no group or trajectory {ident!r}; `plugtune trajectories {job_id}` lists "
                "them (a group id is a trajectory id without its -r<rollout> suffix)"
            )
        records = store.group(job_id, one.group_id)
    by_rollout = {r.rollout_index: r for r in records}  # the newest record of a rollout run twice
    return [by_rollout[i] for i in sorted(by_rollout)]


def replay_group(
    store: Store,
    job_id: int,
    ident: str,
    *,
    in_process: bool = False,
    unsandboxed_as_root: bool = False,
    code: ValidatedJob | None = None,
) -> dict[str, Any]:
    """Replay every trajectory of a group; the report document (``reproduced``: every one did)."""
    if in_process:
        check_in_process(job_id, unsandboxed_as_root=unsandboxed_as_root)
    job = store.get_job(job_id)
    if job is None:
        raise ReplayError(f"there is no job {job_id} in {store.url}; `plugtune jobs list` shows them")
    records = group_records(store, job_id, ident)
    sample = sample_of(job.spec, records[0])
    playback = GroupPlayback(records, "policy")
    run = _Run(store, job_id, job.spec, records, sample, playback, in_process, code)
    result, entries, sandbox = asyncio.run(run.trial())
    replayed = sorted(result.trajectories, key=lambda t: t.rollout_index)
    rows = [
        _row(recorded, as_recorded(again, recorded), playback.playbacks[i])
        for i, (recorded, again) in enumerate(zip(records, replayed, strict=False))
    ]
    verdicts: dict[str, int] = {}
    for row in rows:
        verdicts[row["verdict"]] = verdicts.get(row["verdict"], 0) + 1
    ids = {t.trajectory_id: r.trajectory_id for t, r in zip(replayed, records, strict=False)}
    doc = {
        "job_id": job_id,
        "group_id": records[0].group_id,
        "step": records[0].step,
        "code": "given" if code is not None else "recorded",
        "sandbox": sandbox,
        "trajectories": rows,
        "reproduced": all(r["reproduced"] for r in rows) and len(rows) == len(records),
        "summary": {
            "trajectories": len(records),
            "replayed": len(rows),
            "verdicts": verdicts,
            "failed": [r["trajectory_id"] for r in rows if r["replayed"]["status"] == "failed"],
        },
        "calls": [
            {**c.to_dict(), "trajectory_id": ids.get(c.trajectory_id, c.trajectory_id)} for c in result.calls
        ],
    }
    return with_recorded_entries(doc, entries)


def _row(recorded: TrajectoryRecord, replayed: TrajectoryRecord, playback: Playback) -> dict[str, Any]:
    found = verdict(recorded, replayed)
    return {
        "trajectory_id": recorded.trajectory_id,
        "rollout_index": recorded.rollout_index,
        "recorded": outcome_of(recorded),
        "replayed": outcome_of(replayed),
        "verdict": found,
        "reproduced": found == "reproduced",
        "policy_turns": {"recorded": len(playback.turns), "played": playback.served},
        "divergences": playback.divergences,
    }


@dataclasses.dataclass
class _Run:
    store: Store
    job_id: int
    spec: dict[str, Any]
    records: list[TrajectoryRecord]
    sample: Sample
    playback: GroupPlayback
    in_process: bool
    code: ValidatedJob | None

    async def trial(self) -> tuple[TrialResult, dict[str, str], str]:
        """Deploy (the recorded code, or ``code``), run the group once; the result, replay entry ->
        the job's entry, and what held the plugins."""
        entries: dict[str, str] = {}
        with tempfile.TemporaryDirectory(prefix="plugtune-replay-") as tmp:
            if self.in_process:
                async with InProcessRuntime() as rt:
                    deployed = await self._deploy(rt, Path(tmp), entries)
                    with exits_raise():
                        return await self._run(deployed), entries, IN_PROCESS
            async with LocalRuntime(spare_instances=False) as sandboxed:
                deployed = await self._deploy(sandboxed, Path(tmp), entries)
                return await self._run(deployed), entries, str(sandboxed.isolation)

    async def _deploy(self, rt: BaseRuntime, root: Path, entries: dict[str, str]) -> list[JobFunction]:
        if self.code is not None:
            deployed = await deploy_job(rt, self.code)
            return [ExitsAsEof(jf) for jf in deployed] if self.in_process else deployed
        plugins: list[Plugin] = recorded_plugins(self.store, self.job_id, self.records[0])
        env = recorded_env(self.job_id, self.spec)
        return await deploy_recorded(rt, self.store, plugins, root, grader_weights(self.spec), entries, env)

    async def _run(self, deployed: list[JobFunction]) -> TrialResult:
        functions = [AsRecordedGroup(jf, self.records) for jf in deployed]
        size = len(self.records)
        with PolicyRelay(self.playback) as relay:
            return await run_trial(
                functions, relay, [(self.records[0].step, self.sample)], concurrency=size, group_size=size
            )


def render_group_replay(console: Console, doc: dict[str, Any]) -> None:
    """One line per trajectory: recorded -> replayed outcome and the verdict; then the summary."""
    head = f"plugtune replay: job {doc['job_id']} group {doc['group_id']} (step {doc['step']}), "
    head += f"{doc['summary']['trajectories']} trajectories"
    console.print(Text(head, style="bold"))
    sandbox = str(doc.get("sandbox") or "")
    if sandbox:
        console.print(Text(f"sandbox: {sandbox}", style="yellow" if sandbox.startswith("none") else "dim"))
    for row in doc["trajectories"]:
        line = Text(f"  {row['trajectory_id']}: {_outcome(row['recorded'])} -> {_outcome(row['replayed'])}  ")
        line.append(row["verdict"], style="green" if row["reproduced"] else "yellow")
        console.print(line)
        for divergence in row["divergences"]:
            console.print(Text(f"    divergence: {divergence}", style="yellow"))
    counts = ", ".join(f"{n} {verdict}" for verdict, n in doc["summary"]["verdicts"].items())
    style = "bold green" if doc["reproduced"] else "bold yellow"
    console.print(Text(f"{counts} of {doc['summary']['trajectories']}", style=style))


def _outcome(outcome: dict[str, Any]) -> str:
    error = outcome["error"]
    if error is not None:
        raised = f" {error['raised']}" if error.get("raised") else ""
        return f"{outcome['status']} ({error['type']}: {error['cause']}{raised} [{error['plugin']}])"
    return f"{outcome['status']}, reward {outcome['reward']}"
