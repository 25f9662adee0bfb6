from __future__ import annotations

import pytest

from plugtune import Runtime, grader, group_grader, rollout
from plugtune.errors import Cause, PluginCallError
from plugtune.sdk import Kind, spec_of
from plugtune.sdk.context import Context
from plugtune.sdk.records import Trajectory


def test_decorators_attach_spec_and_keep_function() -> None:
    @rollout(runtime=Runtime(memory_mb=256, timeout_s=5))
    async def solve(ctx, policy, sample):  # type: ignore[no-untyped-def]
        return None

    @grader(weight=0.5)
    def exact(ctx, sample, trajectory):  # type: ignore[no-untyped-def]
        return 1.0

    spec = spec_of(solve)
    assert spec is not None and spec.kind is Kind.ROLLOUT and spec.is_async
    assert spec.runtime.memory_mb == 256
    graded = spec_of(exact)
    assert graded is not None and graded.weight == 0.5 and not graded.is_async
    assert exact(None, None, None) == 1.0


def test_wrong_signature_names_function_and_expected_form() -> None:
    with pytest.raises(TypeError, match=r"@grader bad: .*def bad\(ctx, sample, trajectory\)"):

        @grader
        def bad(ctx):  # type: ignore[no-untyped-def]
            return 0.0

    with pytest.raises(TypeError, match="required keyword-only"):

        @group_grader
        def kw(ctx, sample, trajectories, *, must):  # type: ignore[no-untyped-def]
            return []


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"memory_mb": -1}, "memory_mb=-1 is outside"),
        ({"timeout_s": 10**9}, "timeout_s"),
        ({"max_concurrency": 1.5}, "whole number"),
        ({"min_instances": 5, "max_instances": 2}, "larger than max_instances"),
        ({"memory_mb": "big"}, "must be a number"),
    ],
)
def test_runtime_rejects_absurd_limits(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Runtime(**kwargs)  # type: ignore[arg-type]


def test_runtime_replace_overrides_and_rejects_unknown() -> None:
    assert Runtime().replace(timeout_s=3).timeout_s == 3
    with pytest.raises(ValueError, match="unknown Runtime field"):
        Runtime().replace(timeout=3)


def test_grader_weight_must_be_positive() -> None:
    with pytest.raises(ValueError, match="weight must be a number > 0"):
        grader(weight=0)


def test_context_metric_and_trajectory_completion() -> None:
    ctx = Context()
    ctx.metric("turns", 2)
    assert ctx.metrics == {"turns": 2.0}
    with pytest.raises(TypeError):
        ctx.metric("turns", "two")  # type: ignore[arg-type]
    traj = Trajectory("t1", [{"role": "user", "content": "q"}, {"role": "assistant", "content": "42"}])
    assert traj.completion == "42"


def test_plugin_call_error_carries_taxonomy_fields() -> None:
    err = PluginCallError(Cause.TIMEOUT, "call exceeded 1.0 s", plugin="g.py:f", call_id="c1")
    data = err.to_dict()
    assert data["type"] == "Call plugin error"
    assert data["owner"] == "plugin"
    assert data["cause"] == "Timeout"
    assert "timeout_s" in data["hint"]
