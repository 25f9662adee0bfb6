"""`pt.reward_funcs([...])` alone in a TRL script (issue 24, item 13): the job it records shows its
steps out of TRL's max_steps (it showed `3/0`) and ends succeeded when the script exits."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.settings import Settings
from plugtune.store import Store
from tests.integrations.conftest import TASK

pytest.importorskip("trl")

SCRIPT = """
import os
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer
from plugtune.demo import MODEL_DIR
from plugtune.integrations import trl as pt
from plugtune.trainer.model import load_model

lm = load_model(MODEL_DIR)
rows = [
    {"prompt": [{"role": "user", "content": "21+38=?"}], "answer": "59"},
    {"prompt": [{"role": "user", "content": "40+15=?"}], "answer": "55"},
]
config = GRPOConfig(
    output_dir=OUT, per_device_train_batch_size=4, num_generations=2, max_completion_length=4,
    max_steps=3, learning_rate=1e-5, beta=0.0, use_cpu=True, bf16=False, logging_steps=1,
    report_to="none", save_strategy="no", disable_tqdm=True, seed=0, gradient_checkpointing=False,
)
GRPOTrainer(
    model=lm.model,
    reward_funcs=pt.reward_funcs([GRADER], group_size=2),
    args=config,
    train_dataset=Dataset.from_list(rows),
    processing_class=lm.tokenizer,
).train()
"""


@pytest.mark.slow
def test_a_run_with_only_reward_funcs_counts_its_steps_out_of_max_steps(
    home: Settings, store: Store, tmp_path: Path
) -> None:
    script = tmp_path / "train.py"
    grader = f"{TASK}/plugins/grader.py:exact_match"
    script.write_text(f"OUT = {str(tmp_path / 'out')!r}\nGRADER = {grader!r}\n" + textwrap.dedent(SCRIPT))
    ran = subprocess.run(
        [sys.executable, str(script)], env=dict(os.environ), capture_output=True, text=True, timeout=600
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    [job] = store.list_jobs()
    assert (job.status, job.steps_done, job.steps_total) == ("succeeded", 3, 3), job
    listed = CliRunner().invoke(app, ["jobs", "list"]).output
    assert "   3/3   " in listed and "/0 " not in listed, listed
