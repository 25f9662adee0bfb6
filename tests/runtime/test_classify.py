"""The runtime boundary as pure functions: facts -> causes, return values -> outcomes."""

from __future__ import annotations

import math
from dataclasses import FrozenInstanceError, fields

import pytest

from plugtune.errors import HINTS, Cause, DependencyCallError, DependencyCause
from plugtune.runtime.backend import Failed, Happened
from plugtune.runtime.classify import CAUSES, InvalidReturn, classify, validate
from plugtune.runtime.faults import FaultInjection
from plugtune.runtime.protocol import (
    FrameReader,
    decode_args,
    encode_args,
    encode_result,
    encode_status,
    pack,
)
from plugtune.sdk import GraderResult, Kind, Policy, RolloutResult, Sample, Sampling, Status, Trajectory


def test_every_fact_has_exactly_one_cause() -> None:
    assert set(CAUSES) | {Happened.DEPENDENCY} == set(Happened)  # its cause travels with the fact
    assert set(CAUSES.values()) | {Cause.INVALID_REWARD} == set(Cause)  # that one comes from validate()
    error = classify(
        Failed(
            Happened.OOM_KILLED, "over memory_mb=96", traceback="t", instance_id="i3", peak_memory_mb=97.0
        ),
        plugin="g.py:score",
        call_id="c1",
        trajectory_id="t1",
        code_hash="abc",
    )
    assert (error.cause, error.instance_id, error.peak_memory_mb, error.code_hash) == (
        "FaaS OOM",
        "i3",
        97.0,
        "abc",
    )
    assert error.type == "Call plugin error" and error.owner == "plugin" and "memory_mb" in error.hint


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0.5, ("success", 0.5, "")),
        (1, ("success", 1.0, "")),
        (None, ("success", None, "")),
        (GraderResult(reward=0.25, status=Status.RETRY, reason="judge busy"), ("retry", 0.25, "judge busy")),
    ],
)
def test_grader_values(value: object, expected: tuple[str, object, str]) -> None:
    assert validate(Kind.GRADER, encode_result(value), 0) == expected


@pytest.mark.parametrize(
    "value", [math.nan, math.inf, -math.inf, True, "0.5", [1.0], {"reward": 1.0}, object()]
)
def test_invalid_rewards(value: object) -> None:
    with pytest.raises(InvalidReturn) as info:
        validate(Kind.GRADER, encode_result(value), 0)
    assert info.value.cause is Cause.INVALID_REWARD


def test_group_grader_length_and_items() -> None:
    assert validate(Kind.GROUP_GRADER, encode_result([0.0, None]), 2) == ("success", [0.0, None], "")
    for bad in ([1.0], [1.0, math.nan], 1.0):
        with pytest.raises(InvalidReturn):
            validate(Kind.GROUP_GRADER, encode_result(bad), 2)


def test_rollout_values_and_statuses() -> None:
    status, value, _ = validate(
        Kind.ROLLOUT, encode_result(RolloutResult(status=Status.DISCARD, reason="x")), 0
    )
    assert status == "discard" and value["reason"] == "x"
    assert validate(Kind.ROLLOUT, encode_status("retry", "flaky"), 0) == ("retry", None, "flaky")
    with pytest.raises(InvalidReturn) as info:
        validate(Kind.ROLLOUT, encode_result(3.0), 0)
    assert info.value.cause is Cause.ERROR_500


def test_frames_split_anywhere_reassemble() -> None:
    data = b"".join(pack(["log", i, "x" * i]) for i in range(50))
    reader = FrameReader()
    got = [m for i in range(0, len(data), 7) for m in reader.feed(data[i : i + 7])]
    assert [m[1] for m in got] == list(range(50))


def test_fault_injection_is_seeded_and_follows_rates() -> None:
    draws = [FaultInjection({"500": 0.3, "eof": 0.1}, seed=5).draw() for _ in range(1)]
    a = FaultInjection({"500": 0.3, "eof": 0.1}, seed=5)
    b = FaultInjection({"500": 0.3, "eof": 0.1}, seed=5)
    seq = [a.draw() for _ in range(2000)]
    assert seq == [b.draw() for _ in range(2000)] and draws[0] == seq[0]
    assert 0.25 < seq.count("500") / 2000 < 0.35 and 0.07 < seq.count("eof") / 2000 < 0.13
    with pytest.raises(ValueError, match="between 0 and 1"):
        FaultInjection({"oom": 1.5})


def test_arguments_survive_the_wire_exactly() -> None:
    # decode_args builds the frozen records straight from the decoded fields: every field must travel
    sample = Sample(
        messages=[{"role": "user", "content": "hi"}],
        tools=[{"type": "function", "function": {"name": "f"}}],
        extra={"answer": "42", "n": [1, 2]},
        index=7,
        sampling=Sampling(temperature=0.3, top_p=0.9, max_tokens=12),
    )
    trajectories = [
        Trajectory(
            "t1",
            [{"role": "assistant", "content": "42"}],
            tools=[{"x": 1}],
            metrics={"m": 1.5},
            extra={"e": 1},
        ),
        Trajectory("t2", []),
    ]
    policy = Policy(base_url="http://127.0.0.1:1/v1", api_key="k", model="m", timeout_s=3.0)
    cases = [
        (Kind.GRADER, (sample, trajectories[0])),
        (Kind.GROUP_GRADER, (sample, trajectories)),
        (Kind.ROLLOUT, (policy, sample)),
    ]
    for kind, args in cases:
        (message,) = FrameReader().feed(pack(["call", encode_args(kind, args)]))
        first, second = decode_args(kind, message[1])
        if kind is Kind.ROLLOUT:
            assert first.__dict__ == policy.__dict__ and second == sample
        else:
            assert first == sample and second == args[1]
    decoded = decode_args(
        Kind.GRADER, FrameReader().feed(pack([encode_args(Kind.GRADER, cases[0][1])]))[0][0]
    )
    assert {f.name for f in fields(Sample)} == set(vars(decoded[0]))
    assert {f.name for f in fields(Trajectory)} == set(vars(decoded[1]))
    assert {f.name for f in fields(Sampling)} == set(vars(decoded[0].sampling))
    assert hash(decoded[0].sampling) == hash(sample.sampling)
    with pytest.raises(FrozenInstanceError):
        decoded[1].trajectory_id = "changed"  # type: ignore[misc]


@pytest.mark.parametrize("cause", list(DependencyCause))
def test_a_dependency_fact_is_a_dependency_error_owned_by_the_dependency(cause: DependencyCause) -> None:
    error = classify(
        Failed(Happened.DEPENDENCY, "the dependency judge (h:1) ...", cause=f"{cause.value}/judge"),
        plugin="g.py:score",
        call_id="c1",
        trajectory_id="t1",
        code_hash="abc",
    )
    assert isinstance(error, DependencyCallError)
    assert (error.type, error.owner, error.cause, error.dependency) == (
        "Dependency error",
        "dependency",
        cause.value,
        "judge",
    )
    assert error.hint == HINTS[cause]
    record = error.record()
    assert (record.type, record.owner, record.cause) == ("Dependency error", "dependency", cause.value)
