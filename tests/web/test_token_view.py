"""The token view's API (issue 27, item 4): a real job's trajectories as tokens, with the trainer's
log-probs it stored beside the sampler's, and constructed records (both stores) for what a small
job does not produce: history rewrites, hostile token text, no trainer log-probs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from transformers import AutoTokenizer

from plugtune.demo import MODEL_DIR
from plugtune.jobs.control import create_job
from plugtune.jobs.scheduler import run_job
from plugtune.settings import Settings
from plugtune.store import Store
from plugtune.types import DroppedSpan, TrajectoryRecord
from plugtune.web import create_app
from tests.jobs.jobkit import make_job
from tests.web.conftest import BASE_URL

HOSTILE = "<script>alert(1)</script><img src=x onerror=alert(1)>"


def test_a_real_jobs_trajectories_as_tokens(tmp_path: Path, home: Settings) -> None:
    store = Store.open(home.database_url)
    try:
        job_id, invalid = create_job(store, make_job(tmp_path / "tokens"))
        assert invalid is None, invalid
        assert run_job(store, home, job_id) == "succeeded"
        client = TestClient(create_app(store), base_url=BASE_URL)
        tokenizer = AutoTokenizer.from_pretrained(str(MODEL_DIR), local_files_only=True)
        records = store.trajectory_records(job_id, [t.trajectory_id for t in store.trajectories(job_id)])
        scored = [r for r in records if r.trainer_logprobs]
        assert scored, "the trainer stored no log-probs"
        assert any(r.stop_reason == "length" for r in records)  # max_new_tokens 4 cuts replies
        for record in records:
            got = client.get(f"/api/jobs/{job_id}/trajectories/{record.trajectory_id}/tokens")
            assert got.status_code == 200, got.text
            view = got.json()
            n = len(record.response_ids)
            assert view["count"] == n and view["ids"] == record.response_ids
            assert view["texts"] == [tokenizer.decode([i]) for i in record.response_ids]
            assert view["mask"] == record.response_mask
            assert view["policy_tokens"] + view["environment_tokens"] == n
            policy = [i for i in range(n) if record.response_mask[i]]
            assert [view["sampler_logprobs"][i] for i in policy] == [
                record.response_logprobs[i] for i in policy
            ]
            assert all(view["sampler_logprobs"][i] is None for i in range(n) if i not in policy)
            assert view["max_new_tokens"] == 4
            assert view["truncated_at"] == (n if record.stop_reason == "length" else None)
            if not record.trainer_logprobs:
                assert view["trainer_logprobs"] is None and view["largest_gaps"] == []
                continue
            assert len(record.trainer_logprobs) == n
            gaps = [abs(record.trainer_logprobs[i] - record.response_logprobs[i]) for i in policy]
            assert [view["gaps"][i] for i in policy] == pytest.approx(gaps)
            assert view["mean_gap"] == pytest.approx(sum(gaps) / len(gaps))
            largest = view["largest_gaps"][0]
            assert largest["gap"] == pytest.approx(max(gaps)) and record.response_mask[largest["index"]] == 1
        # the stored per-token values are the ones the step's logprob_gap averaged (over its tokens)
        steps = store.metrics(job_id, names=["logprob_gap"])["logprob_gap"]
        assert len(steps) == 2
        for point in steps:
            mine = [r for r in scored if r.step == point.step]
            gaps = [
                abs(t - s)
                for r in mine
                for m, s, t in zip(r.response_mask, r.response_logprobs, r.trainer_logprobs, strict=True)
                if m
            ]
            assert point.value == pytest.approx(sum(gaps) / len(gaps), rel=1e-5, abs=1e-7)
        missing = client.get(f"/api/jobs/{job_id}/trajectories/nope/tokens")
        assert missing.status_code == 404 and "has no trajectory 'nope'" in missing.json()["detail"]
        assert client.get("/api/jobs/999/trajectories/x/tokens").status_code == 404
    finally:
        store.close()


# A second turn whose history edits the policy's answer (a history rewrite), sampled with top_p 0.5
# (off-policy for the trainer, which scores the full distribution): both warnings fire.
EDITING_ROLLOUT = """
from plugtune import rollout

@rollout
def answer(ctx, policy, sample):
    seed = 1000 * ctx.step + 10 * sample.index + 2 * ctx.rollout_index
    first = policy.chat(sample.messages, seed=seed)
    edited = {"role": "assistant", "content": "I think " + policy.content(first)}
    policy.chat([*sample.messages, edited, {"role": "user", "content": "Sure?"}], seed=seed + 1)
    return None
"""


def test_the_gap_and_rewrite_warnings_link_the_token_view(tmp_path: Path, home: Settings) -> None:
    store = Store.open(home.database_url)
    try:
        job_file = make_job(
            tmp_path / "warn", rollout=EDITING_ROLLOUT, hyper={"top_p": 0.5, "max_new_tokens": 3}
        )
        job_id, invalid = create_job(store, job_file)
        assert invalid is None, invalid
        assert run_job(store, home, job_id) == "succeeded"
        client = TestClient(create_app(store), base_url=BASE_URL)
        page = client.get(f"/jobs/{job_id}").text
        records = {
            r.trajectory_id: r
            for r in store.trajectory_records(job_id, [t.trajectory_id for t in store.trajectories(job_id)])
        }
        # the gap warning's first example is the trajectory of its step the trainer scored furthest
        [gap_line] = [line for line in page.splitlines() if "logprob_gap is" in line]
        step = int(gap_line.split("step ", 1)[1].split(":", 1)[0])

        def mean_gap(tid: str) -> float:
            r = records[tid]
            pairs = zip(r.response_mask, r.response_logprobs, r.trainer_logprobs, strict=True)
            gaps = [abs(t - s) for m, s, t in pairs if m]
            return sum(gaps) / len(gaps)

        furthest = max(
            (r for r in records.values() if r.step == step and r.trainer_logprobs),
            key=lambda r: mean_gap(r.trajectory_id),
        )
        assert f'href="/jobs/{job_id}/trajectories?t={furthest.trajectory_id}&amp;view=tokens"' in page
        # the rewrite warning's examples link the view too, and each shows where its history was cut
        rewritten = [tid for tid in records if f"?t={tid}&amp;view=tokens" in page]
        assert rewritten and furthest.trajectory_id in rewritten
        for tid in rewritten:
            view = client.get(f"/api/jobs/{job_id}/trajectories/{tid}/tokens").json()
            record = records[tid]
            assert view["dropped_spans"], tid
            dropped = sum(d["policy_tokens"] for d in view["dropped_spans"])
            assert dropped == record.metrics["history/dropped_policy_tokens"] >= 1
            assert all(0 <= d["at"] <= view["count"] for d in view["dropped_spans"])
            assert view["mean_gap"] == pytest.approx(mean_gap(tid))
    finally:
        store.close()


def test_rewrites_truncation_and_hostile_text_in_both_stores(store: Store, tmp_path: Path) -> None:
    job_id, invalid = create_job(store, make_job(tmp_path / "built"))
    assert invalid is None, invalid
    tokenizer = AutoTokenizer.from_pretrained(str(MODEL_DIR), local_files_only=True)
    hostile = tokenizer.encode(HOSTILE, add_special_tokens=False)
    ids = [*hostile, 5, 6, 7]
    mask = [0] * len(hostile) + [1, 1, 1]
    record = TrajectoryRecord(
        trajectory_id="built-r0",
        group_id="built",
        step=1,
        sample_index=0,
        rollout_index=0,
        attempt=1,
        policy_version=0,
        prompt_ids=[1, 2],
        response_ids=ids,
        response_mask=mask,
        response_logprobs=[0.0] * len(hostile) + [-0.5, -1.0, -2.0],
        messages=[{"role": "user", "content": "hi"}],
        stop_reason="length",
        trainer_logprobs=[0.0] * len(hostile) + [-0.5, -4.0, -2.01],
        dropped_spans=[DroppedSpan(at=len(hostile), tokens=9, policy_tokens=6, rewrite=1)],
    )
    store.upsert_trajectories(
        job_id, [record, dataclasses.replace(record, trajectory_id="plain", trainer_logprobs=[])]
    )
    client = TestClient(create_app(store), base_url=BASE_URL)
    view = client.get(f"/api/jobs/{job_id}/trajectories/built-r0/tokens").json()
    assert "".join(view["texts"][: len(hostile)]) == HOSTILE  # raw text: the page escapes it
    assert view["trainer_logprobs"][-3:] == [-0.5, -4.0, -2.01]
    assert [(g["index"], round(g["gap"], 6)) for g in view["largest_gaps"]] == [
        (len(hostile) + 1, 3.0),
        (len(hostile) + 2, 0.01),
        (len(hostile), 0.0),
    ]
    assert view["dropped_spans"] == [{"at": len(hostile), "tokens": 9, "policy_tokens": 6, "rewrite": 1}]
    assert view["truncated_at"] == len(ids) and view["stop_reason"] == "length"
    assert view["tokenizer"].startswith("decoded one token at a time by the tokenizer in ")
    plain = client.get(f"/api/jobs/{job_id}/trajectories/plain/tokens").json()
    assert plain["trainer_logprobs"] is None and plain["largest_gaps"] == [] and plain["mean_gap"] is None
    assert set(plain["gaps"]) == {None}
