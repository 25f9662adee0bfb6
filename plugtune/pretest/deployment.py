"""Deploying a job's plugins for a test, with job.yaml's runtime settings over the decorator's."""

from __future__ import annotations

from collections.abc import Callable

from plugtune.errors import InvalidValueError, Problem
from plugtune.jobs.plugins import JobFunction, entry_of, plugin_env
from plugtune.runtime import FaultInjection
from plugtune.runtime.runtime import BaseRuntime
from plugtune.sdk import Kind
from plugtune.spec.validation import PluginRef, ValidatedJob


def refs_of(job: ValidatedJob) -> list[PluginRef]:
    """The rollout, then graders, then group graders (the order ``as_plugins`` expects), then a
    multi-task job's tasks' plugins (each plugin once)."""
    return list(job.plugin_refs())


async def deploy_job(
    rt: BaseRuntime, job: ValidatedJob, inject_for: Callable[[int], FaultInjection | None] | None = None
) -> list[JobFunction]:
    """Deploy every plugin of ``job`` as a job would, with job.yaml's ``env`` and ``secrets`` (from this
    process's environment; ``InvalidValueError`` names a missing one); ``inject_for(i)`` is the i-th
    one's fault injection."""
    env = plugin_env(job)
    deployed = []
    for i, ref in enumerate(refs_of(job)):
        overrides = ref.runtime.given() if ref.runtime is not None else None
        inject = inject_for(i) if inject_for else None
        try:
            fn = await rt.deploy(
                entry_of(ref),
                runtime=overrides,
                env=env,
                inject=inject,
                dependencies=job.spec.declared(),
                shape=ref.shape or "",
                group=ref.kind is Kind.GROUP_GRADER,
            )
        except ValueError as exc:
            if inject is None or not inject.dependency_faults:
                raise
            problem = f"--inject: {exc} (use the local backend and network: policy-only, the default)"
            raise InvalidValueError([Problem(str(job.job_file), problem, field="--inject")]) from None
        deployed.append(JobFunction(fn, ref.weight, ref.name))
    return deployed
