"""``plugtune test``: the job's plugins in this process on a few dataset rows, fast enough for every edit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from plugtune.jobs.validation import ValidatedJob
from plugtune.pretest.deployment import deploy_job
from plugtune.pretest.policy import PolicyChoice, serving
from plugtune.pretest.trial import TrialResult, run_trial, samples_of
from plugtune.runtime import FaultInjection, InProcessRuntime


async def run_local(
    job: ValidatedJob,
    rows: list[dict[str, Any]],
    samples: int,
    policy: PolicyChoice,
    inject_for: Callable[[int], FaultInjection | None] | None = None,
) -> TrialResult:
    """Run the rollout and graders in-process (a debugger works) on the first ``samples`` rows.

    A plugin that cannot be loaded raises ``PluginCallError`` (Create faas fault)."""
    async with InProcessRuntime() as rt:
        functions = await deploy_job(rt, job, inject_for)
        with serving(policy) as server:
            return await run_trial(functions, server, samples_of(job, rows, samples), concurrency=samples)
