"""Trajectories carry their phase (train | eval); a store written before phases existed is upgraded."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

from plugtune.store import Store
from plugtune.store.schema import SCHEMA_VERSION
from plugtune.types import TrajectoryRecord


def _record(tid: str, step: int, phase: str = "train") -> TrajectoryRecord:
    return TrajectoryRecord(
        trajectory_id=tid,
        group_id=tid.rsplit("-r", 1)[0],
        step=step,
        sample_index=0,
        rollout_index=0,
        attempt=1,
        policy_version=step,
        prompt_ids=[1, 2],
        response_ids=[3],
        response_mask=[1],
        response_logprobs=[-0.5],
        messages=[{"role": "user", "content": "hi"}],
        reward=1.0,
        phase=phase,
    )


def test_phase_filters_lists_counts_and_neighbours(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'p.db'}")
    job = store.create_job("j", {"name": "j"})
    store.upsert_trajectories(
        job,
        [_record("s1-p0-r0", 1), _record("eval-greedy-s1-p0-r0", 1, "eval"), _record("s2-p0-r0", 2)],
    )
    assert [t.trajectory_id for t in store.trajectories(job, phase="eval")] == ["eval-greedy-s1-p0-r0"]
    assert [t.phase for t in store.trajectories(job, phase="train")] == ["train", "train"]
    assert store.count_trajectories(job, phase="train", step=1) == 1
    assert store.trajectory_neighbors(job, "s2-p0-r0", phase="train") == (None, "s1-p0-r0")
    got = store.get_trajectory(job, "eval-greedy-s1-p0-r0")
    assert got is not None and got.phase == "eval"
    store.close()


def test_a_schema_1_store_is_upgraded_and_its_trajectories_are_train(tmp_path: Path) -> None:
    url, path = f"sqlite:///{tmp_path / 'old.db'}", tmp_path / "old.db"
    store = Store.open(url)
    job = store.create_job("j", {"name": "j"})
    store.upsert_trajectories(job, [_record("s1-p0-r0", 1)])
    store.close()
    with sqlite3.connect(path) as conn:  # back to what plugtune wrote before phases
        conn.execute("DROP INDEX ix_trajectories_phase")
        conn.execute("ALTER TABLE trajectories DROP COLUMN phase")
        conn.execute("ALTER TABLE trajectories DROP COLUMN trainer_logprobs")  # version 4's
        conn.execute("ALTER TABLE trajectories DROP COLUMN dropped_spans")
        conn.execute("ALTER TABLE trajectories DROP COLUMN discard_reason")
        conn.execute("UPDATE plugtune_meta SET value = '1' WHERE key = 'schema_version'")

    store = Store.open(url)
    [old] = store.trajectories(job)
    assert old.phase == "train"
    store.upsert_trajectories(job, [dataclasses.replace(_record("eval-greedy-s1-p0-r0", 1), phase="eval")])
    assert store.count_trajectories(job, phase="eval") == 1
    store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT value FROM plugtune_meta WHERE key = 'schema_version'").fetchone() == (
            str(SCHEMA_VERSION),
        )
        indexes = {row[1] for row in conn.execute("PRAGMA index_list(trajectories)")}
    assert "ix_trajectories_phase" in indexes


def test_a_schema_2_store_gains_discard_reasons_and_keeps_its_trajectories(tmp_path: Path) -> None:
    url, path = f"sqlite:///{tmp_path / 'v2.db'}", tmp_path / "v2.db"
    store = Store.open(url)
    job = store.create_job("j", {"name": "j"})
    store.upsert_trajectories(job, [_record("s1-p0-r0", 1)])
    store.close()
    with sqlite3.connect(path) as conn:  # back to what plugtune wrote before discard reasons
        conn.execute("ALTER TABLE trajectories DROP COLUMN trainer_logprobs")  # version 4's
        conn.execute("ALTER TABLE trajectories DROP COLUMN dropped_spans")
        conn.execute("ALTER TABLE trajectories DROP COLUMN discard_reason")
        conn.execute("UPDATE plugtune_meta SET value = '2' WHERE key = 'schema_version'")

    store = Store.open(url)
    [old] = store.trajectories(job)
    assert old.discard_reason == "" and old.reward == 1.0
    why = "answer discarded it (Status.DISCARD): the tool sandbox was down"
    store.upsert_trajectories(
        job, [dataclasses.replace(_record("s1-p1-r0", 1), status="discard", discard_reason=why)]
    )
    assert [t.discard_reason for t in store.trajectories(job, status="discard")] == [why]
    got = store.get_trajectory(job, "s1-p1-r0")
    assert got is not None and got.discard_reason == why
    store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT value FROM plugtune_meta WHERE key = 'schema_version'").fetchone() == (
            str(SCHEMA_VERSION),
        )
