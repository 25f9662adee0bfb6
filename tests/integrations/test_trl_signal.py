"""On the TRL path the reward-signal checks (issue 27 item 1) run on the trajectories plugtune
records: TRL's real GRPOTrainer with a grader that cannot score most replies leaves the per-step
metric and the unscorable warning, with example trajectories, in the job."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from plugtune.integrations import trl as pt
from plugtune.jobs.report import job_document
from plugtune.store import Store
from plugtune.trainer.health import warning_examples
from tests.integrations.conftest import TASK
from tests.integrations.test_trl import _trainer

pytest.importorskip("trl")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

UNSURE = """
from plugtune import grader

@grader
def unsure(ctx, sample, trajectory):
    return None  # never sure
"""


@pytest.mark.slow
def test_a_trl_run_whose_grader_is_mostly_unscorable_warns_from_the_recorded_trajectories(
    store: Store, tmp_path: Path
) -> None:
    (tmp_path / "unsure.py").write_text(UNSURE)
    run = pt.open_run([f"{TASK}/plugins/grader.py:exact_match", f"{tmp_path}/unsure.py:unsure"], store=store)
    from datasets import Dataset

    trainer = _trainer(run, tmp_path / "out", rollout=False, steps=2)
    rows = [{"prompt": [{"role": "user", "content": f"{a}+{a}=?"}], "answer": str(2 * a)} for a in range(8)]
    trainer.train_dataset = Dataset.from_list(rows)  # the TRL user's own dataset
    trainer.train()
    job_id = run.run.job_id
    shares = [p.value for p in store.metrics(job_id, "").get("grader/unsure/unscorable_share", [])]
    assert shares == [1.0, 1.0]
    doc = job_document(store, job_id)
    [warning] = [w for w in doc["warnings"] if "grader unsure found" in w]
    assert warning.startswith("steps 1-2: grader unsure found 8 of 8 trajectories (100%) unscorable")
    examples = warning_examples(warning)
    assert examples and all(store.get_trajectory(job_id, t) is not None for t in examples)
