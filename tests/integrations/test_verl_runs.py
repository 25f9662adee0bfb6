"""A verl run as one plugtune job: worker processes join the run's job, reward workers record the
trainer's step, failure_policy.group judges verl's prompt groups in the agent loop, and each step's
reward-signal checks run on the recorded trajectories. verl's real AgentLoopWorker on CPU."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

pytest.importorskip("verl", reason="verl is installed by `make test` (pip install --no-deps)")

from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
from verl.protocol import DataProto

from plugtune.integrations import verl as plugtune_verl
from plugtune.jobs.report import job_document
from plugtune.settings import Settings
from plugtune.store import Store
from plugtune.trainer.draft import DROPPED_BY_RULE
from plugtune.trainer.health import warning_examples
from tests.integrations import test_verl as base
from tests.integrations.test_verl import ROWS, TASK, WEIGHTS, _config

server = base.server  # verl's server interface over the demo model on CPU (module-scoped)
runs = base.runs  # closes this process's verl runs after each test

REWARD_WORKER = """
import sys
from plugtune.integrations import verl
# verl's agent loop passes its extra_fields on in extra_info: the weights version it sampled with
print(verl.compute_score("arith", "59", "59", {"index": 0, "max_global_steps": 6}, job=sys.argv[1]))
"""


def _task(tmp_path: Path, failure_policy: str, grader: str | None = None) -> Path:
    task = tmp_path / "task"
    (task / "plugins").mkdir(parents=True)
    (task / "data").symlink_to(TASK / "data")
    (task / "plugins" / "rollout.py").write_text((TASK / "plugins" / "rollout.py").read_text())
    (task / "plugins" / "grader.py").write_text((TASK / "plugins" / "grader.py").read_text() + (grader or ""))
    text = (TASK / "job.yaml").read_text()
    text = text.replace("failure_policy: {max_attempts: 2, on_exhausted: drop_sample}", failure_policy)
    if grader:
        picky = "    - {entry: plugins/grader.py:picky, weight: 0.5}\n"
        text = text.replace(picky, picky + "    - {entry: plugins/grader.py:unsure, weight: 1.0}\n")
    (task / "job.yaml").write_text(text)
    return task / "job.yaml"


def _batch(rows: list[dict[str, Any]], uids: list[str], step: int) -> DataProto:
    def column(values: list[Any]) -> np.ndarray:
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out

    return DataProto.from_dict(
        non_tensors={
            "raw_prompt": column([r["messages"] for r in rows]),
            "agent_name": column(["plugtune"] * len(rows)),
            "index": np.array([int(u[-1]) for u in uids]),
            "uid": column(uids),
            "data_source": column(["arith"] * len(rows)),
            "reward_model": column([{"ground_truth": r["extra"]["ground_truth"]} for r in rows]),
            "extra_info": column([dict(r["extra"]) for r in rows]),
        },
        meta_info={"global_steps": step},
    )


def _worker(tmp_path: Path, job: Path, server: Any, n: int) -> AgentLoopWorker:
    config = _config(tmp_path, job)
    config.actor_rollout_ref.rollout.n = n
    return AgentLoopWorker(config, llm_client=server)


def test_a_reward_worker_process_joins_the_agent_loops_job_at_the_trainers_step(
    tmp_path: Path, home: Settings, runs: None, server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLUGTUNE_RUN", "verl-run-1")  # as every worker of one verl run shares
    job = TASK / "job.yaml"
    worker = _worker(tmp_path, job, server, 1)
    WEIGHTS["version"] = 2
    output = asyncio.run(worker.generate_sequences(_batch([ROWS[0]], ["u0"], 3)))
    store = Store.open(home.database_url)
    [created] = store.list_jobs()
    assert created.status == "running" and created.spec["run_key"] == "verl-run-1"

    child = subprocess.run(
        [sys.executable, "-c", REWARD_WORKER, str(job)],
        env={**os.environ},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr
    assert "'score': 1.25" in child.stdout
    # the reward worker left, the agent loop's process still works for the run: the job goes on
    assert store.get_job(created.id).status == "running"  # type: ignore[union-attr]
    assert store.engine_run("verl-run-1") == (created.id, 1, 2)

    plugtune_verl.close_runs()
    [ended] = store.list_jobs()  # one job for the run's two processes
    assert ended.id == created.id and ended.status == "succeeded"
    records = store.trajectory_records(ended.id, [t.trajectory_id for t in store.trajectories(ended.id)])
    [rolled] = [r for r in records if r.trajectory_id in output.non_tensor_batch["plugtune_trajectory_id"]]
    [graded] = [r for r in records if r is not rolled]
    assert rolled.step == 3 and graded.step == 7  # sampled with the weights of step 6: step 7
    assert [a.status for a in store.list_attempts(ended.id)] == ["succeeded"]


def test_the_run_key_comes_from_the_setting_else_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLUGTUNE_RUN", "from-env")
    assert plugtune_verl.run_key("given") == "given"
    assert plugtune_verl.run_key() == "from-env"
    monkeypatch.delenv("PLUGTUNE_RUN")
    assert plugtune_verl.run_key() == ""  # no Ray here: the process's own job


@pytest.mark.parametrize("rule", ["{drop: group}", "{min_scored: 2}"])
def test_failure_policy_group_drops_a_verl_group_with_a_failed_trajectory_and_says_why(
    tmp_path: Path, home: Settings, runs: None, server: Any, rule: str
) -> None:
    job = _task(tmp_path, f"failure_policy: {{max_attempts: 1, on_exhausted: drop_sample, group: {rule}}}")
    worker = _worker(tmp_path, job, server, 2)
    WEIGHTS["version"] = 0
    ok, crash = ROWS[0], ROWS[1]  # picky crashes on ROWS[1]
    # group a: one scored, one failed; group b: both scored; group c: verl split it (1 of 2 here)
    rows, uids = [ok, crash, ok, ok, ok], ["a0", "a0", "b1", "b1", "c2"]
    output = asyncio.run(asyncio.wait_for(worker.generate_sequences(_batch(rows, uids, 1)), 60))

    masks = output.batch["response_mask"].sum(-1).tolist()
    assert masks[0] == 0 and masks[1] == 0  # group a trains nothing
    assert masks[2] > 0 and masks[3] > 0  # group b trains
    assert output.batch["rm_scores"][:2].sum() == 0.0
    plugtune_verl.close_runs()

    store = Store.open(home.database_url)
    [found] = store.list_jobs()
    ids = output.non_tensor_batch["plugtune_trajectory_id"].tolist()
    by_id = {r.trajectory_id: r for r in store.trajectory_records(found.id, ids)}
    dropped, failed = by_id[ids[0]], by_id[ids[1]]
    assert dropped.status == "discard" and dropped.discard_reason.startswith(DROPPED_BY_RULE)
    assert ("drop: group" if "drop" in rule else "fewer than min_scored 2") in dropped.discard_reason
    assert failed.status == "failed"
    assert by_id[ids[2]].status == by_id[ids[3]].status == "success"
    # the split group was judged with the one trajectory it had here (min_scored 2 drops it)
    assert by_id[ids[4]].status == ("discard" if "min_scored" in rule else "success")
    series = store.metrics(found.id, "")["groups/dropped_by_rule"]
    assert [(p.step, p.value) for p in series] == [(1, 2.0 if "min_scored" in rule else 1.0)]


UNSURE = """

@grader
def unsure(ctx: Context, sample: Sample, trajectory: Trajectory) -> float | None:
    return None  # never sure
"""


def test_verls_steps_get_the_signal_checks_from_their_recorded_trajectories(
    tmp_path: Path, home: Settings, runs: None, server: Any
) -> None:
    job = _task(tmp_path, "failure_policy: {max_attempts: 1, on_exhausted: drop_sample}", UNSURE)
    config = _config(tmp_path, job)
    config.actor_rollout_ref.rollout.n = 2
    config.actor_rollout_ref.actor.optim.total_training_steps = 2  # as verl's trainer writes it
    worker = AgentLoopWorker(config, llm_client=server)
    ok = ROWS[0]

    async def two_steps() -> None:
        for step in (1, 2):
            WEIGHTS["version"] = step - 1
            await worker.generate_sequences(_batch([ok, ok, ok, ok], ["a0", "a0", "b1", "b1"], step))

    asyncio.run(two_steps())
    plugtune_verl.close_runs()
    store = Store.open(home.database_url)
    [found] = store.list_jobs()
    assert (found.steps_done, found.steps_total) == (2, 2)  # verl's total, not job.yaml's 1
    series = store.metrics(found.id, "")

    def by_step(name: str) -> dict[int, float]:
        return {int(p.step or 0): p.value for p in series[name]}

    assert by_step("grader/unsure/unscorable_share") == {1: 1.0, 2: 1.0}
    assert by_step("grader/exact_match/unscorable_share") == {1: 0.0, 2: 0.0}
    assert set(by_step("groups/zero_variance_share")) == {1, 2}
    assert set(by_step("response/truncated_share")) == {1, 2}
    warnings = job_document(store, found.id)["warnings"]
    [unscorable] = [w for w in warnings if "grader unsure found" in w]
    examples = warning_examples(unscorable)
    assert examples and all(store.get_trajectory(found.id, t) is not None for t in examples)


RAY_DRIVER = """
import sys
import ray

ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)


@ray.remote
class RewardWorker:  # as verl's reward loop workers: separate processes of one Ray job
    def score(self, job, version):
        from plugtune.integrations import verl
        info = {"index": 0, "max_global_steps": version}
        return verl.compute_score("arith", "59", "59", info, job=job)["score"], verl.run_key()

    def close(self):
        from plugtune.integrations import verl
        verl.close_runs()


workers = [RewardWorker.remote() for _ in range(2)]
print(ray.get([w.score.remote(sys.argv[1], v) for w, v in zip(workers, (2, 3))]))
ray.get([w.close.remote() for w in workers])
ray.shutdown()
"""


@pytest.mark.slow
def test_verls_ray_workers_share_one_job_by_their_ray_session_and_job(home: Settings, tmp_path: Path) -> None:
    ray_home = tmp_path / "ray-home"  # Ray writes its auth token under HOME
    ray_home.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PLUGTUNE_RUN"}
    driver = subprocess.run(
        [sys.executable, "-c", RAY_DRIVER, str(TASK / "job.yaml")],
        env={**env, "HOME": str(ray_home)},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert driver.returncode == 0, driver.stderr[-3000:]
    store = Store.open(home.database_url)
    [job] = store.list_jobs()  # two worker processes, one job
    key = str(job.spec["run_key"])
    assert key.startswith("ray:session_") and key in driver.stdout
    assert job.status == "succeeded" and store.engine_run(key) == (job.id, 0, 2)
    assert sorted(r.step for r in store.trajectories(job.id)) == [3, 4]


class _RewardActor:
    """A verl reward loop worker as Ray runs it, an actor with an event loop of its own:
    ``handle.compute_score.remote(data)`` is awaitable (the one call verl's agent loop makes)."""

    def __init__(self, config: Any) -> None:
        from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

        async def make() -> Any:
            return RewardLoopWorker(config)

        self.worker = asyncio.run_coroutine_threadsafe(make(), self.loop).result(timeout=120)
        self.compute_score = SimpleNamespace(remote=self._remote)

    def _remote(self, data: Any) -> Any:
        return asyncio.wrap_future(
            asyncio.run_coroutine_threadsafe(self.worker.compute_score(data), self.loop)
        )

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)


def test_verls_own_agent_loop_and_reward_loop_record_the_trainers_step_not_0(
    tmp_path: Path, home: Settings, runs: None, server: Any
) -> None:
    config = _config(tmp_path, TASK / "job.yaml")
    config.actor_rollout_ref.rollout.agent.default_agent_loop = "single_turn_agent"  # verl's, not plugtune's
    actor = _RewardActor(config)
    try:
        worker = AgentLoopWorker(config, llm_client=server, reward_loop_worker_handles=[actor])
        WEIGHTS["version"] = 4  # verl's step 5 samples with the weights synced at step 4
        batch = base._batch([ROWS[0]], {"global_steps": 5})
        del batch.non_tensor_batch["agent_name"]  # the default agent loop: verl's single turn
        output = asyncio.run(worker.generate_sequences(batch))
    finally:
        actor.stop()
    assert output.non_tensor_batch["plugtune_scored"].tolist() == [1.0]  # plugtune's compute_score ran
    plugtune_verl.close_runs()
    store = Store.open(home.database_url)
    [job] = store.list_jobs()
    [record] = store.trajectories(job.id)
    assert record.step == 5 and record.status == "success"  # from verl's extra fields, not 0
