"""``deploy(entry, shape=...)``: an undecorated TRL/verl reward function adapted in the worker, as
job.yaml's ``shape:`` asks (issue 29 item 1); what cannot be adapted is a Create faas fault saying why."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from plugtune.errors import PluginCallError
from plugtune.runtime import LocalRuntime
from plugtune.sdk import Context, Kind, Sample, Trajectory

SOURCE = """
from plugtune import grader


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str == ground_truth)


@grader(shape="verl")
def decorated_score(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0
"""


async def test_an_undecorated_verl_function_is_adapted_and_misuse_is_a_create_fault(tmp_path: Path) -> None:
    (tmp_path / "rewards.py").write_text(SOURCE)
    async with LocalRuntime() as rt:
        fn = await rt.deploy(f"{tmp_path}/rewards.py:compute_score", shape="verl")
        assert fn.spec.kind is Kind.GRADER
        sample = Sample(messages=[{"role": "user", "content": "2+2?"}], extra={"ground_truth": "4"})
        right = Trajectory(trajectory_id="t", messages=[{"role": "assistant", "content": "4"}])
        out = await asyncio.wait_for(fn.invoke(Context(), sample, right), 30)
        assert out.value == 1.0
        with pytest.raises(PluginCallError) as grouped:
            await rt.deploy(f"{tmp_path}/rewards.py:compute_score", shape="verl", group=True)
        assert "use @grader(shape='verl')" in grouped.value.message
        with pytest.raises(PluginCallError) as twice:
            await rt.deploy(f"{tmp_path}/rewards.py:decorated_score", shape="verl")
        assert "keep one (the decorator's shape= or job.yaml's shape:)" in twice.value.message
        with pytest.raises(ValueError, match="shape='openrlhf'"):
            await rt.deploy(f"{tmp_path}/rewards.py:compute_score", shape="openrlhf")
