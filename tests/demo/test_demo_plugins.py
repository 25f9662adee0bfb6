from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from plugtune import Context, Sample, Trajectory
from plugtune.demo import DATA_DIR, MODEL_DIR
from plugtune.demo.plugins.grader import exact_match
from plugtune.demo.plugins.rollout import answer
from plugtune.gateway import PolicyGateway


@pytest.fixture(scope="module")
def gateway() -> Iterator[PolicyGateway]:
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR)
    gw = PolicyGateway(model, AutoTokenizer.from_pretrained(MODEL_DIR))
    gw.start()
    yield gw
    gw.stop()


def test_the_demo_rollout_and_grader_run_against_the_gateway(gateway: PolicyGateway) -> None:
    rows: list[dict[str, Any]] = [
        json.loads(line) for line in (DATA_DIR / "train.jsonl").read_text().splitlines()
    ]
    rewards = []
    for i, row in enumerate(rows[:16]):
        sample = Sample.from_dict({**row, "index": i, "sampling": {"temperature": 0.0}})
        ctx = Context(trajectory_id=f"demo-{i}")
        assert asyncio.run(answer(ctx, gateway.open(ctx.trajectory_id), sample)) is None
        trace = gateway.take(ctx.trajectory_id)
        assert trace.response_mask and all(trace.response_mask)
        assert ctx.metrics["completion_tokens"] == len(trace.response_ids)
        trajectory = Trajectory(ctx.trajectory_id, trace.messages)
        rewards.append(exact_match(Context(), sample, trajectory))
    assert set(rewards) <= {0.0, 1.0}
    assert 0 < sum(r or 0.0 for r in rewards) < len(rewards)  # greedy: well below perfect, above zero
