"""The trajectory draft: each rule for how a plugin's verdict changes a trajectory, and its record
(the rules plugtune's trainer, TRL and verl share)."""

from __future__ import annotations

from typing import Any

from plugtune.errors import Cause, PluginCallError
from plugtune.sdk import Sample
from plugtune.trainer.draft import (
    GroupRule,
    TrajectoryDraft,
    groups_dropped_by_rule,
    settle_group,
    share_discard,
)
from plugtune.types import CallOutcome, TokenTrace

PROMPT = [{"role": "user", "content": "1+1=?"}]
ANSWER = [*PROMPT, {"role": "assistant", "content": "2"}]
WEIGHTS = {"exact": 1.0, "style": 0.5}


def draft(i: int = 0, **fields: Any) -> TrajectoryDraft:
    return TrajectoryDraft(
        f"s1-p0-r{i}", Sample(messages=PROMPT, index=7), group_id="s1-p0", rollout_index=i, **fields
    )


def outcome(status: str = "success", value: Any = None, reason: str = "", **metrics: float) -> CallOutcome:
    return CallOutcome(status=status, value=value, reason=reason, metrics=dict(metrics), call_id="c1")


def trace(messages: list[dict[str, Any]]) -> TokenTrace:
    return TokenTrace([1, 2], [3, 4], [1, 0], [-0.5, 0.0], messages, finish_reason="stop")


def record(d: TrajectoryDraft, **extra: Any) -> Any:
    return d.record(step=1, policy_version=0, weights=WEIGHTS, **extra)


def test_a_rollout_s_messages_are_what_it_returned_else_what_the_policy_saw_else_the_prompt() -> None:
    returned, seen, neither = draft(), draft(trace=trace(ANSWER)), draft()
    returned.rolled_out(
        outcome(value={"messages": ANSWER, "metrics": {"turns": 2.0}}, tool_calls=1.0), "solve"
    )
    seen.rolled_out(outcome(), "solve")
    neither.rolled_out(outcome(), "solve")
    assert (returned.messages, seen.messages, neither.messages) == (ANSWER, ANSWER, PROMPT)
    assert returned.metrics == {"tool_calls": 1.0, "turns": 2.0} and returned.status == "success"


def test_a_call_that_raised_fails_the_trajectory_with_its_classified_error_at_its_try() -> None:
    d = draft(attempt=2, trace=trace(ANSWER))
    d.rollout_failed(PluginCallError(Cause.ERROR_500, "ValueError: boom", plugin="solve", call_id="c9"))
    assert d.status == "failed" and d.messages == ANSWER  # what the policy saw stays as evidence
    [error] = d.errors
    assert (error.cause, error.plugin, error.attempt, error.trajectory_id) == ("500", "solve", 2, "s1-p0-r0")
    r = record(d)
    assert r.status == "failed" and r.reward is None and r.attempt == 2 and r.errors == [error]


def test_status_failure_and_retry_fail_it_with_the_plugin_s_own_verdict() -> None:
    for status, cause in (("failure", "Status failure"), ("retry", "Status retry")):
        d = draft()
        d.graded("exact", outcome(status, 1.0, "no answer"), 1.0)
        [error] = d.errors
        assert d.status == "failed" and (error.cause, error.plugin, error.call_id) == (cause, "exact", "c1")
        assert "no answer" in error.message and error.attempt == 1
        assert d.components == {} and record(d).reward is None  # a failed grade is no component


def test_a_verdict_already_kept_for_a_retried_try_is_not_recorded_twice() -> None:
    d = draft()
    d.apply(outcome("retry", reason="busy"), "exact", kept=True)
    d.call_failed(PluginCallError(Cause.TIMEOUT, "slow", plugin="exact"), kept=True)
    assert d.status == "failed" and d.errors == []


def test_status_discard_drops_it_with_the_first_plugin_s_reason_and_keeps_no_grade() -> None:
    d = draft()
    d.graded("exact", outcome(value=1.0), 1.0)
    d.graded("style", outcome("discard", reason="ambiguous"), None)
    d.apply(outcome("discard", reason="later"), "judge")
    r = record(d)
    assert (r.status, r.reward, r.reward_components) == ("discard", None, {})
    assert r.discard_reason == "style discarded it (Status.DISCARD): ambiguous"


def test_a_discard_outranks_a_failure_whichever_came_first() -> None:
    first_failed, first_discarded = draft(), draft()
    first_failed.apply(outcome("failure"), "exact")
    first_failed.apply(outcome("discard"), "style")
    first_discarded.apply(outcome("discard"), "style")
    first_discarded.apply(outcome("failure"), "exact")
    for d in (first_failed, first_discarded):
        assert d.status == "discard" and len(d.errors) == 1  # the failure's error stays


def test_grades_are_weighted_none_is_unscorable_and_grader_metrics_stay_whatever_the_verdict() -> None:
    scored, unscorable = draft(), draft()
    scored.graded("exact", outcome(value=1.0, latency_ms=3.0), 1.0)
    scored.graded("style", outcome(value=0.5), 0.5)
    unscorable.graded("exact", outcome(value=None), None)
    unscorable.graded("style", outcome("failure", lenient=1.0), 0.2)
    assert record(scored).reward == 1.25 and record(scored).reward_components == {"exact": 1.0, "style": 0.5}
    r = record(unscorable)
    assert r.status == "failed" and r.reward_components == {"exact": None}
    assert r.metrics == {"style/lenient": 1.0}
    only_none = draft()
    only_none.graded("exact", outcome(value=None), None)
    assert (record(only_none).status, record(only_none).reward) == ("success", None)  # never 0


def test_the_record_carries_the_tokens_ids_and_metrics_in_order() -> None:
    d = draft(i=3, trace=trace(ANSWER), phase="eval")
    d.rolled_out(outcome(turns=1.0), "solve")
    d.graded("exact", outcome(value=1.0, seen=2.0), 1.0)
    r = record(d, extra_metrics={"history/rewrites": 0.0}, code_hash={"solve": "abc"})
    assert (r.trajectory_id, r.group_id, r.rollout_index, r.sample_index, r.attempt) == (
        "s1-p0-r3",
        "s1-p0",
        3,
        7,
        1,
    )
    assert (r.prompt_ids, r.response_ids, r.response_mask, r.response_logprobs) == (
        [1, 2],
        [3, 4],
        [1, 0],
        [-0.5, 0.0],
    )
    assert (r.stop_reason, r.phase, r.code_hash, r.discard_reason) == ("stop", "eval", {"solve": "abc"}, "")
    assert list(r.metrics) == ["turns", "history/rewrites", "exact/seen"]


def test_a_discard_drops_the_whole_group_each_naming_the_one_discarded() -> None:
    group = [draft(i) for i in range(3)]
    assert not share_discard(group)
    group[1].apply(outcome("discard", reason="sandbox down"), "solve")
    group[2].apply(outcome("failure"), "exact")
    assert share_discard(group)
    assert [d.status for d in group] == ["discard"] * 3
    assert group[1].discard_reason == "solve discarded it (Status.DISCARD): sandbox down"
    assert group[0].discard_reason == f"its group was discarded: s1-p0-r1: {group[1].discard_reason}"


def scored_group(*values: float | None) -> list[TrajectoryDraft]:
    group = [draft(i) for i in range(len(values))]
    for d, v in zip(group, values, strict=True):
        d.graded("exact", outcome(value=v), v)
    return group


def test_the_group_rule_drops_a_failed_trajectory_alone_or_its_whole_group() -> None:
    alone, whole = scored_group(1.0, 0.0, 1.0), scored_group(1.0, 0.0, 1.0)
    for group, rule in ((alone, GroupRule()), (whole, GroupRule(drop="group"))):
        group[0].apply(outcome("failure"), "exact")
        settle_group(group, rule)
    assert [d.status for d in alone] == ["failed", "success", "success"]
    assert [d.status for d in whole] == ["failed", "discard", "discard"]  # the failed one stays failed
    why = "its group was dropped by failure_policy.group: 1 of its 3 trajectories failed (drop: group)"
    assert [d.discard_reason for d in whole] == ["", why, why]
    assert groups_dropped_by_rule([record(d) for d in [*alone, *whole]]) == 1


def test_the_group_rule_keeps_a_group_only_with_min_scored_scored_trajectories() -> None:
    kept, dropped = scored_group(None, 0.0, 1.0), scored_group(None, 0.0, 1.0)
    assert not GroupRule(min_scored=2).apply(kept) and {d.status for d in kept} == {"success"}
    assert GroupRule(min_scored=3).apply(dropped) and {d.status for d in dropped} == {"discard"}
    assert dropped[0].discard_reason.endswith("2 of its 3 trajectories scored, fewer than min_scored 3")


def test_a_plugin_s_discard_settles_a_group_before_the_rule() -> None:
    group = scored_group(1.0, 0.0)
    group[1].apply(outcome("discard", reason="off topic"), "exact")
    settle_group(group, GroupRule(min_scored=2))
    assert group[0].discard_reason.startswith("its group was discarded: s1-p0-r1")
    assert groups_dropped_by_rule([record(d) for d in group]) == 0
