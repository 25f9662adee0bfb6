"""failure_policy and the circuit breaker on the TRL path: retry on a fresh instance, drop the
sample, fail the run with the classified error. The reward functions and rollout_func are called
as TRL's GRPOTrainer calls them (a real trainer object, real plugins, a real store)."""

from __future__ import annotations

import json
import os
import shutil
import types
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
QUESTIONS = {"59": "21+38=?", "42": "12+30=?", "55": "40+15=?", "44": "33+11=?"}


def _job(tmp_path: Path, extras: list[dict[str, Any]], policy: str) -> Path:
    task = tmp_path / "task"
    shutil.copytree(TASK, task)
    job = task / "job.yaml"
    job.write_text(job.read_text().replace("{max_attempts: 2, on_exhausted: drop_sample}", policy))
    rows = [{"messages": [{"role": "user", "content": QUESTIONS[e["answer"]]}], "extra": e} for e in extras]
    (task / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return job


def _rewards(run: pt.TRLRun, rows: list[int], **kwargs: Any) -> dict[str, list[float | None]]:
    """One batch through the reward functions, as GRPOTrainer calls them (2 completions a row)."""
    index = [i for i in rows for _ in range(2)]
    prompts = [run.rows[i]["messages"] for i in index]
    completions = [[{"role": "assistant", "content": run.rows[i]["extra"]["answer"]}] for i in index]
    ids = [[1, 2] for _ in index]
    state = types.SimpleNamespace(global_step=0)
    args = {"trainer_state": state, pt.ROW: index, **kwargs}
    return {f.__name__: f(prompts, completions, ids, **args) for f in run.reward_funcs()}


def _records(store: Store, job_id: int) -> list[Any]:
    ids = [t.trajectory_id for t in store.trajectories(job_id, limit=100)]
    return store.trajectory_records(job_id, ids)


def test_a_grader_whose_instance_dies_is_retried_on_a_fresh_one_and_scores(
    store: Store, tmp_path: Path
) -> None:
    job = _job(tmp_path, [{"answer": "59", "flaky": True}, {"answer": "42"}], "{max_attempts: 2}")
    run = pt.open_run(job, store=store)
    rewards = _rewards(run, [0, 1])
    run.close()

    assert rewards == {"exact_match": [1.0] * 4, "picky": [0.5] * 4}  # under fail_job, nothing failed
    failed = store.metrics(run.run.job_id)
    assert failed["plugin/failed_calls/EOF"][0].value >= 2  # the first tries died with their instance
    assert all(r.status == "success" and not r.errors for r in _records(store, run.run.job_id))
    job_row = store.get_job(run.run.job_id)
    assert job_row is not None and job_row.status == "succeeded"


def test_when_most_calls_of_a_step_fail_the_circuit_breaker_fails_the_run_classified(
    store: Store, tmp_path: Path
) -> None:
    rows = [{"answer": a, "crash": True} for a in ("59", "42", "55", "44")]
    run = pt.open_run(_job(tmp_path, rows, "{max_attempts: 2, on_exhausted: drop_sample}"), store=store)
    with pytest.raises(PluginCallError) as raised:
        _rewards(run, [0, 1, 2, 3])  # drop_sample alone would go on scoring None
    assert raised.value.cause == "500" and raised.value.plugin == "picky"
    assert "plugin calls in this step failed" in raised.value.message

    job = store.get_job(run.run.job_id)
    assert job is not None and job.status == "failed" and job.error is not None
    assert (job.error.type, job.error.cause) == ("Call plugin error", "500")
    assert "16 of 24 plugin calls" in job.error.message and "picky cannot score" in job.error.message
    assert len(_records(store, run.run.job_id)) == 8  # the step that tripped it is in the store


def test_a_grader_reporting_status_failure_or_discarding_is_recorded_as_on_plugtune_s_trainer(
    store: Store, tmp_path: Path
) -> None:
    rows = [{"answer": "59", "report": "failure"}, {"answer": "42", "report": "discard"}]
    run = pt.open_run(_job(tmp_path, rows, "{max_attempts: 1, on_exhausted: drop_sample}"), store=store)
    rewards = _rewards(run, [0, 1])
    run.close()

    assert rewards["picky"] == [None] * 4
    records = _records(store, run.run.job_id)
    failed = [r for r in records if r.sample_index == 0]
    discarded = [r for r in records if r.sample_index == 1]
    assert len(failed) == 2 and len(discarded) == 2
    for r in failed:
        error = r.errors[0]
        assert r.status == "failed" and (error.type, error.cause, error.plugin) == (
            "Call plugin error",
            "Status failure",
            "picky",
        )
        assert error.message == "picky returned Status.FAILURE; its reason: the checker is down"
        assert "reported this failure itself" in error.hint
    for r in discarded:
        assert r.status == "discard" and r.reward is None and not r.errors
        assert r.reward_components == {}  # a discarded trajectory keeps no grade, as on plugtune's trainer
        assert r.discard_reason == "picky discarded it (Status.DISCARD): an ambiguous question"


def test_failure_policy_group_decides_whether_a_group_with_a_failed_trajectory_trains(
    store: Store, tmp_path: Path
) -> None:
    rows = [{"answer": "59", "crash_first": True}, {"answer": "42"}]
    for rule, handed in (
        ("", {"exact_match": [1.0] * 4, "picky": [None, 0.5, 0.5, 0.5]}),  # drop: trajectory
        (", group: {drop: group}", {"exact_match": [None, None, 1.0, 1.0], "picky": [None, None, 0.5, 0.5]}),
    ):
        policy = "{max_attempts: 1, on_exhausted: drop_sample" + rule + "}"
        job = _job(tmp_path / str(len(rule)), rows, policy)
        run = pt.open_run(job, store=store)
        rewards = _rewards(run, [0, 1])
        run.close()

        assert rewards == handed  # a dropped group is all None for TRL: no gradient
        records = {r.trajectory_id: r for r in _records(store, run.run.job_id)}
        assert records["s1-p0-r0"].status == "failed" and records["s1-p0-r0"].errors[0].cause == "500"
        sibling = records["s1-p0-r1"]
        dropped = store.metrics(run.run.job_id)["groups/dropped_by_rule"][0].value
        if rule:
            assert sibling.status == "discard" and dropped == 1
            assert sibling.discard_reason == (
                "its group was dropped by failure_policy.group: 1 of its 2 trajectories failed (drop: group)"
            )
        else:
            assert sibling.status == "success" and sibling.reward == 1.25 and dropped == 0


def _trainer(run: pt.TRLRun, tmp_path: Path) -> Any:
    from trl import GRPOConfig, GRPOTrainer

    lm = load_model(run.run.job.model_dir if run.run.job else Path())
    config = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
    )
    return GRPOTrainer(
        model=lm.model,
        reward_funcs=run.reward_funcs(),
        args=config,
        train_dataset=run.dataset(),
        processing_class=lm.tokenizer,
        rollout_func=run.rollout_func(),
    )


def test_a_crashing_rollout_under_drop_sample_is_masked_for_trl_and_recorded_failed(
    store: Store, tmp_path: Path
) -> None:
    rows = [{"answer": "59"}, {"answer": "42", "rollout_crash": True}]
    run = pt.open_run(_job(tmp_path, rows, "{max_attempts: 2, on_exhausted: drop_sample}"), store=store)
    trainer = _trainer(run, tmp_path)
    prompts = [run.rows[i]["messages"] for i in (0, 0, 1, 1)]
    out = run.rollout_func()(prompts, trainer)

    pad = trainer.processing_class.eos_token_id
    assert out["completion_ids"][2:] == [[pad], [pad]] and out["env_mask"][2:] == [[0], [0]]
    assert all(1 in mask for mask in out["env_mask"][:2])  # the others trained on as sampled
    completions = [[{"role": "assistant", "content": "59"}]] * 4
    kwargs = {"trainer_state": trainer.state, pt.TRAJECTORY: out[pt.TRAJECTORY]}
    scores = [f(prompts, completions, out["completion_ids"], **kwargs) for f in run.reward_funcs()]
    run.close()

    assert [s[2:] for s in scores] == [[None, None], [None, None]]  # TRL's "unscorable"
    crashed = [r for r in _records(store, run.run.job_id) if r.sample_index == 1]
    assert len(crashed) == 2
    for r in crashed:
        assert r.status == "failed" and r.reward is None
        error = r.errors[0]
        assert (error.type, error.cause, error.plugin) == ("Call plugin error", "500", "with_tool")
        assert "the rollout cannot start row 1" in r.errors[0].message


def test_a_crashing_rollout_under_fail_job_stops_the_run_with_the_classified_error(
    store: Store, tmp_path: Path
) -> None:
    job = _job(tmp_path, [{"answer": "59"}, {"answer": "42", "rollout_crash": True}], "{max_attempts: 1}")
    run = pt.open_run(job, store=store)
    trainer = _trainer(run, tmp_path)
    prompts = [run.rows[i]["messages"] for i in (0, 0, 1, 1)]
    with pytest.raises(PluginCallError) as raised:
        run.rollout_func()(prompts, trainer)
    assert (raised.value.cause, raised.value.plugin) == ("500", "with_tool")

    job_row = store.get_job(run.run.job_id)
    assert job_row is not None and job_row.status == "failed" and job_row.error is not None
    assert (job_row.error.type, job_row.error.owner) == ("Call plugin error", "plugin")
    assert "the rollout cannot start row 1" in job_row.error.message


GROUP_GRADER = """
from plugtune import group_grader


@group_grader
def one_question(ctx, sample, trajectories):
    asked = {t.messages[0]["content"] for t in trajectories} | {sample.messages[0]["content"]}
    return [1.0 if len(asked) == 1 else 0.0 for _ in trajectories]
"""


def test_a_group_never_mixes_prompts_when_num_generations_differs_from_group_size(
    store: Store, tmp_path: Path
) -> None:
    job = _job(tmp_path, [{"answer": "59"}, {"answer": "42"}], "{max_attempts: 1}")
    (job.parent / "plugins" / "group.py").write_text(GROUP_GRADER)
    group = "  group_graders:\n    - {entry: plugins/group.py:one_question, weight: 1.0}\n"
    text = job.read_text().replace("  graders:\n", group + "  graders:\n")
    job.write_text(text)
    run = pt.open_run(job, store=store, group_size=4)  # TRL's num_generations is 2 in _rewards
    rewards = _rewards(run, [0, 1])
    run.close()
    assert rewards["one_question"] == [1.0, 1.0, 1.0, 1.0]
    groups = {t.group_id for t in store.trajectories(run.run.job_id, limit=100)}
    assert len(groups) == 2


def test_rollout_func_refuses_a_num_generations_other_than_the_group_size(
    store: Store, tmp_path: Path
) -> None:
    job = _job(tmp_path, [{"answer": "59"}, {"answer": "42"}], "{max_attempts: 1}")
    run = pt.open_run(job, store=store)
    trainer = types.SimpleNamespace(args=types.SimpleNamespace(num_generations=3))
    try:
        with pytest.raises(ValueError, match="num_generations is 3 but the job's group_size is 2"):
            run.rollout_func()([run.rows[0]["messages"]] * 3, trainer)
    finally:
        run.close()
