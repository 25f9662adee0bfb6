"""``plugtune test --faas``: the job's plugins in the function runtime, with their real limits,
driven at the trainer's concurrency; optionally with injected faults."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from plugtune.pretest.calls import CallRecord
from plugtune.pretest.deployment import deploy_job
from plugtune.pretest.policy import PolicyChoice, serving
from plugtune.pretest.trial import TrialResult, group_size_of, run_trial, samples_of
from plugtune.runtime import FaultInjection, Quota, runtime_for
from plugtune.runtime.budget import Budgets
from plugtune.runtime.faults import DEPENDENCY_FAULTS, FAULTS
from plugtune.settings import Settings
from plugtune.spec.validation import ValidatedJob

METRICS_PERIOD_S = 0.5


@dataclass(frozen=True)
class Injection:
    """``--inject``: these faults on ``rate`` of all calls (split evenly), from a seeded draw; the
    dependency faults on their share of the connections to declared dependencies."""

    faults: tuple[str, ...]
    rate: float
    seed: int = 0

    @classmethod
    def parse(cls, text: str, rate: float, seed: int = 0) -> Injection:
        """``"timeout,eof"`` -> Injection; ValueError naming the unknown fault or bad rate."""
        faults = tuple(dict.fromkeys(f.strip().lower() for f in text.split(",") if f.strip()))
        unknown = [f for f in faults if f not in FAULTS + DEPENDENCY_FAULTS]
        if unknown or not faults:
            known = ", ".join(FAULTS + DEPENDENCY_FAULTS)
            raise ValueError(f"--inject {text!r}: use a comma-separated list of {known}")
        if not 0.0 < rate <= 1.0:
            raise ValueError(f"--inject-rate {rate}: must be in (0, 1]")
        return cls(faults, rate, seed)

    @property
    def dependency_faults(self) -> bool:
        return any(f in DEPENDENCY_FAULTS for f in self.faults)

    def for_plugin(self, i: int) -> FaultInjection:
        share = self.rate / len(self.faults)
        return FaultInjection({f: share for f in self.faults}, seed=self.seed + i)

    def to_dict(self) -> dict[str, Any]:
        return {"faults": list(self.faults), "rate": self.rate, "seed": self.seed}


def default_concurrency(job: ValidatedJob) -> int:
    """What the trainer will ask for at once: batch_size × group_size rollouts."""
    config = job.spec.hyperparameters
    return config.batch_size * config.group_size


async def run_faas(
    job: ValidatedJob,
    rows: list[dict[str, Any]],
    samples: int,
    concurrency: int,
    policy: PolicyChoice,
    injection: Injection | None = None,
    on_call: Callable[[CallRecord], None] | None = None,
    settings: Settings | None = None,
    backend: str = "",
) -> tuple[TrialResult, str]:
    """Deploy to the function runtime (``backend``: local or ray; "": job.yaml's
    ``plugins.runtime_backend``) and drive ``samples`` rows' rollouts (each graded) at ``concurrency``
    rollouts at once: one per row, or ``group_size`` per row when the job has group graders.

    Returns the result and the runtime's limits mechanism (cgroup / rlimit). A plugin that
    cannot be deployed raises ``PluginCallError`` (Create faas fault)."""
    settings = settings or Settings.from_env()
    quota = Quota(
        max_functions=settings.max_functions,
        max_instances=settings.max_instances,
        total_memory_mb=settings.total_memory_mb,
    )
    inject_for = injection.for_plugin if injection is not None else None
    chosen_backend = backend or job.spec.plugins.runtime_backend
    runtime = runtime_for(chosen_backend, settings.ray_address, quota, metrics_period_s=METRICS_PERIOD_S)
    async with runtime as rt:
        functions = await deploy_job(rt, job, inject_for)
        with serving(policy) as server:
            chosen = samples_of(job, rows, samples)
            result = await run_trial(
                functions,
                server,
                chosen,
                concurrency=concurrency,
                group_size=group_size_of(job),
                on_call=on_call,
                job=job,
                rows=rows,
            )
        budgets = getattr(rt.backend, "budgets", None)  # the Ray backend enforces none
        if isinstance(budgets, Budgets):
            result = dataclasses.replace(result, dependencies=budgets.usage())
        return result, rt.limits_mechanism
