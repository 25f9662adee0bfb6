from __future__ import annotations

import dataclasses

from plugtune.store import Store
from plugtune.types import LogLine, MetricPoint, TrajectoryRecord


def _trajectory(step: int, k: int) -> TrajectoryRecord:
    return TrajectoryRecord(
        trajectory_id=f"s{step}-{k}",
        group_id=f"s{step}-g0",
        step=step,
        sample_index=0,
        rollout_index=k,
        attempt=1,
        policy_version=step,
        prompt_ids=[1],
        response_ids=[2],
        response_mask=[1],
        response_logprobs=[-0.1],
        messages=[{"role": "user", "content": "q"}],
    )


def test_delete_after_step_forgets_results_but_keeps_history(store: Store, job_id: int) -> None:
    for step in range(8):
        store.upsert_trajectories(job_id, [_trajectory(step, k) for k in range(4)])
        store.add_metrics(
            job_id, [MetricPoint(time=float(step), plugin="", name="loss", value=step / 10, step=step)]
        )
        store.add_metrics(
            job_id, [MetricPoint(time=float(step), plugin="solve", name="cpu_percent", value=1.0)]
        )
        if step % 3 == 0:
            store.add_checkpoint(job_id, step, f"/ckpt/{step}")
    store.add_logs(job_id, [LogLine(time=7.0, level="INFO", plugin="solve", message="step 7")])

    assert store.delete_after_step(job_id, 3) == 16

    assert store.count_trajectories(job_id) == 16 and store.count_trajectories(job_id, step=4) == 0
    assert [p.step for p in store.metrics(job_id)["loss"]] == [0, 1, 2, 3]
    assert len(store.metrics(job_id, "solve")["cpu_percent"]) == 8  # resource history stays
    assert store.count_logs(job_id) == 1
    latest = store.latest_checkpoint(job_id)
    assert latest is not None and latest.step == 3
    loss = [m for m in store.latest_metrics([job_id]) if m.name == "loss"]
    assert [(m.step, m.value) for m in loss] == [(3, 0.3)]

    # The resumed attempt writes steps 4.. again: same ids, no duplicates.
    store.upsert_trajectories(job_id, [dataclasses.replace(_trajectory(4, k), attempt=2) for k in range(4)])
    assert store.count_trajectories(job_id) == 20
    assert store.delete_after_step(job_id, 10) == 0
