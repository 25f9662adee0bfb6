"""The init project's plugins against the real policy gateway and the packaged demo model."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from plugtune import Context, Sample, Sampling, Trajectory
from plugtune.init_project import create_project
from plugtune.spec.models import resolve_model
from plugtune.spec.validation import read_dataset

MODEL = resolve_model("builtin:tiny-chat", Path("."))
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (MODEL / "config.json").is_file(), reason="demo model not built"),
]


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"init_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_init_plugins_run_against_the_demo_model(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from plugtune.gateway import PolicyGateway

    create_project(tmp_path / "p")
    rollout = load(tmp_path / "p/plugins/rollout.py")
    grader = load(tmp_path / "p/plugins/grader.py")
    rows = read_dataset(tmp_path / "p/data/train.jsonl")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(MODEL)
    tokenizer = AutoTokenizer.from_pretrained(MODEL)

    async def one(gateway: PolicyGateway, index: int, k: int) -> tuple[float | None, int]:
        trajectory_id = f"t{index}-{k}"
        row = rows[index]
        sample = Sample(row["messages"], extra=row["extra"], index=index, sampling=Sampling(max_tokens=32))
        assert (
            await rollout.solve(Context(trajectory_id=trajectory_id), gateway.open(trajectory_id), sample)
            is None
        )
        trace = gateway.take(trajectory_id)
        reward = grader.exact(Context(), sample, Trajectory(trajectory_id, list(trace.messages)))
        return reward, len(trace.response_ids)

    async def run_all(gateway: PolicyGateway) -> list[tuple[float | None, int]]:
        return await asyncio.gather(*(one(gateway, i, k) for i in range(len(rows)) for k in range(4)))

    with PolicyGateway(model, tokenizer, model_name="policy", max_batch_size=64) as gateway:
        results = asyncio.run(run_all(gateway))
    rewards = [r for r, _ in results]
    assert len(results) == 64
    assert all(n > 0 for _, n in results), "every trajectory has sampled tokens"
    assert set(rewards) <= {0.0, 1.0}
    assert 0.0 < sum(r for r in rewards if r is not None) / len(rewards) < 1.0, "GRPO gets a signal"
