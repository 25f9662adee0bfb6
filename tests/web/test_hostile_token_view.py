"""The token view's API against careless and hostile stored records (tests/security's review): a
record whose per-token lists disagree, or whose columns were damaged in the database, is a 409
naming the trajectory and what is wrong (it was a 500 with no word); another job's trajectory id
is a 404 that shows nothing of it; a 100,000-token reply is served whole."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from plugtune.jobs.control import create_job
from plugtune.store import Store
from plugtune.types import DroppedSpan, TrajectoryRecord
from plugtune.web import create_app
from tests.jobs.jobkit import make_job
from tests.web.conftest import BASE_URL

BASE = TrajectoryRecord(
    trajectory_id="t",
    group_id="g",
    step=1,
    sample_index=0,
    rollout_index=0,
    attempt=1,
    policy_version=0,
    prompt_ids=[1],
    response_ids=[5, 6, 7],
    response_mask=[1, 1, 1],
    response_logprobs=[-1.0, -1.0, -1.0],
    messages=[{"role": "user", "content": "hi"}],
    stop_reason="stop",
    trainer_logprobs=[-1.0, -2.0, -3.0],
)


def _record(tid: str, **changes: object) -> TrajectoryRecord:
    return dataclasses.replace(BASE, trajectory_id=tid, **changes)  # type: ignore[arg-type]


DISAGREEING = {
    "mask_longer": ({"response_mask": [1] * 6, "trainer_logprobs": [-2.0] * 6}, "6 loss-mask values"),
    "mask_shorter": ({"response_mask": [1]}, "1 loss-mask values"),
    "sampler_longer": ({"response_logprobs": [-1.0] * 10}, "10 sampler log-probs"),
    "trainer_shorter": ({"trainer_logprobs": [-1.0]}, "1 trainer log-probs"),
    "span_past_the_end": (
        {"dropped_spans": [DroppedSpan(at=10**9, tokens=-1, policy_tokens=5, rewrite=0)]},
        "a cut span at 1000000000",
    ),
}


def test_a_record_whose_token_lists_disagree_is_a_409_naming_them(store: Store, tmp_path: Path) -> None:
    job_id, invalid = create_job(store, make_job(tmp_path / "a"))
    assert invalid is None, invalid
    store.upsert_trajectories(job_id, [_record(tid, **c) for tid, (c, _) in DISAGREEING.items()])
    client = TestClient(create_app(store), base_url=BASE_URL, raise_server_exceptions=False)
    for tid, (_, said) in DISAGREEING.items():
        reply = client.get(f"/api/jobs/{job_id}/trajectories/{tid}/tokens")
        assert reply.status_code == 409, (tid, reply.status_code, reply.text[:300])
        detail = reply.json()["detail"]
        assert f"trajectory {tid!r} cannot be shown as tokens" in detail and "3 response tokens" in detail
        assert said in detail, detail
    store.upsert_trajectories(job_id, [_record("fine")])
    assert client.get(f"/api/jobs/{job_id}/trajectories/fine/tokens").json()["count"] == 3


DAMAGED = {
    "trainer_logprobs": ("trainer_logprobs", b"\x01\x02\x03\x04\x05", "bytes length not a multiple"),
    "spans_missing_keys": ("dropped_spans", '[{"at": 1}]', "missing 3 required"),
    "spans_not_json": ("dropped_spans", "not json", "JSONDecodeError"),
    "spans_not_a_list": ("dropped_spans", '{"a": 1}', "must be a mapping"),
    "spans_extra_key": ("dropped_spans", '[{"at":1,"tokens":2,"policy_tokens":1,"rewrite":1,"x":3}]', "'x'"),
    "ids_odd_bytes": ("response_ids", b"\x01\x02\x03", "bytes length not a multiple"),
}


def test_a_record_damaged_in_the_database_is_a_409_naming_the_column(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'plugtune.db'}"
    store = Store.open(url, retention_days=7)
    try:
        job_id, invalid = create_job(store, make_job(tmp_path / "a"))
        assert invalid is None, invalid
        store.upsert_trajectories(job_id, [_record(tid) for tid in DAMAGED])
        engine = sa.create_engine(url)
        with engine.begin() as conn:
            for tid, (column, value, _) in DAMAGED.items():
                conn.execute(
                    sa.text(f"UPDATE trajectories SET {column} = :v WHERE trajectory_id = :t"),
                    {"v": value, "t": tid},
                )
        engine.dispose()
        client = TestClient(create_app(store), base_url=BASE_URL, raise_server_exceptions=False)
        for tid, (column, _, said) in DAMAGED.items():
            api = f"/api/jobs/{job_id}/trajectories/{tid}"
            for path in (f"{api}/tokens", api):
                reply = client.get(path)
                assert reply.status_code == 409, (path, reply.status_code, reply.text[:300])
                detail = reply.json()["detail"]
                assert f"trajectory {tid!r} cannot be read back: its stored {column} is damaged" in detail
                assert said in detail, detail
    finally:
        store.close()


def test_path_params_and_a_huge_reply_held(store: Store, tmp_path: Path) -> None:
    """What held: another job's trajectory id, a missing job or trajectory, a traversal and a NUL
    in the id are refused without showing the record; 100,000 tokens come back whole."""
    mine, _ = create_job(store, make_job(tmp_path / "a"))
    other, _ = create_job(store, make_job(tmp_path / "b"))
    secret = "SECRET-of-the-other-job"
    store.upsert_trajectories(other, [_record("theirs", messages=[{"role": "user", "content": secret}])])
    n = 100_000
    store.upsert_trajectories(
        mine,
        [
            _record(
                "long",
                response_ids=[100 + i % 1000 for i in range(n)],
                response_mask=[1] * n,
                response_logprobs=[-1.0] * n,
                trainer_logprobs=[-1.5] * n,
            )
        ],
    )
    client = TestClient(create_app(store), base_url=BASE_URL, raise_server_exceptions=False)
    for path, status in (
        (f"/api/jobs/{mine}/trajectories/theirs/tokens", 404),
        (f"/api/jobs/{other + 1000}/trajectories/theirs/tokens", 404),
        (f"/api/jobs/{mine}/trajectories/..%2F{other}%2Ftrajectories%2Ftheirs/tokens", 400),
        (f"/api/jobs/{mine}/trajectories/%00/tokens", 400),
        (f"/api/jobs/{mine}/trajectories/{'x' * 600}/tokens", 422),
    ):
        reply = client.get(path)
        assert reply.status_code == status, (path, reply.status_code, reply.text[:200])
        assert secret not in reply.text
    started = time.monotonic()
    view = client.get(f"/api/jobs/{mine}/trajectories/long/tokens").json()
    assert time.monotonic() - started < 30
    assert view["count"] == n and len(view["texts"]) == n and len(view["gaps"]) == n
    assert view["mean_gap"] == pytest.approx(0.5)
