"""plugtune's plugins under TRL's real GRPOTrainer, on CPU with the demo model (a few tiny steps)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from plugtune.errors import PluginCallError
from plugtune.integrations import trl as pt
from plugtune.store import Store
from plugtune.trainer.model import load_model
from tests.integrations.conftest import TASK

pytest.importorskip("trl")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def _trainer(run: pt.TRLRun, out: Path, *, rollout: bool, steps: int = 2) -> Any:
    from trl import GRPOConfig, GRPOTrainer

    lm = load_model(run.run.job.model_dir if run.run.job else Path("plugtune/demo/model"))
    config = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,
        max_steps=steps,
        learning_rate=1e-5,
        beta=0.0,
        use_cpu=True,
        bf16=False,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        gradient_checkpointing=False,
        reward_weights=run.reward_weights(),
    )
    return GRPOTrainer(
        model=lm.model,
        reward_funcs=run.reward_funcs(),
        args=config,
        train_dataset=run.dataset(),
        processing_class=lm.tokenizer,
        rollout_func=run.rollout_func() if rollout else None,
        callbacks=[run.callback()],
    )


@pytest.mark.slow
def test_rollout_with_a_tool_and_a_crashing_grader_train_and_show_in_the_store(
    store: Store, tmp_path: Path
) -> None:
    run = pt.open_run(TASK / "job.yaml", store=store)
    _trainer(run, tmp_path, rollout=True).train()

    job = store.get_job(run.run.job_id)
    assert job is not None and job.status == "succeeded"
    records = store.trajectory_records(
        run.run.job_id, [t.trajectory_id for t in store.trajectories(run.run.job_id, limit=100)]
    )
    assert len(records) == 8  # 2 steps x 4 completions
    for r in records:  # the gateway's token record: the tool's tokens are masked out, never re-tokenized
        assert r.response_ids and len(r.response_mask) == len(r.response_ids)
        assert 0 in r.response_mask and 1 in r.response_mask
        assert any(m.get("role") == "tool" for m in r.messages)
    crashed = [r for r in records if r.sample_index == 1]
    assert crashed and all(r.status == "failed" and r.reward_components["picky"] is None for r in crashed)
    assert all(e.cause == "500" and e.plugin == "picky" for r in crashed for e in r.errors)
    assert any(r.status == "success" and r.reward_components["picky"] == 0.5 for r in records)
    assert any("tool said" in line.message for line in store.logs(run.run.job_id, plugin="with_tool"))
    assert "reward/mean" in store.metrics(run.run.job_id)


@pytest.mark.slow
def test_a_crashing_grader_under_fail_job_stops_train_with_the_classified_error(
    store: Store, tmp_path: Path
) -> None:
    """A TRL user's own dataset and generation, plugtune's graders: the crash ends the run classified."""
    from datasets import Dataset

    rows = [
        {"prompt": [{"role": "user", "content": "21+38=?"}], "answer": "59", "crash": False},
        {"prompt": [{"role": "user", "content": "12+30=?"}], "answer": "42", "crash": True},
    ]
    run = pt.open_run(
        [f"{TASK}/plugins/grader.py:exact_match", f"{TASK}/plugins/grader.py:picky"], store=store
    )
    trainer = _trainer(run, tmp_path, rollout=False)
    trainer.train_dataset = Dataset.from_list(rows)
    with pytest.raises(PluginCallError) as raised:
        trainer.train()
    assert (raised.value.cause, raised.value.plugin) == ("500", "picky")

    job = store.get_job(run.run.job_id)
    assert job is not None and job.status == "failed" and job.error is not None
    assert (job.error.type, job.error.cause) == ("Call plugin error", "500")
    assert "picky cannot score" in job.error.message
