"""Poison rows in a real job (plugtune's trainer through the scheduler): a row whose grader raises
on every trajectory, epoch after epoch, is quarantined after hyperparameters.poison_after steps and
named by file and line (doctor, the job's warnings, ``plugtune data quarantine``); the job succeeds
and samples it no more; a row that times out is never quarantined; the export leaves its line out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.jobs.control import create_job
from plugtune.jobs.report import doctor_document, job_warnings, quarantined_rows
from plugtune.jobs.scheduler import run_job
from plugtune.settings import Settings
from plugtune.store import Store
from plugtune.trainer.data import DataCursor
from plugtune.trainer.poison import RowSource, observe, poison_cause
from tests.jobs.jobkit import ROWS, make_job
from tests.judge_server import JUDGED_GRADER, judge

pytestmark = pytest.mark.slow

runner = CliRunner()

POISONED_GRADER = """
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    if sample.extra["answer"] == "42":
        raise ValueError("this row's answer cannot be graded")
    return 1.0 if trajectory.completion.strip() == sample.extra["answer"] else 0.0
"""

SLOW_ROLLOUT = """
import time
from plugtune import rollout

@rollout
def answer(ctx, policy, sample):
    if sample.extra["answer"] == "15":
        time.sleep(6)  # past runtime.timeout_s: a Timeout, every time
    policy.chat(sample.messages, temperature=1.0, max_tokens=sample.sampling.max_tokens)
    return None
"""


def test_a_row_that_fails_every_time_is_quarantined_named_and_exported_without(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    # a blank line before the poisoned row: it is row 2 on line 4 of the file
    rows: list[object] = [ROWS[0], ROWS[1], "", *ROWS[2:]]
    job = make_job(
        tmp_path / "poisoned",
        grader=POISONED_GRADER,
        rollout=SLOW_ROLLOUT,
        rollout_runtime={"timeout_s": 2},
        rows=rows,
        hyper={"steps": 9, "save_every_n_steps": 3, "poison_after": 2},
        extra={"failure_policy": {"max_attempts": 1, "on_exhausted": "drop_sample"}},
    )
    job_id, invalid = create_job(store, job)
    assert invalid is None, invalid
    run_job(store, home, job_id)
    got = store.get_job(job_id)
    assert got is not None and got.status == "succeeded", got

    trajectories = store.trajectories(job_id, limit=1000)
    records = store.trajectory_records(job_id, [t.trajectory_id for t in trajectories])
    steps_of = {i: sorted({r.step for r in records if r.sample_index == i}) for i in range(6)}
    # 6 rows, 2 a step: each epoch is 3 steps; row 2 failed in epochs 1 and 2, then was passed over
    poisoned = steps_of[2]
    assert len(poisoned) == 2 and poisoned[0] <= 3 < poisoned[1] <= 6, steps_of
    assert all(r.status == "failed" for r in records if r.sample_index == 2)
    assert {e.cause for r in records if r.sample_index == 2 for e in r.errors} == {"500"}
    # row 5 timed out every time it came (3 epochs' worth of steps) and is never quarantined
    timed_out = [r for r in records if r.sample_index == 5]
    assert {e.cause for r in timed_out for e in r.errors} == {"Timeout"}, timed_out
    assert len(steps_of[5]) >= 3, steps_of
    # the other rows fill the batches after the quarantine: 9 steps x 2 rows
    assert sum(len(s) for s in steps_of.values()) == 18, steps_of

    train = (tmp_path / "poisoned" / "data" / "train.jsonl").resolve()
    found = quarantined_rows(store, job_id)
    assert [(q.file, q.line, q.row, q.cause, q.plugin, q.steps) for q in found] == [
        (str(train), 4, 2, "500", "exact", tuple(poisoned))
    ]
    assert found[0].trajectory_id in {r.trajectory_id for r in records if r.sample_index == 2}
    warned = [w for w in job_warnings(store, job_id) if w.startswith("Invalid data:")]
    assert len(warned) == 1 and f"{train} line 4 (row 2) is quarantined" in warned[0], warned
    metrics = store.metrics(job_id)
    assert [p.value for p in metrics["data/quarantined_rows"]][-1] == 1.0
    poison_calls = {p.step: p.value for p in metrics["data/poison_calls"]}
    assert poison_calls[poisoned[0]] == poison_calls[poisoned[1]] == 2.0  # group_size failed calls each
    assert sum(poison_calls.values()) == 4.0
    assert doctor_document(store, job_id)["quarantined_rows"] == [found[0].to_dict()]

    doctor = runner.invoke(app, ["doctor", str(job_id)])
    assert doctor.exit_code == 0, doctor.output
    assert f"{train}:4: 500 in exact on every trajectory" in doctor.output, doctor.output

    clean = tmp_path / "clean.jsonl"
    out = runner.invoke(app, ["data", "quarantine", str(job_id), "--export", str(clean)])
    assert out.exit_code == 0, out.output
    assert f"{train}:4 (row 2): 500 in exact" in out.output
    lines = train.read_text().splitlines()
    assert clean.read_text().splitlines() == lines[:3] + lines[4:]
    assert json.dumps(ROWS[2]) == lines[3]
    # never over the dataset itself, nor over a file without --force
    same = runner.invoke(app, ["data", "quarantine", str(job_id), "--export", str(train)])
    assert same.exit_code == 1 and "this is the job's training dataset" in same.output, same.output
    assert train.read_text().splitlines() == lines
    again = runner.invoke(app, ["data", "quarantine", str(job_id), "--export", str(clean)])
    assert again.exit_code == 1 and "exists; pass --force" in again.output, again.output
    export = ["data", "quarantine", str(job_id), "--export", str(clean)]
    forced = runner.invoke(app, [*export, "--force", "--json"])
    assert forced.exit_code == 0, forced.output
    doc = json.loads(forced.stdout)
    assert doc["export"]["lines_dropped"] == [4] and doc["export"]["rows"] == 5


def test_a_row_failing_on_a_dependency_never_counts_against_it(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    """A judge that answers 500 fails the job as the judge's (Dependency error); its trajectories,
    as stored, are no strike against their rows however often they come back."""
    with judge() as server:
        port = server.server_address[1]
        job = make_job(
            tmp_path / "judged",
            grader=JUDGED_GRADER.format(url=f"http://127.0.0.1:{port}/500"),
            hyper={"steps": 1, "poison_after": 1},
            extra={
                "dependencies": {"judge": {"url": f"http://127.0.0.1:{port}"}},
                "failure_policy": {
                    "max_attempts": 1,
                    "on_exhausted": "drop_sample",
                    "dependency": {"max_attempts": 1},
                },
                "retry": {"platform_delay_s": 0.5, "max_auto_retries": 0},
            },
        )
        job_id, invalid = create_job(store, job)
        assert invalid is None, invalid
        run_job(store, home, job_id)
    got = store.get_job(job_id)
    assert got is not None and got.status == "failed" and got.error is not None
    assert got.error.type == "Dependency error", got.error
    failed = store.trajectories(job_id, status="failed", limit=100)
    records = store.trajectory_records(job_id, [t.trajectory_id for t in failed])
    judged = [r for r in records if any(e.type == "Dependency error" for e in r.errors)]
    assert judged, records
    groups = [[r for r in records if r.sample_index == i] for i in {r.sample_index for r in records}]
    assert all(poison_cause(g) is None for g in groups)
    cursor = DataCursor(len(ROWS), 0)
    for step in (1, 2, 3):
        assert observe(cursor, step, groups, 1, RowSource()).warnings == []
    assert cursor.quarantined == frozenset() and cursor.strikes == {}
    assert quarantined_rows(store, job_id) == []


def test_the_circuit_breaker_says_how_many_failed_calls_poison_rows_cost(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    """The breaker trips on the step that drew the poisoned row: its error says that its failed
    calls were on a row every trajectory of which failed the same way."""
    job = make_job(
        tmp_path / "tripped",
        grader=POISONED_GRADER,
        hyper={"steps": 3, "poison_after": 2},
        extra={
            "failure_policy": {"max_attempts": 1, "on_exhausted": "drop_sample"},
            "circuit_breaker": {"max_error_share": 0.2, "min_calls": 1},
        },
    )
    job_id, invalid = create_job(store, job)
    assert invalid is None, invalid
    run_job(store, home, job_id)
    got = store.get_job(job_id)
    assert got is not None and got.status == "failed" and got.error is not None, got
    assert got.error.cause == "500", got.error
    assert (
        "2 of the failed calls were on dataset rows every trajectory of which failed the same way "
        "(poison rows" in got.error.message
    ), got.error.message
    poison = store.metrics(job_id)["data/poison_calls"]
    assert [p.value for p in poison if p.value] == [2.0]
    # one strike only: nothing quarantined, nothing to export
    listed = runner.invoke(app, ["data", "quarantine", str(job_id)])
    assert listed.exit_code == 0 and f"job {job_id} quarantined no dataset row" in listed.output
    clean = tmp_path / "clean.jsonl"
    refused = runner.invoke(app, ["data", "quarantine", str(job_id), "--export", str(clean)])
    assert refused.exit_code == 1, refused.output
    assert f"job {job_id} quarantined no dataset row: there is nothing to leave out" in refused.output
    assert not clean.exists()
