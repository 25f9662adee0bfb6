"""``shape=`` adapters: a TRL or verl reward function called as plugtune calls a grader, the row
mapped as its framework maps a dataset row (issue 29 item 1)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from plugtune import grader, group_grader
from plugtune.sdk import Context, Sample, Trajectory

SAMPLE = Sample(
    messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}],
    extra={
        "answer": "4",
        "data_source": "arith",
        "reward_model": {"ground_truth": "4"},
        "extra_info": {"i": 7},
    },
)
TRAJECTORIES = [
    Trajectory(trajectory_id=f"t{i}", messages=[{"role": "assistant", "content": text}])
    for i, text in enumerate(["4", "five"])
]
seen: dict[str, Any] = {}


@group_grader(shape="trl")
def chat_reward(prompts, completions, answer, trainer_state, **kwargs):
    seen.update(prompts=prompts, completions=completions, answer=answer, step=trainer_state.global_step)
    seen["kwargs"] = sorted(kwargs)
    return [float(c[0]["content"] == a) for c, a in zip(completions, answer, strict=True)]


@grader(shape="trl-text")
def text_reward(completions, answer):  # no **kwargs: only what it names is passed
    return [float(c == a) for c, a in zip(completions, answer, strict=True)]


@group_grader(shape="trl")
async def async_reward(completions, **kwargs):
    await asyncio.sleep(0)
    return [len(c[0]["content"]) for c in completions]


@grader(shape="verl")
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": float(solution_str == ground_truth), "length": len(solution_str), "note": "ignored"}


def test_a_trl_group_grader_gets_the_group_as_one_conversational_batch_with_columns_as_lists() -> None:
    ctx = Context(step=3)
    assert chat_reward(ctx, SAMPLE, TRAJECTORIES) == [1.0, 0.0]
    assert seen["prompts"] == [SAMPLE.messages, SAMPLE.messages]
    assert seen["completions"] == [
        [{"role": "assistant", "content": "4"}],
        [{"role": "assistant", "content": "five"}],
    ]
    assert seen["answer"] == ["4", "4"] and seen["step"] == 3
    assert seen["kwargs"] == ["data_source", "extra_info", "reward_model"]  # every other column, as lists


def test_a_trl_text_grader_gets_strings_one_completion_at_a_time() -> None:
    assert text_reward(Context(), SAMPLE, TRAJECTORIES[0]) == 1.0
    assert text_reward(Context(), SAMPLE, TRAJECTORIES[1]) == 0.0
    assert text_reward(completions=["4"], answer=["4"]) == [1.0]  # still callable as TRL calls it


def test_an_async_trl_reward_function_stays_async() -> None:
    assert asyncio.run(async_reward(Context(), SAMPLE, TRAJECTORIES)) == [1, 4]


def test_a_verl_score_dict_gives_the_score_and_its_numbers_as_metrics() -> None:
    ctx = Context()
    assert compute_score(ctx, SAMPLE, TRAJECTORIES[0]) == 1.0
    assert ctx.metrics == {"length": 1.0}
    assert compute_score("arith", "4", "4") == {"score": 1.0, "length": 1, "note": "ignored"}


def test_a_row_without_ground_truth_says_where_to_put_it() -> None:
    bare = Sample(messages=SAMPLE.messages, extra={"data_source": "arith"})
    with pytest.raises(KeyError, match='"extra": {"ground_truth": ...}'):
        compute_score(Context(), bare, TRAJECTORIES[0])


def test_a_trl_function_returning_the_wrong_number_of_rewards_is_named() -> None:
    @group_grader(shape="trl")
    def one_short(completions, **kwargs):
        return [1.0]

    with pytest.raises(
        TypeError, match=r"one_short \(shape 'trl'\) must return one reward per completion \(2\)"
    ):
        one_short(Context(), SAMPLE, TRAJECTORIES)


def test_shapes_that_cannot_work_are_refused_at_decoration() -> None:
    with pytest.raises(ValueError, match="shape='openrlhf'"):
        grader(shape="openrlhf")
    with pytest.raises(TypeError, match="use @grader\\(shape='verl'\\)"):

        @group_grader(shape="verl")
        def score(data_source, solution_str, ground_truth):
            return 0.0

    with pytest.raises(TypeError, match="takes `completions`"):

        @grader(shape="trl")
        def reward(prompts, answer):
            return [0.0]
