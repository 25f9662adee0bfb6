"""verl's real AgentLoopWorker and reward loader driving plugtune's agent loop and reward function.

Generation is real: verl's server interface over plugtune's CPU engine and the demo model
(``LocalServerManager``); the plugins run in the local runtime; the run lands in a real store.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

verl = pytest.importorskip("verl", reason="verl is installed by `make test` (pip install --no-deps)")

from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.trainer.ppo.reward import get_custom_reward_fn  # noqa: E402

from plugtune.errors import InvalidValueError, PluginCallError  # noqa: E402
from plugtune.gateway.engine import GenerationEngine  # noqa: E402
from plugtune.integrations import verl as plugtune_verl  # noqa: E402
from plugtune.settings import Settings  # noqa: E402
from plugtune.spec.validation import validate_job  # noqa: E402
from plugtune.store import Store  # noqa: E402
from plugtune.trainer.model import load_model  # noqa: E402

TASK = Path(__file__).parent / "verl_task"
DEMO_MODEL = Path(plugtune_verl.__file__).parents[1] / "demo" / "model"
RESPONSE_LENGTH = 64
#: The weights version the server samples with (verl's global_steps: the step of the last sync).
WEIGHTS = {"version": 0}


@pytest.fixture(scope="module")
def server() -> Iterator[plugtune_verl.LocalServerManager]:
    loaded = load_model(DEMO_MODEL)
    engine = GenerationEngine(
        loaded.model,
        eos_token_ids={int(loaded.tokenizer.eos_token_id)},
        decode=lambda ids: str(loaded.tokenizer.decode(ids)),
        weights_lock=threading.Lock(),
        policy_version=lambda: WEIGHTS["version"],
    )
    engine.start()
    yield plugtune_verl.LocalServerManager(engine)
    engine.stop()


def _config(tmp_path: Path, job: Path) -> Any:
    loops = tmp_path / "agent_loops.yaml"
    loops.write_text(
        f"- name: plugtune\n  _target_: plugtune.integrations.verl.PlugtuneAgentLoop\n  job: {job}\n"
    )
    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(
            config_name="ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={DEMO_MODEL}",
                "actor_rollout_ref.rollout.name=vllm",
                "actor_rollout_ref.rollout.prompt_length=96",
                f"actor_rollout_ref.rollout.response_length={RESPONSE_LENGTH}",
                "actor_rollout_ref.rollout.calculate_log_probs=true",
                f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops}",
                "reward.custom_reward_function.path=pkg://plugtune.integrations.verl",
                "reward.custom_reward_function.name=compute_score",
                f"+reward.custom_reward_function.reward_kwargs.job={job}",
            ],
        )


def _batch(rows: list[dict[str, Any]], meta_info: dict[str, Any] | None = None) -> DataProto:
    def column(values: list[Any]) -> np.ndarray:
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out

    return DataProto.from_dict(
        non_tensors={
            "raw_prompt": column([r["messages"] for r in rows]),
            "agent_name": column(["plugtune"] * len(rows)),
            "index": np.arange(len(rows)),
            "data_source": column(["arith"] * len(rows)),
            "reward_model": column([{"ground_truth": r["extra"]["ground_truth"]} for r in rows]),
            "extra_info": column([dict(r["extra"]) for r in rows]),
        },
        meta_info=meta_info,
    )


ROWS = [
    {"messages": [{"role": "user", "content": "21+38=?"}], "extra": {"ground_truth": "59"}},
    {"messages": [{"role": "user", "content": "12+30=?"}], "extra": {"ground_truth": "42", "crash": True}},
]


@pytest.fixture()
def runs(home: Settings) -> Iterator[None]:
    yield
    plugtune_verl.close_runs()


def _only_job(home: Settings) -> Any:
    store = Store.open(home.database_url)
    jobs = store.list_jobs()
    assert len(jobs) == 1
    return store, jobs[0]


def test_verls_worker_runs_the_rollout_plugin_with_real_generation_and_records_the_job(
    tmp_path: Path, home: Settings, runs: None, server: plugtune_verl.LocalServerManager
) -> None:
    worker = AgentLoopWorker(_config(tmp_path, TASK / "job.yaml"), llm_client=server)
    asked = server.requests
    WEIGHTS["version"] = 4  # verl's step 5 samples with the weights synced at step 4
    output = asyncio.run(worker.generate_sequences(_batch(ROWS)))

    assert server.requests - asked == 4  # two policy calls per trajectory, answered by the engine
    masks, responses = output.batch["response_mask"], output.batch["responses"]
    assert responses.shape == (2, RESPONSE_LENGTH)
    # The tool's turn sits between the two replies: environment tokens (0) inside policy tokens (1).
    first = masks[0].tolist()
    assert 1 in first and 0 in first[first.index(1) : len(first) - first[::-1].index(1)]
    assert masks[1].sum() == 0  # the crashing grader dropped row 1: no gradient from it
    assert output.non_tensor_batch["plugtune_status"].tolist() == ["success", "failed"]
    scores = output.batch["rm_scores"].sum(-1).tolist()
    assert scores[0] in (0.25, 1.25) and scores[1] == 0.0  # exact_match 1.0 x 0 or 1, picky 0.5 x 0.5

    plugtune_verl.close_runs()
    store, job = _only_job(home)
    assert job.status == "succeeded"
    ids = output.non_tensor_batch["plugtune_trajectory_id"].tolist()
    by_id = {t.trajectory_id: t for t in store.trajectory_records(job.id, ids)}
    ok, failed = by_id[ids[0]], by_id[ids[1]]
    # no meta_info step here: the server's weights version (4) + 1, not 0
    assert (ok.step, ok.policy_version, failed.step) == (5, 4, 5)
    assert output.non_tensor_batch["max_global_steps"].tolist() == [4, 4]
    assert failed.status == "failed" and failed.reward is None  # not a 0.0-reward success
    n = len(ok.response_ids)
    assert responses[0][:n].tolist() == ok.response_ids[:RESPONSE_LENGTH]  # the tokens, not re-tokenized
    assert ok.messages[-1]["role"] == "assistant" and ok.messages[2]["role"] == "tool"
    assert (failed.errors[0].type, failed.errors[0].cause) == ("Call plugin error", "500")
    assert "picky cannot score row 1" in failed.errors[0].message
    logs = [line.message for line in store.logs(job.id, plugin="with_tool")]
    assert any("tool said 59" in m for m in logs)


def test_a_rollout_that_crashes_is_masked_for_verl_and_recorded_failed_with_its_cause(
    tmp_path: Path, home: Settings, runs: None, server: plugtune_verl.LocalServerManager
) -> None:
    worker = AgentLoopWorker(_config(tmp_path, TASK / "job.yaml"), llm_client=server)
    WEIGHTS["version"] = 2
    crashing = {"messages": [{"role": "user", "content": "1+2=?"}], "extra": {"ground_truth": "3"}}
    crashing["extra"]["rollout_crash"] = True
    # verl's trainer puts the step in the batch's meta_info; it reaches a rollout that never generates
    output = asyncio.run(worker.generate_sequences(_batch([ROWS[0], crashing], {"global_steps": 3})))

    # verl sees a response that trains nothing and scores 0.0 (it has no "unscorable")
    assert output.non_tensor_batch["plugtune_status"].tolist() == ["success", "failed"]
    assert output.batch["response_mask"][1].sum() == 0 and output.batch["rm_scores"][1].sum() == 0.0
    plugtune_verl.close_runs()
    store, job = _only_job(home)
    ids = output.non_tensor_batch["plugtune_trajectory_id"].tolist()
    by_id = {t.trajectory_id: t for t in store.trajectory_records(job.id, ids)}
    failed = by_id[ids[1]]
    # the store says what happened: failed, no reward, the classified error; at the batch's step
    assert failed.status == "failed" and failed.reward is None and failed.attempt == 2
    assert (failed.errors[0].type, failed.errors[0].cause) == ("Call plugin error", "500")
    assert "the rollout cannot start row 1" in failed.errors[0].message
    assert failed.step == by_id[ids[0]].step == 3 and by_id[ids[0]].policy_version == 2
    assert job.status == "succeeded"  # drop_sample: the run goes on


def test_verls_reward_loader_finds_compute_score_and_the_graders_score_in_the_runtime(
    tmp_path: Path, home: Settings, runs: None
) -> None:
    score = get_custom_reward_fn(_config(tmp_path, TASK / "job.yaml"))
    assert score is not None
    good = score(data_source="arith", solution_str="59", ground_truth="59", extra_info={"index": 0})
    bad = score(data_source="arith", solution_str="7", ground_truth="42", extra_info={"crash": True})
    assert good == {"score": 1.25, "plugtune_scored": 1.0}  # 1.0 x 1.0 + 0.5 x 0.5
    assert bad == {"score": 0.0, "plugtune_scored": 0.0}  # dropped: no grader's 0, verl needs a number

    batch = plugtune_verl.compute_score_batch(
        ["arith", "arith"], ["59", "41"], ["59", "42"], [{}, {}], job=str(TASK / "job.yaml")
    )
    assert [b["score"] for b in batch] == [1.25, 0.25]

    plugtune_verl.close_runs()
    store, job = _only_job(home)
    records = store.trajectories(job.id)
    assert len(records) == 4 and sorted(r.status for r in records) == [
        "failed",
        "success",
        "success",
        "success",
    ]
    code = store.get_code({p.name: p for p in store.list_plugins(job.id)}["picky"].code_hash)
    assert b"def picky" in code["grader.py"]


def test_a_crash_under_fail_job_ends_the_verl_run_with_the_classified_error(
    tmp_path: Path, home: Settings, runs: None
) -> None:
    job_file = tmp_path / "task" / "job.yaml"
    job_file.parent.mkdir()
    for part in ("plugins", "data"):
        (job_file.parent / part).symlink_to(TASK / part)
    text = (TASK / "job.yaml").read_text().replace("on_exhausted: drop_sample", "on_exhausted: fail_job")
    job_file.write_text(text)
    with pytest.raises(PluginCallError) as raised:
        plugtune_verl.compute_score("arith", "42", "42", {"crash": True}, job=str(job_file))
    assert raised.value.cause == "500" and "picky cannot score" in raised.value.message

    plugtune_verl.close_runs()
    _, job = _only_job(home)
    assert job.status == "failed" and job.error is not None
    assert (job.error.type, job.error.owner, job.error.cause) == ("Call plugin error", "plugin", "500")


def test_a_group_rule_is_refused_by_verls_reward_function_naming_its_line(
    tmp_path: Path, home: Settings, runs: None
) -> None:
    job_file = tmp_path / "task" / "job.yaml"
    job_file.parent.mkdir()
    for part in ("plugins", "data"):
        (job_file.parent / part).symlink_to(TASK / part)
    text = (
        (TASK / "job.yaml")
        .read_text()
        .replace("on_exhausted: drop_sample", "on_exhausted: drop_sample, group: {drop: group}")
    )
    job_file.write_text(text)
    with pytest.raises(InvalidValueError) as raised:
        plugtune_verl.compute_score("arith", "42", "42", {}, job=str(job_file))
    [problem] = raised.value.problems
    line = next(i for i, row in enumerate(text.splitlines(), 1) if "group: {drop: group}" in row)
    assert (problem.file, problem.line, problem.field) == (str(job_file), line, "failure_policy.group")
    assert "verl's reward function never sees (one response a call)" in problem.message
    assert Store.open(home.database_url).list_jobs() == []  # refused before any job is recorded


def test_without_a_job_file_the_error_says_where_to_name_it(home: Settings, runs: None) -> None:
    with pytest.raises(ValueError, match="reward_kwargs.job=/path/job.yaml"):
        plugtune_verl.compute_score("arith", "1", "1", {})
    with pytest.raises(FileNotFoundError, match="nowhere.yaml does not exist"):
        plugtune_verl.compute_score("arith", "1", "1", {}, job="nowhere.yaml")


def test_the_example_run_composes_with_verls_config_and_its_job_validates(home: Settings) -> None:
    example = Path(__file__).parents[2] / "examples" / "verl"
    command = (example / "run.sh").read_text().split("python -m verl.trainer.main_ppo", 1)[1]
    values = {"$DATA": "/data", "$MODEL": "m", "$HERE": str(example), "$PLUGTUNE_JOB": "j.yaml"}
    values.update({"${GPUS:-8}": "8", "${NODES:-1}": "1", "$PLUGTUNE_DATABASE_URL": "sqlite://", '"$@"': ""})
    for name, value in values.items():
        command = command.replace(name, value)
    overrides = [o.replace('"', "") for o in command.replace("\\\n", " ").split() if "=" in o]
    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    assert config.actor_rollout_ref.rollout.agent.default_agent_loop == "plugtune"
    assert get_custom_reward_fn(config) is not None  # pkg://plugtune.integrations.verl:compute_score
    loops = OmegaConf.load(config.actor_rollout_ref.rollout.agent.agent_loop_config_path)
    assert loops[0]["_target_"] == "plugtune.integrations.verl.PlugtuneAgentLoop"
    validated = validate_job(example / "job.yaml", check_model=False)
    assert [g.function for g in validated.graders] == ["exact_answer"]


MEASURED = """
    ctx.metric("answer_chars", len(trajectory.completion.strip()))
    return 1.0 if trajectory.completion.strip() == str(expected) else 0.0
"""


def test_verls_steps_keep_every_plugins_ctx_metric_per_step(
    tmp_path: Path, home: Settings, runs: None, server: plugtune_verl.LocalServerManager
) -> None:
    task = tmp_path / "task"
    (task / "plugins").mkdir(parents=True)
    (task / "data").symlink_to(TASK / "data")
    (task / "job.yaml").write_text((TASK / "job.yaml").read_text())
    (task / "plugins" / "rollout.py").write_text((TASK / "plugins" / "rollout.py").read_text())
    grader = (TASK / "plugins" / "grader.py").read_text()
    old = "\n    return 1.0 if trajectory.completion.strip() == str(expected) else 0.0\n"
    assert old in grader
    (task / "plugins" / "grader.py").write_text(grader.replace(old, MEASURED))
    worker = AgentLoopWorker(_config(tmp_path, task / "job.yaml"), llm_client=server)
    rows = [ROWS[0], {"messages": [{"role": "user", "content": "1+2=?"}], "extra": {"ground_truth": "3"}}]

    async def two_steps() -> list[Any]:  # on one event loop, as verl's worker runs
        outputs = []
        for step in (1, 2):  # the last step's values are written when the run closes
            WEIGHTS["version"] = step - 1
            outputs.append(await worker.generate_sequences(_batch(rows, {"global_steps": step})))
        return outputs

    outputs = asyncio.run(two_steps())
    assert [o.non_tensor_batch["plugtune_status"].tolist() for o in outputs] == [["success"] * 2] * 2
    plugtune_verl.close_runs()

    store, job = _only_job(home)
    series = store.metrics(job.id)

    def by_step(name: str) -> dict[int, float]:
        return {int(p.step or 0): p.value for p in series.get(name, [])}

    assert by_step("metric/with_tool/tool_calls/count") == {1: 2.0, 2: 2.0}
    records = store.trajectory_records(job.id, [t.trajectory_id for t in store.trajectories(job.id)])
    for step in (1, 2):
        values = [r.metrics["exact_match/answer_chars"] for r in records if r.step == step]
        assert len(values) == 2
        got = {s: by_step(f"metric/exact_match/answer_chars/{s}")[step] for s in ("mean", "min", "max")}
        assert got == pytest.approx({"mean": sum(values) / 2, "min": min(values), "max": max(values)})
