"""The drain that moves plugin log lines and metric points from the runtime to the store."""

from __future__ import annotations

from pathlib import Path

from plugtune.jobs.plugins import Drain, JobFunction
from plugtune.runtime import InProcessRuntime
from plugtune.runtime.inprocess import MAX_LOG_LINES
from plugtune.sdk import Context, Sample, Trajectory

CHATTY = """
from plugtune import grader


@grader
def chatty(ctx, sample, trajectory):
    start, count = sample.extra["start"], sample.extra["count"]
    for i in range(start, start + count):
        ctx.logger.info("line %d", i)
    return 1.0
"""


async def _write(fn: JobFunction, start: int, count: int) -> None:
    sample = Sample(messages=[{"role": "user", "content": "hi"}], extra={"start": start, "count": count})
    trajectory = Trajectory(trajectory_id="t", messages=[{"role": "assistant", "content": "x"}])
    await fn.invoke(Context(job_id="1", trajectory_id="t"), sample, trajectory)


async def test_no_line_is_lost_once_the_runtime_buffer_is_full(tmp_path: Path) -> None:
    (tmp_path / "chatty.py").write_text(CHATTY)
    half = MAX_LOG_LINES * 3 // 4
    async with InProcessRuntime() as rt:
        fn = JobFunction(await rt.deploy(f"{tmp_path / 'chatty.py'}:chatty"), None, "chatty")
        drain = Drain([fn])
        taken: list[str] = []
        for start in range(0, 4 * half, half):  # the buffer fills up during the second call
            await _write(fn, start, half)
            logs, _ = drain.take()
            taken += [line.message for line in logs if line.source != "runtime"]
        assert taken == [f"line {i}" for i in range(4 * half)]
        assert {line.plugin for line in logs} == {"chatty"}
        assert drain.take() == ([], [])


async def test_lines_that_overflowed_between_two_reads_are_reported(tmp_path: Path) -> None:
    (tmp_path / "chatty.py").write_text(CHATTY)
    async with InProcessRuntime() as rt:
        fn = JobFunction(await rt.deploy(f"{tmp_path / 'chatty.py'}:chatty"), None, "chatty")
        drain = Drain([fn])
        await _write(fn, 0, 10)
        drain.take()
        await _write(fn, 10, MAX_LOG_LINES + 5)  # more than the buffer holds, in one read period
        logs, _ = drain.take()
        gap = [line for line in logs if line.level == "WARNING"]
        assert len(gap) == 1 and "log lines of chatty were lost" in gap[0].message
        assert f"the {MAX_LOG_LINES} newest were kept" in gap[0].message
        assert logs[-1].message == f"line {MAX_LOG_LINES + 14}"
