"""A step's batch holds each row once, and every trajectory of a step its own id, whatever the data:
datasets smaller than the batch, and epoch boundaries inside a batch (issue 24, item 1)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from plugtune.trainer.data import DataCursor
from tests.trainer.test_grpo import make_trainer


@pytest.mark.parametrize("num_rows", [5, 7, 9])
def test_an_epoch_boundary_inside_a_batch_repeats_no_row_and_each_epoch_covers_every_row(
    num_rows: int,
) -> None:
    cursor = DataCursor(num_rows, seed=1)
    drawn: list[int] = []
    for _ in range(12):
        batch = cursor.take(4)
        assert len(set(batch)) == 4, batch
        drawn += batch
    for epoch in range(len(drawn) // num_rows):  # the stream is still epoch after epoch of all rows
        assert sorted(drawn[epoch * num_rows : (epoch + 1) * num_rows]) == list(range(num_rows))


def test_a_dataset_smaller_than_the_batch_repeats_rows_as_evenly_as_it_can() -> None:
    cursor = DataCursor(3, seed=1)
    for _ in range(5):
        assert sorted(Counter(cursor.take(4)).values()) == [1, 1, 2]


def test_the_cursor_resumes_exactly_past_a_boundary_that_carried_rows() -> None:
    a = DataCursor(5, seed=3)
    a.take(4)
    a.take(4)  # crossed into epoch 1 with one row of epoch 0
    saved = a.state()
    expected = [a.take(4) for _ in range(4)]
    b = DataCursor(5, seed=3)
    b.restore(saved)
    assert [b.take(4) for _ in range(4)] == expected
    old = {k: saved[k] for k in ("num_rows", "seed", "epoch", "position")}  # an older checkpoint
    DataCursor(5, seed=3).restore(old)


@pytest.mark.parametrize("num_rows", [1, 3, 5])  # 1: examples/verl's one row at batch_size 2
async def test_every_step_stores_batch_times_group_trajectories_with_distinct_ids(
    tiny_model_path: Path, num_rows: int
) -> None:
    rows = [{"messages": [{"role": "user", "content": f"{i}+{i}=?"}]} for i in range(num_rows)]
    trainer = make_trainer(tiny_model_path, rows=rows, steps=3, batch_size=4, group_size=2, max_new_tokens=4)
    for step in range(1, 4):
        result = await trainer.step()
        ids = [r.trajectory_id for r in result.records]
        assert len(ids) == 4 * 2 and len(set(ids)) == len(ids), ids
        assert {r.status for r in result.records} == {"success"}, [r.errors for r in result.records]
        assert len({r.group_id for r in result.records}) == 4
        assert all(r.group_id.startswith(f"s{step}-b") for r in result.records)
        assert result.metrics["trajectories/total"] == 8
        if num_rows >= 4:
            assert len({r.sample_index for r in result.records}) == 4  # no row twice in one step
