"""The SDK's decorators keep the decorated function's type for the user's type checker: a
``@grader`` function is still ``def (ctx, sample, trajectory) -> float | None`` to mypy, with or
without arguments to the decorator (they returned ``Any``, which hid every mistake after them)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mypy import api

USER_CODE = """
from plugtune import Runtime, grader, group_grader, rollout


@grader
def exact(ctx: object, sample: object, trajectory: object) -> float | None:
    return 1.0


@grader(weight=2.0, runtime=Runtime(timeout_s=5))
async def judged(ctx: object, sample: object, trajectory: object) -> float:
    return 0.5


@group_grader()
def ranked(ctx: object, sample: object, trajectories: list[object]) -> list[float | None]:
    return [1.0]


@rollout
async def agent(ctx: object, policy: object, sample: object) -> None:
    return None


reveal_type(exact)
reveal_type(judged)
reveal_type(ranked)
reveal_type(agent)
exact(1, 2, 3) + 1
"""


@pytest.mark.timeout(120)
def test_decorated_plugins_keep_their_signature_for_mypy(tmp_path: Path) -> None:
    path = tmp_path / "plugins.py"
    path.write_text(USER_CODE)
    out, err, _ = api.run([str(path), "--no-incremental", "--cache-dir", str(tmp_path / "cache")])
    revealed = [line.split("Revealed type is ", 1)[1] for line in out.splitlines() if "Revealed type" in line]
    assert revealed == [
        '"def (ctx: object, sample: object, trajectory: object) -> float | None"',
        '"def (ctx: object, sample: object, trajectory: object) -> typing.Coroutine[Any, Any, float]"',
        '"def (ctx: object, sample: object, trajectories: list[object]) -> list[float | None]"',
        '"def (ctx: object, policy: object, sample: object) -> typing.Coroutine[Any, Any, None]"',
    ], out + err
    # and a mistake after the decorator is found: float | None + int
    assert 'Unsupported operand types for + ("None" and "int")' in out, out
