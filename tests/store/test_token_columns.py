"""A trajectory keeps the trainer's log-prob of each response token and the spans history rewrites cut
(the console's token view), on SQLite and PostgreSQL; a store of schema version 3 is upgraded, its
trajectories reading as never scored by the trainer."""

from __future__ import annotations

import dataclasses

from sqlalchemy import text

from plugtune.store.schema import SCHEMA_VERSION
from plugtune.types import DroppedSpan, TrajectoryRecord
from tests.store.conftest import Target


def _record(tid: str) -> TrajectoryRecord:
    return TrajectoryRecord(
        trajectory_id=tid,
        group_id="g",
        step=1,
        sample_index=0,
        rollout_index=0,
        attempt=1,
        policy_version=0,
        prompt_ids=[1, 2],
        response_ids=[3, 4, 5],
        response_mask=[1, 0, 1],
        response_logprobs=[-0.5, 0.0, -1.25],
        messages=[{"role": "user", "content": "hi"}],
        reward=1.0,
    )


def test_trainer_logprobs_and_dropped_spans_round_trip(target: Target) -> None:
    store = target.open()
    job = store.create_job("j", {"name": "j"})
    scored = dataclasses.replace(
        _record("s1-p0-r0"),
        trainer_logprobs=[-0.4999999999, 0.0, -3.0],
        dropped_spans=[DroppedSpan(at=1, tokens=7, policy_tokens=5, rewrite=1)],
    )
    store.upsert_trajectories(job, [scored, _record("s1-p0-r1")])
    got = store.get_trajectory(job, "s1-p0-r0")
    assert got is not None
    assert got.trainer_logprobs == [-0.4999999999, 0.0, -3.0]  # float64, exact
    assert got.dropped_spans == [DroppedSpan(at=1, tokens=7, policy_tokens=5, rewrite=1)]
    plain = store.get_trajectory(job, "s1-p0-r1")
    assert plain is not None and plain.trainer_logprobs == [] and plain.dropped_spans == []
    store.close()


def test_a_schema_3_store_is_upgraded_and_its_trajectories_were_never_scored(target: Target) -> None:
    store = target.open()
    job = store.create_job("j", {"name": "j"})
    store.upsert_trajectories(job, [_record("s1-p0-r0")])
    table = f'"{target.schema}".trajectories' if target.schema else "trajectories"
    meta = f'"{target.schema}".plugtune_meta' if target.schema else "plugtune_meta"
    with store._db.engine.begin() as conn:  # back to what plugtune wrote before the token view
        conn.execute(text(f"ALTER TABLE {table} DROP COLUMN trainer_logprobs"))
        conn.execute(text(f"ALTER TABLE {table} DROP COLUMN dropped_spans"))
        conn.execute(text(f"UPDATE {meta} SET value = '3' WHERE key = 'schema_version'"))
    store.close()

    store = target.open()
    old = store.get_trajectory(job, "s1-p0-r0")
    assert old is not None and old.trainer_logprobs == [] and old.dropped_spans == []
    assert old.response_logprobs == [-0.5, 0.0, -1.25]
    store.upsert_trajectories(
        job, [dataclasses.replace(_record("s2-p0-r0"), trainer_logprobs=[-1.0, 0.0, -2.0])]
    )
    new = store.get_trajectory(job, "s2-p0-r0")
    assert new is not None and new.trainer_logprobs == [-1.0, 0.0, -2.0]
    with store._db.engine.begin() as conn:
        version = conn.execute(text(f"SELECT value FROM {meta} WHERE key = 'schema_version'")).scalar()
    assert version == str(SCHEMA_VERSION)
    store.close()
