from __future__ import annotations

import dataclasses

import pytest

from plugtune.store import NotFoundError, Store
from plugtune.types import ErrorRecord, TrajectoryRecord

STATUSES = ("success", "success", "failed", "discard")


def _record(i: int, *, reward: float | None = None, attempt: int = 1) -> TrajectoryRecord:
    status = STATUSES[i % 4]
    return TrajectoryRecord(
        trajectory_id=f"s{i // 8}-g{i // 4}-r{i % 4}",
        group_id=f"s{i // 8}-g{i // 4}",
        step=i // 8,
        sample_index=i // 4,
        rollout_index=i % 4,
        attempt=attempt,
        policy_version=i // 8,
        prompt_ids=[151644, 872, 198, i],
        response_ids=[100, 200, 2**31 - 1, i],
        response_mask=[1, 1, 0, 1],
        response_logprobs=[-0.125, -1e-9, 0.0, -3.5],
        messages=[
            {"role": "user", "content": f'what is {i} + {i}? <script>alert("x")</script>\nthanks'},
            {"role": "assistant", "content": f"answer {2 * i}" if i % 3 else "", "tool_calls": []},
        ],
        tools=[{"type": "function", "function": {"name": "calc"}}] if i % 2 else [],
        reward=(i % 5) / 4 if reward is None and status == "success" else reward,
        reward_components={"exact": 1.0, "style": None} if status == "success" else {},
        advantage=0.5 - (i % 4) / 4,
        status=status,
        stop_reason="stop",
        errors=[ErrorRecord("Call plugin error", "plugin", "Timeout", "took 5 s", plugin="judge", attempt=1)]
        if status == "failed"
        else [],
        metrics={"turns": 1.0},
        timing={"rollout_s": 0.25},
        code_hash={"solve": "r1", "exact": "g1"},
    )


@pytest.fixture
def records(store: Store, job_id: int) -> list[TrajectoryRecord]:
    written = [_record(i) for i in range(64)]
    store.upsert_trajectories(job_id, written[:40])
    store.write_batch(job_id, trajectories=written[40:])
    return written


def test_full_record_round_trips_exactly(store: Store, job_id: int, records: list[TrajectoryRecord]) -> None:
    for record in (records[0], records[2], records[63]):
        assert store.get_trajectory(job_id, record.trajectory_id) == record
    assert store.get_trajectory(job_id, "nope") is None
    assert store.get_trajectory(job_id + 1, records[0].trajectory_id) is None


def test_upsert_is_idempotent_on_trajectory_id(
    store: Store, job_id: int, records: list[TrajectoryRecord]
) -> None:
    retried = [dataclasses.replace(r, attempt=2, reward=0.75) for r in records[:16]]
    store.upsert_trajectories(job_id, retried)
    store.upsert_trajectories(job_id, retried + retried[:3])  # duplicates inside one batch too
    assert store.count_trajectories(job_id) == 64
    again = store.get_trajectory(job_id, records[5].trajectory_id)
    assert again is not None and (again.attempt, again.reward) == (2, 0.75)
    first_page_ids = {s.trajectory_id: s.id for s in store.trajectories(job_id, order="oldest", limit=16)}
    assert list(first_page_ids) == [r.trajectory_id for r in records[:16]]  # row ids kept on update


def test_summaries_have_no_tokens_and_denormalised_fields(
    store: Store, job_id: int, records: list[TrajectoryRecord]
) -> None:
    summary = store.trajectories(job_id, status="failed", limit=1)[0]
    assert summary.trajectory_id == records[62].trajectory_id
    assert (summary.prompt_tokens, summary.response_tokens, summary.error_cause) == (4, 4, "Timeout")
    assert summary.plugins == ["solve", "exact", "judge"]
    assert summary.preview == "answer 124"
    assert not hasattr(summary, "response_ids") and "messages" not in summary.to_dict()


def _ids(rows: list) -> list[str]:  # type: ignore[type-arg]
    return [r.trajectory_id for r in rows]


@pytest.mark.parametrize(
    "filters",
    [
        {},
        {"status": "failed"},
        {"step": 3},
        {"plugin": "judge"},
        {"plugin": "exact"},
        {"text": "WHAT IS 17 +"},
        {"text": '<script>alert("x")'},
        {"text": "</script>\nthanks"},
        {"min_reward": 0.5},
        {"max_reward": 0.25, "status": "success"},
        {"status": "success", "step": 2, "min_reward": 0.25, "max_reward": 0.75},
    ],
)
def test_filters_and_offset_pages_match_a_python_reference(
    store: Store, job_id: int, records: list[TrajectoryRecord], filters: dict[str, object]
) -> None:
    def keep(r: TrajectoryRecord) -> bool:
        return (
            ("status" not in filters or r.status == filters["status"])
            and ("step" not in filters or r.step == filters["step"])
            and (
                "plugin" not in filters or filters["plugin"] in {*r.code_hash, *(e.plugin for e in r.errors)}
            )
            and ("text" not in filters or str(filters["text"]).lower() in r.messages[0]["content"].lower())
            and ("min_reward" not in filters or (r.reward is not None and r.reward >= filters["min_reward"]))  # type: ignore[operator]
            and ("max_reward" not in filters or (r.reward is not None and r.reward <= filters["max_reward"]))  # type: ignore[operator]
        )

    expected = [r.trajectory_id for r in reversed(records) if keep(r)]
    assert expected
    pages = [store.trajectories(job_id, limit=5, offset=o, **filters) for o in range(0, 70, 5)]  # type: ignore[arg-type]
    assert [t for page in pages for t in _ids(page)] == expected
    assert store.count_trajectories(job_id, **filters) == len(expected)  # type: ignore[arg-type]


def test_keyset_pages_equal_offset_pages(store: Store, job_id: int, records: list[TrajectoryRecord]) -> None:
    seen: list[str] = []
    before = None
    for _ in range(20):
        page = store.trajectories(job_id, status="success", limit=7, before_id=before)
        if not page:
            break
        seen += _ids(page)
        before = page[-1].id
    assert seen == _ids(store.trajectories(job_id, status="success", limit=1000))
    assert len(seen) == 32


def test_reward_order_puts_unscored_last(store: Store, job_id: int, records: list[TrajectoryRecord]) -> None:
    worst = store.trajectories(job_id, order="reward_asc", limit=64)
    rewards = [t.reward for t in worst]
    scored = [r for r in rewards if r is not None]
    assert scored == sorted(scored) and rewards[len(scored) :] == [None] * (64 - len(scored))
    best = store.trajectories(job_id, order="reward_desc", limit=3)
    assert [t.reward for t in best] == [1.0, 1.0, 1.0]


def test_group_and_status_counts(store: Store, job_id: int, records: list[TrajectoryRecord]) -> None:
    group = store.group(job_id, "s2-g5")
    assert [r.rollout_index for r in group] == [0, 1, 2, 3]
    assert group == records[20:24]
    assert store.trajectory_status_counts(job_id) == {"success": 32, "failed": 16, "discard": 16}


def test_previous_and_next_for_full_screen_navigation(
    store: Store, job_id: int, records: list[TrajectoryRecord]
) -> None:
    page = store.trajectories(job_id, status="failed", limit=3)
    newer, current, older = page
    assert store.trajectories(job_id, status="failed", before_id=current.id, limit=1) == [older]
    assert store.trajectories(job_id, status="failed", order="oldest", after_id=current.id, limit=1) == [
        newer
    ]
    assert store.trajectories(job_id, order="oldest", after_id=newer.id, status="failed") == []


def test_neighbors_follow_the_filtered_newest_first_list(
    store: Store, job_id: int, records: list[TrajectoryRecord]
) -> None:
    failed = _ids(store.trajectories(job_id, status="failed", limit=100))
    assert store.trajectory_neighbors(job_id, failed[3], status="failed") == (failed[2], failed[4])
    assert store.trajectory_neighbors(job_id, failed[0], status="failed") == (None, failed[1])
    assert store.trajectory_neighbors(job_id, failed[-1], status="failed") == (failed[-2], None)
    everything = _ids(store.trajectories(job_id, limit=100))
    assert store.trajectory_neighbors(job_id, everything[10]) == (everything[9], everything[11])
    with pytest.raises(NotFoundError):
        store.trajectory_neighbors(job_id, "nope")


def test_capped_count(store: Store, job_id: int, records: list[TrajectoryRecord]) -> None:
    assert store.count_trajectories(job_id, cap=10) == 10
    assert store.count_trajectories(job_id, status="failed", cap=100) == 16
