"""A real job's gateway samples with the job's settings, and what trained silently wrong is shown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.settings import Settings
from tests.jobs.jobkit import make_job

pytestmark = pytest.mark.slow
runner = CliRunner()

# No sampling settings but a seed (the job's apply), and a second turn whose history edits the answer.
# The seed makes every reply the same on every run: how many of them max_new_tokens cuts (the
# truncated warning needs more than half) no longer depends on the draw.
EDITING_ROLLOUT = """
from plugtune import rollout

@rollout
def answer(ctx, policy, sample):
    seed = 1000 * ctx.step + 10 * sample.index + 2 * ctx.rollout_index
    first = policy.chat(sample.messages, seed=seed)
    edited = {"role": "assistant", "content": "I think " + policy.content(first)}
    policy.chat([*sample.messages, edited, {"role": "user", "content": "Sure?"}], seed=seed + 1)
    return None
"""


def _policy_runs(mask: list[int]) -> list[int]:
    runs, previous = [], 0
    for m in mask:
        if m and not previous:
            runs.append(0)
        if m:
            runs[-1] += 1
        previous = m
    return runs


def test_a_job_shows_off_policy_and_dropped_token_warnings_and_its_tokens(
    tmp_path: Path, home: Settings
) -> None:
    job_file = make_job(tmp_path / "warn", rollout=EDITING_ROLLOUT, hyper={"top_p": 0.5, "max_new_tokens": 3})
    result = runner.invoke(app, ["run", str(job_file)])
    assert result.exit_code == 0, result.output

    shown = runner.invoke(app, ["jobs", "show", "1"])
    assert shown.exit_code == 0, shown.output
    assert "warning: step 1: logprob_gap is" in shown.output
    assert "hyperparameters.top_p is 0.5" in shown.output
    assert "recorded policy tokens were dropped" in shown.output
    doc = json.loads(runner.invoke(app, ["jobs", "show", "1", "--json"]).stdout)
    # each kind once per attempt, though both steps had them
    assert len([w for w in doc["warnings"] if "logprob_gap is" in w]) == 1
    assert len([w for w in doc["warnings"] if "recorded policy tokens were dropped" in w]) == 1
    assert len([w for w in doc["warnings"] if "stopped at max_new_tokens (3)" in w]) == 1  # replies cut
    assert doc["metrics"]["history/rewrites"] == 4 and doc["metrics"]["tokens/dropped_policy"] >= 4

    listed = runner.invoke(app, ["trajectories", "1", "--json"])
    assert listed.exit_code == 0, listed.output
    trajectories = json.loads(listed.stdout)["trajectories"]
    assert len(trajectories) == 2 * 2 * 2
    for t in trajectories:
        assert t["prompt_ids"] and len(t["response_ids"]) == len(t["response_mask"]) == len(
            t["response_logprobs"]
        )
        assert t["metrics"]["history/rewrites"] == 1 and t["metrics"]["history/dropped_policy_tokens"] >= 1
        # the rollout asked for no max_tokens: every reply still stops at the job's max_new_tokens
        assert all(1 <= n <= 3 for n in _policy_runs(t["response_mask"])), t["response_mask"]
