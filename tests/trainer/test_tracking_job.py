"""A real job with a LoRA adapter and every tracker: what it leaves in its folder and at the collector."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from plugtune.jobs.control import create_job
from plugtune.jobs.scheduler import run_job
from plugtune.settings import Settings
from plugtune.spec.validation import validate_job
from plugtune.store import Store
from plugtune.trainer import lora
from plugtune.trainer.tracking import TENSORBOARD_DIR
from tests.jobs.jobkit import make_job
from tests.trainer.test_tracking import Collector, tensorboard_scalars, wandb_history

pytestmark = pytest.mark.slow


def test_a_lora_job_writes_tensorboard_wandb_and_spans_and_a_merged_model(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    collector = Collector()
    try:
        job_file = make_job(
            tmp_path / "lora",
            hyper={"lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}},
            extra={
                "tracking": {"wandb": {"project": "plugtune-test"}, "otlp": {"endpoint": collector.endpoint}}
            },
        )
        job_id, invalid = create_job(store, job_file)
        assert invalid is None, invalid
        assert run_job(store, home, job_id) == "succeeded", store.get_job(job_id)
    finally:
        collector.close()
    folder = home.home / "jobs" / str(job_id)

    scalars = tensorboard_scalars(folder / TENSORBOARD_DIR)
    assert [step for step, _ in scalars["reward/mean"]] == [1, 2]
    assert [row["_step"] for row in wandb_history(folder)] == ["1", "2"]
    calls = [s for s in collector.spans if s["plugtune.job_id"] == str(job_id)]
    stored = {t.trajectory_id for t in store.trajectories(job_id, phase="train", limit=100)}
    assert {s["plugtune.plugin"] for s in calls} == {"answer", "exact"}
    assert {s["plugtune.trajectory_id"] for s in calls} == stored  # 2 steps x 2 prompts x 2 rollouts

    checkpoint = next((folder / "checkpoints").iterdir())
    assert (checkpoint / lora.ADAPTER_WEIGHTS).is_file() and not list(checkpoint.glob("model*.safetensors"))
    assert (folder / "final" / lora.ADAPTER_DIR / lora.ADAPTER_WEIGHTS).is_file()
    merged = transformers.AutoModelForCausalLM.from_pretrained(str(folder / "final"), dtype=torch.float32)
    assert not any("lora" in name for name, _ in merged.named_parameters())


def test_tracking_and_lora_mistakes_name_their_field(tmp_path: Path) -> None:
    job_file = make_job(
        tmp_path / "bad",
        hyper={"lora": {"r": 0}},
        extra={"tracking": {"otlp": {"endpoint": "localhost:4318"}, "tensorboard": True}},
    )
    with pytest.raises(Exception) as caught:
        validate_job(job_file)
    text = str(caught.value)
    assert (
        "hyperparameters.lora.r" in text
        and "tracking.otlp.endpoint" in text
        and "tracking.tensorboard" in text
    )
