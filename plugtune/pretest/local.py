"""``plugtune test``: the job's plugins in this process on a few dataset rows, fast enough for every edit.

No isolation and no memory limit here (``--faas`` has both); a plugin that calls ``os._exit`` or
``sys.exit`` is reported as EOF and the test goes on; a sync call runs in a forked child of this
process, killed at its ``timeout_s`` and reported as ``Timeout`` even when it is stuck in C code that
holds the GIL, so the test always ends (see :mod:`plugtune.runtime.inprocess`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

from plugtune.errors import Cause, PluginCallError
from plugtune.jobs.plugins import JobFunction
from plugtune.pretest.deployment import deploy_job
from plugtune.pretest.policy import PolicyChoice, serving
from plugtune.pretest.trial import TrialResult, group_size_of, run_trial, samples_of
from plugtune.runtime import FaultInjection, InProcessRuntime
from plugtune.sdk import Context
from plugtune.spec.validation import ValidatedJob
from plugtune.types import CallOutcome


class PluginExit(Exception):  # it is what the plugin did
    """Raised in place of ``os._exit`` / ``sys.exit`` while plugins run in this process.

    A SystemExit would end the test's own event loop, so exits travel as this ordinary
    exception and are turned back into the EOF they are in a real instance."""


async def run_local(
    job: ValidatedJob,
    rows: list[dict[str, Any]],
    samples: int,
    policy: PolicyChoice,
    inject_for: Callable[[int], FaultInjection | None] | None = None,
) -> TrialResult:
    """Run the rollout and graders in-process (a debugger works) on the first ``samples`` rows
    (``group_size`` rollouts each when the job has group graders), all at once.

    A plugin that cannot be loaded raises ``PluginCallError`` (Create faas fault)."""
    async with InProcessRuntime() as rt:
        functions = [ExitsAsEof(jf) for jf in await deploy_job(rt, job, inject_for)]
        with serving(policy) as server, exits_raise():
            group_size = group_size_of(job)
            chosen = samples_of(job, rows, samples)
            return await run_trial(
                functions,
                server,
                chosen,
                concurrency=samples * group_size,
                group_size=group_size,
                job=job,
                rows=rows,
            )


@contextmanager
def exits_raise() -> Iterator[None]:
    """While plugins run in this process, ``os._exit`` and ``sys.exit`` raise :class:`PluginExit`."""
    real_os_exit, real_sys_exit = os._exit, sys.exit

    def _os_exit(status: int) -> NoReturn:
        raise PluginExit(f"the plugin called os._exit({status!r})")

    def _sys_exit(status: object = None) -> NoReturn:
        raise PluginExit(f"the plugin called sys.exit({status!r})")

    os._exit, sys.exit = _os_exit, _sys_exit
    try:
        yield
    finally:
        os._exit, sys.exit = real_os_exit, real_sys_exit


class ExitsAsEof(JobFunction):
    """A deployed function whose :class:`PluginExit` failures are reported as EOF, as in an instance."""

    def __init__(self, jf: JobFunction) -> None:
        super().__init__(jf.fn, jf.spec.weight, jf.spec.name)

    async def invoke(self, ctx: Context, *args: Any) -> CallOutcome:
        try:
            return await self.fn.invoke(ctx, *args)
        except PluginCallError as exc:
            prefix = f"{PluginExit.__name__}: "
            if exc.cause_enum is not Cause.ERROR_500 or not exc.message.startswith(prefix):
                raise
            eof = PluginCallError(
                Cause.EOF,
                exc.message[len(prefix) :],
                plugin=exc.plugin,
                call_id=exc.call_id,
                instance_id=exc.instance_id,
                trajectory_id=exc.trajectory_id,
                traceback=exc.traceback,
                code_hash=exc.code_hash,
                logs=exc.logs,
            )
            raise eof from None
