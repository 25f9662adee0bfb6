"""``plugtune replay``: a recorded trajectory re-runs here from the stored code, with the policy's
recorded answers played back, and ends as it did in the job (or the report says it does not)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.errors import InvalidDataError
from plugtune.pretest.replay import ReplayError, replay
from plugtune.runtime.snapshot import collect, content_hash
from plugtune.sdk import Runtime
from plugtune.store import Store
from plugtune.types import ErrorRecord, TrajectoryRecord
from tests.pretest.helpers import FAULTY

QUESTION = {"role": "user", "content": "What is 6+6?"}  # row 1 of the fixture's data


@pytest.fixture()
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    url = f"sqlite:///{tmp_path / 'home' / 'plugtune.db'}"  # the project is beside the home, not in it
    monkeypatch.setenv("PLUGTUNE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PLUGTUNE_DATABASE_URL", url)
    s = Store.open(url)
    yield s
    s.close()


def recorded_job(store: Store, rollout: str, grader: str) -> int:
    """A job as the attempt records it: spec, the plugins' code by hash, no model needed."""
    files = collect(FAULTY / "plugins")
    code_hash = content_hash(files)
    store.put_code(code_hash, files)
    spec = {
        "job_file": str(FAULTY / "ok.yaml"),
        "data": {"train": "data/train.jsonl"},
        "hyperparameters": {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 8},
        "plugins": {"graders": [{"entry": f"plugins/graders.py:{grader}", "weight": 1.0}]},
    }
    job_id = store.create_job("recorded", spec)
    for name, role, file in ((rollout, "rollout", "rollouts.py"), (grader, "grader", "graders.py")):
        entry = f"{FAULTY / 'plugins' / file}:{name}"
        store.upsert_plugin(job_id, name, role, entry, code_hash=code_hash, runtime=Runtime().to_dict())
    return job_id


def trajectory(
    messages: list[dict[str, str]], status: str, reward: float | None, **kw: object
) -> TrajectoryRecord:
    return TrajectoryRecord(
        trajectory_id="s3-p1-r2",
        group_id="s3-p1",
        step=3,
        sample_index=1,
        rollout_index=2,
        attempt=1,
        policy_version=3,
        prompt_ids=[],
        response_ids=[],
        response_mask=[],
        response_logprobs=[],
        messages=messages,
        status=status,
        reward=reward,
        **kw,  # type: ignore[arg-type]
    )


def test_recorded_grader_failure_reproduces(store: Store) -> None:
    job_id = recorded_job(store, "answers", "raises")
    error = ErrorRecord(
        type="Call plugin error",
        owner="plugin",
        cause="500",
        message="ValueError: grader bug: cannot score 12",
        plugin=f"{FAULTY / 'plugins' / 'graders.py'}:raises",
    )
    recorded = [QUESTION, {"role": "assistant", "content": "12"}]
    store.upsert_trajectories(job_id, [trajectory(recorded, "failed", None, errors=[error])])
    doc = replay(store, job_id, "s3-p1-r2")
    assert doc["reproduced"] and doc["verdict"] == "reproduced", doc
    assert doc["replayed"]["error"]["cause"] == "500" and "grader bug" in doc["replayed"]["error"]["message"]
    assert doc["trajectory"]["errors"][0]["traceback"].startswith("graders.py:19 in raises")


def test_policy_answers_are_played_back(store: Store) -> None:
    job_id = recorded_job(store, "asks_policy", "exact")
    recorded = [QUESTION, {"role": "assistant", "content": "12"}]
    store.upsert_trajectories(
        job_id, [trajectory(recorded, "success", 1.0, reward_components={"exact": 1.0})]
    )
    doc = replay(store, job_id, "s3-p1-r2")
    assert doc["reproduced"] and doc["replayed"]["reward"] == 1.0
    assert doc["policy_turns"] == {"recorded": 1, "played": 1} and doc["divergences"] == []
    assert doc["trajectory"]["messages"] == recorded
    assert any("policy said '12'" in line["message"] for line in doc["trajectory"]["logs"])


def test_a_different_outcome_is_reported(store: Store) -> None:
    job_id = recorded_job(store, "asks_policy", "exact")
    store.upsert_trajectories(job_id, [trajectory([QUESTION], "success", 0.0)])  # no answer recorded
    doc = replay(store, job_id, "s3-p1-r2")
    assert not doc["reproduced"] and doc["verdict"] == "ended differently"
    assert doc["replayed"]["status"] == "failed" and doc["replayed"]["error"]["cause"] == "500"
    assert "recording holds 0 assistant turn(s)" in doc["divergences"][0]


def test_a_failure_with_another_exception_failed_differently(store: Store) -> None:
    """The job's rollout raised (a tool went away); the replay's raises too, but something else."""
    job_id = recorded_job(store, "asks_policy", "exact")
    error = ErrorRecord(
        type="Call plugin error",
        owner="plugin",
        cause="500",
        message="ConnectionError: the tool server went away",
        plugin=f"{FAULTY / 'plugins' / 'rollouts.py'}:asks_policy",
    )
    store.upsert_trajectories(job_id, [trajectory([QUESTION], "failed", None, errors=[error])])
    doc = replay(store, job_id, "s3-p1-r2")
    assert not doc["reproduced"] and doc["verdict"] == "failed differently", doc
    assert (
        doc["replayed"]["error"]["cause"] == "500" and doc["replayed"]["error"]["raised"] != "ConnectionError"
    )
    text = CliRunner().invoke(app, ["replay", str(job_id), "s3-p1-r2"])
    assert text.exit_code == 1, text.output
    said = " ".join(text.output.split())  # unwrapped
    assert (
        "failed differently: recorded Call plugin error: 500 (ConnectionError) in rollouts.py:asks_policy"
        in said
    )
    assert "replay Call plugin error: 500 (" in said and "reproduced: " not in said
    assert "recorded message: ConnectionError: the tool server went away" in said
    assert f"replayed message: {doc['replayed']['error']['message']}" in said


def test_a_failure_the_replay_does_not_meet_did_not_reproduce(store: Store) -> None:
    """The job's grader timed out (a loaded machine, say); here it scores at once."""
    job_id = recorded_job(store, "answers", "exact")
    error = ErrorRecord(
        type="Call plugin error",
        owner="plugin",
        cause="Timeout",
        message="the call ran past timeout_s=60",
        plugin=f"{FAULTY / 'plugins' / 'graders.py'}:exact",
    )
    recorded = [QUESTION, {"role": "assistant", "content": "12"}]
    store.upsert_trajectories(job_id, [trajectory(recorded, "failed", None, errors=[error])])
    doc = replay(store, job_id, "s3-p1-r2")
    assert not doc["reproduced"] and doc["verdict"] == "did not reproduce", doc
    assert doc["replayed"] == {**doc["replayed"], "status": "success", "reward": 1.0, "error": None}
    text = CliRunner().invoke(app, ["replay", str(job_id), "s3-p1-r2"])
    assert text.exit_code == 1
    said = " ".join(text.output.split())
    assert (
        "did not reproduce: the job's trajectory failed (Call plugin error: Timeout in graders.py:exact)"
        in said
    )
    assert "the replay ended success (reward 1.0)" in said and "plugtune test --faas" in said


def test_the_replay_is_the_recorded_trajectory_with_its_rollout_index(store: Store) -> None:
    """The job's third rollout of row 1 (s3-p1-r2) replays as itself: the plugin's ctx, the calls,
    the log lines and the shown trajectory all carry its id and rollout index 2, not a fresh -r0."""
    job_id = recorded_job(store, "answers", "exact")
    recorded = [QUESTION, {"role": "assistant", "content": "12"}]
    store.upsert_trajectories(
        job_id, [trajectory(recorded, "success", 1.0, reward_components={"exact": 1.0})]
    )
    doc = replay(store, job_id, "s3-p1-r2")
    assert doc["reproduced"], doc
    assert doc["trajectory"]["trajectory_id"] == "s3-p1-r2"
    assert {c["trajectory_id"] for c in doc["calls"]} == {"s3-p1-r2"}
    assert any("answering sample 1 (rollout 2)" in line["message"] for line in doc["trajectory"]["logs"])
    assert {line["trajectory_id"] for line in doc["trajectory"]["logs"]} == {"s3-p1-r2"}
    text = CliRunner().invoke(app, ["replay", str(job_id), "s3-p1-r2"])
    assert text.exit_code == 0 and "s3-p1-r2" in text.output and "-r0" not in text.output, text.output


def test_an_in_process_replay_of_a_call_that_holds_the_gil_ends_as_timeout(store: Store) -> None:
    """The job's grader timed out in C code that holds the GIL (catastrophic backtracking, as
    math-verify on a huge power); in-process, the replay kills the call at its timeout_s and ends."""
    job_id = recorded_job(store, "answers", "backtracks")
    entry = f"{FAULTY / 'plugins' / 'graders.py'}:backtracks"
    code_hash = store.list_plugins(job_id)[1].code_hash
    store.upsert_plugin(  # the limits it ran with in the job
        job_id, "backtracks", "grader", entry, code_hash=code_hash, runtime=Runtime(timeout_s=0.5).to_dict()
    )
    error = ErrorRecord(
        type="Call plugin error",
        owner="plugin",
        cause="Timeout",
        message="the call ran past timeout_s=0.5",
        plugin=entry,
    )
    recorded = [QUESTION, {"role": "assistant", "content": "12"}]
    store.upsert_trajectories(job_id, [trajectory(recorded, "failed", None, errors=[error])])
    cli = "from plugtune.cli import app; app()"
    flags = ["--in-process", "--unsandboxed-as-root", "--json"]
    command = [sys.executable, "-c", cli, "replay", str(job_id), "s3-p1-r2", *flags]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)  # it hung for good before
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["verdict"] == "reproduced" and doc["replayed"]["error"]["cause"] == "Timeout", doc
    assert any("about to match" in line["message"] for line in doc["trajectory"]["logs"])


@pytest.mark.parametrize("in_process", [False, True])
def test_a_replay_gets_the_jobs_env_and_secrets(
    store: Store, monkeypatch: pytest.MonkeyPatch, in_process: bool
) -> None:
    """A judge grader reads job.yaml's env (at import) and a secret: replayed as in the job."""
    files = collect(FAULTY / "plugins")
    code_hash = content_hash(files)
    store.put_code(code_hash, files)
    spec = {
        "job_file": str(FAULTY / "judged.yaml"),
        "data": {"train": "data/train.jsonl"},
        "env": {"JUDGE_URL": "http://judge.example/v1"},
        "secrets": ["JUDGE_KEY"],
        "plugins": {"graders": [{"entry": "plugins/judged.py:judged", "weight": 1.0}]},
    }
    job_id = store.create_job("judged", spec)
    for name, role, file in (("answers", "rollout", "rollouts.py"), ("judged", "grader", "judged.py")):
        entry = f"{FAULTY / 'plugins' / file}:{name}"
        store.upsert_plugin(job_id, name, role, entry, code_hash=code_hash, runtime=Runtime().to_dict())
    recorded = [QUESTION, {"role": "assistant", "content": "12"}]
    store.upsert_trajectories(
        job_id, [trajectory(recorded, "success", 1.0, reward_components={"judged": 1.0})]
    )
    monkeypatch.delenv("JUDGE_KEY", raising=False)
    monkeypatch.delenv("JUDGE_URL", raising=False)
    with pytest.raises(ReplayError, match="secret.s. JUDGE_KEY .* not set here: export them"):
        replay(store, job_id, "s3-p1-r2", in_process=in_process, unsandboxed_as_root=True)
    monkeypatch.setenv("JUDGE_KEY", "k-123")
    doc = replay(store, job_id, "s3-p1-r2", in_process=in_process, unsandboxed_as_root=True)
    assert doc["reproduced"], doc
    said = [line["message"] for line in doc["trajectory"]["logs"]]
    assert "judge http://judge.example/v1, key k-123" in said, said
    assert "JUDGE_URL" not in os.environ


def test_missing_trajectory_is_named(store: Store) -> None:
    job_id = recorded_job(store, "answers", "exact")
    with pytest.raises(ReplayError, match="no trajectory 'nope'"):
        replay(store, job_id, "nope")


def test_cli_replay(store: Store) -> None:
    job_id = recorded_job(store, "answers", "nan")
    error = ErrorRecord(
        type="Call plugin error", owner="plugin", cause="Invalid reward", message="NaN", plugin="nan"
    )
    store.upsert_trajectories(
        job_id,
        [trajectory([QUESTION, {"role": "assistant", "content": "12"}], "failed", None, errors=[error])],
    )
    runner = CliRunner()
    text = runner.invoke(app, ["replay", str(job_id), "s3-p1-r2"])
    assert text.exit_code == 0, text.output
    assert "reproduced: the replay ends as" in text.output and "Invalid reward" in text.output
    result = runner.invoke(app, ["replay", str(job_id), "s3-p1-r2", "--json"])
    assert (
        result.exit_code == 0 and json.loads(result.stdout)["replayed"]["error"]["cause"] == "Invalid reward"
    )
    missing = runner.invoke(app, ["replay", str(job_id + 1), "x"])
    assert missing.exit_code == 2 and "no job" in missing.output


def _failed_real_job(tmp_path: Path, store: Store) -> tuple[Path, int, str]:
    """A job that really ran (attempt process, gateway, tiny model, runtime): its project, id and a
    failed trajectory."""
    project = tmp_path / "project"
    shutil.copytree(FAULTY, project)
    job = project / "job.yaml"
    job.write_text(
        "name: e2e\nmodel: builtin:tiny-chat\n"
        "hyperparameters: {steps: 1, batch_size: 1, group_size: 2, max_new_tokens: 8}\n"
        "data: {train: data/train.jsonl}\n"
        "plugins:\n  rollout: {entry: plugins/rollouts.py:asks_policy}\n"
        "  graders:\n    - {entry: plugins/graders.py:raises}\n"
        "failure_policy: {max_attempts: 1, on_exhausted: drop_sample}\n"
        "circuit_breaker: {max_error_share: 1.0, min_calls: 1000}\n"
    )
    ran = CliRunner().invoke(app, ["run", str(job)])
    assert ran.exit_code == 0, ran.output
    job_id = store.list_jobs()[0].id
    failed = store.trajectories(job_id, status="failed", limit=10)
    assert failed, "the raising grader fails every trajectory"
    return project, job_id, failed[0].trajectory_id


@pytest.mark.slow
def test_replay_of_a_real_job_run(tmp_path: Path, store: Store) -> None:
    """A job really runs; its failed trajectory replays."""
    project, job_id, trajectory_id = _failed_real_job(tmp_path, store)
    doc = replay(store, job_id, trajectory_id)
    assert doc["reproduced"] and doc["verdict"] == "reproduced", doc
    assert doc["recorded"]["error"]["raised"] == doc["replayed"]["error"]["raised"] == "ValueError"
    assert doc["policy_turns"]["played"] == doc["policy_turns"]["recorded"] == 1
    # named as the job names it (job.yaml's name, else its function), in the job and in the replay alike
    assert doc["replayed"]["error"]["plugin"] == doc["recorded"]["error"]["plugin"] == "raises", doc


@pytest.mark.slow
def test_a_replay_runs_the_code_the_job_ran_and_refuses_a_dataset_changed_since(
    tmp_path: Path, store: Store
) -> None:
    project, job_id, trajectory_id = _failed_real_job(tmp_path, store)
    (project / "plugins" / "graders.py").write_text("raise SystemExit('not the code the job ran')\n")
    doc = replay(store, job_id, trajectory_id)
    assert doc["verdict"] == "reproduced", doc  # the store's code, not the edited file
    assert doc["replayed"]["error"]["raised"] == "ValueError"
    data = project / "data" / "train.jsonl"
    data.write_text(data.read_text() + data.read_text().splitlines()[0] + "\n")
    with pytest.raises(InvalidDataError) as refused:  # its row may not be the one the job used
        replay(store, job_id, trajectory_id)
    assert str(data) in str(refused.value) and "changed since the job was submitted" in str(refused.value)
