"""The demo job evaluates its held-out rows greedily before training and at steps 30 and 60 (not 7x)."""

from __future__ import annotations

from plugtune.jobs.demo import demo_job_file
from plugtune.jobs.evaluate import eval_settings, is_eval_step
from plugtune.spec.validation import validate_job


def test_the_demo_evaluates_250_rows_greedily_before_training_and_twice() -> None:
    job = validate_job(demo_job_file())
    assert job.validation_rows == 250
    steps = job.spec.hyperparameters.steps
    assert [s for s in range(0, steps + 1) if is_eval_step(s, job.spec)] == [0, 30, 60]
    settings = eval_settings(job.spec)
    assert settings.samples == 0 and settings.k == 1  # one greedy reply per row: pass@1 only
