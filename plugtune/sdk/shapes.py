"""Reward functions written for TRL or verl, used as plugtune graders unchanged.

``@grader(shape=...)`` / ``@group_grader(shape=...)`` wrap such a function in an adapter that
plugtune calls as ``(ctx, sample, trajectory)`` or ``(ctx, sample, trajectories)`` and that maps
the row the way the framework maps its dataset:

- ``"trl"``: ``fn(prompts=..., completions=..., trainer_state=..., **columns)`` returning one reward
  per completion (``None``: unscorable), as TRL's GRPOTrainer calls a reward function on a
  conversational dataset (plugtune's rows are chat messages): ``prompts`` holds each completion's
  prompt messages, ``completions`` each completion as ``[{"role": "assistant", "content": ...}]``,
  and every field of the row's ``extra`` is a keyword argument with one value per completion.
  ``trainer_state`` has ``global_step`` (the plugtune step). Under ``@group_grader`` a group's
  completions are one call (a batch, as TRL makes them); under ``@grader`` each is a batch of one.
- ``"trl-text"``: the same for a function written for TRL's standard (text) format: ``prompts``
  are the prompt's last user message as text, ``completions`` plain strings.
- ``"verl"``: ``fn(data_source, solution_str, ground_truth, extra_info)`` returning a number, or a
  dict with ``"score"`` (its other numbers become ``ctx.metric``\\ s), as verl's reward manager calls
  ``compute_score``: ``data_source`` and ``extra_info`` from the row's ``extra``, ``ground_truth``
  from ``extra["ground_truth"]`` or verl's ``extra["reward_model"]["ground_truth"]``,
  ``solution_str`` the completion. Per trajectory (``@grader`` only).

Only the parameters the function names are passed, unless it takes ``**kwargs`` (then all are,
as the framework does). The adapter still calls the function as its framework does when called
without a plugtune ``Context`` first, so the same module keeps working there.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

from plugtune.sdk.context import Context
from plugtune.sdk.records import Sample, Trajectory

SHAPES = ("trl", "trl-text", "verl")  # None: plugtune's own shape
#: The row fields TRL does not pass as columns (plugtune's own keys of a row).
NOT_COLUMNS = ("prompts", "completions", "completion_ids", "trainer_state")


def shape_problems(fn: Callable[..., Any], shape: str, group: bool) -> list[str]:
    """What keeps ``fn`` from being called in ``shape`` ([] when it can be)."""
    if shape not in SHAPES:
        return [f"shape={shape!r}: use one of {', '.join(repr(s) for s in SHAPES)}"]
    if shape == "verl" and group:
        return ["shape='verl' scores one trajectory at a time (compute_score): use @grader(shape='verl')"]
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError) as exc:
        return [f"cannot read the signature: {exc}"]
    names = set(params)
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    if shape.startswith("trl") and "completions" not in names and not takes_kwargs:
        return [f"a TRL reward function takes `completions` (def {fn.__name__}(completions, **kwargs))"]
    if shape == "verl":
        positional = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(positional) < 3 and not any(p.kind is p.VAR_POSITIONAL for p in params.values()):
            return [
                f"a verl compute_score takes (data_source, solution_str, ground_truth, extra_info=None); "
                f"{fn.__name__} takes {len(positional)} positional argument(s)"
            ]
    return []


def adapt(fn: Callable[..., Any], shape: str, group: bool) -> Callable[..., Any]:
    """The plugtune-shaped adapter of ``fn`` (check :func:`shape_problems` first)."""
    if shape == "verl":
        call: Callable[..., Any] = _call_verl
    elif group:
        call = _call_trl_group
    else:
        call = _call_trl_one
    text = shape == "trl-text"

    # plugtune reads the adapter's own signature (not the wrapped function's, which it follows)
    third = "trajectories" if group else "trajectory"
    own = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in ("ctx", "sample", third)]
    )
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def adapter_async(*args: Any, **kwargs: Any) -> Any:
            if not (args and isinstance(args[0], Context)):
                return await fn(*args, **kwargs)  # called as its framework calls it
            ctx, sample, what = args
            pending = call(fn, ctx, sample, what, text)
            return _finish(await pending["result"], pending, ctx)

        adapter_async.__signature__ = own  # type: ignore[attr-defined]
        return adapter_async

    @functools.wraps(fn)
    def adapter(*args: Any, **kwargs: Any) -> Any:
        if not (args and isinstance(args[0], Context)):
            return fn(*args, **kwargs)  # called as its framework calls it
        ctx, sample, what = args
        pending = call(fn, ctx, sample, what, text)
        return _finish(pending["result"], pending, ctx)

    adapter.__signature__ = own  # type: ignore[attr-defined]
    return adapter


def _finish(result: Any, pending: dict[str, Any], ctx: Context) -> Any:
    return pending["finish"](result, ctx)


def _passed(fn: Callable[..., Any], offered: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments ``fn`` takes of ``offered`` (all of them with ``**kwargs``)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return offered
    return {k: v for k, v in offered.items() if k in params}


def _trl_kwargs(
    ctx: Context, sample: Sample, trajectories: Sequence[Trajectory], text: bool
) -> dict[str, Any]:
    n = len(trajectories)
    if text:
        users = [m for m in sample.messages if m.get("role") == "user"]
        prompt: Any = str(users[-1].get("content") or "") if users else ""
        completions: list[Any] = [t.completion for t in trajectories]
    else:
        prompt = sample.messages
        completions = [[{"role": "assistant", "content": t.completion}] for t in trajectories]
    columns = {k: [v] * n for k, v in sample.extra.items() if k not in NOT_COLUMNS}
    state = SimpleNamespace(global_step=ctx.step)
    return {"prompts": [prompt] * n, "completions": completions, "trainer_state": state, **columns}


def _call_trl_group(
    fn: Callable[..., Any], ctx: Context, sample: Sample, trajectories: Sequence[Trajectory], text: bool
) -> dict[str, Any]:
    result = fn(**_passed(fn, _trl_kwargs(ctx, sample, trajectories, text)))
    return {"result": result, "finish": lambda value, _ctx: _rewards(value, len(trajectories), fn)}


def _call_trl_one(
    fn: Callable[..., Any], ctx: Context, sample: Sample, trajectory: Trajectory, text: bool
) -> dict[str, Any]:
    result = fn(**_passed(fn, _trl_kwargs(ctx, sample, [trajectory], text)))
    return {"result": result, "finish": lambda value, _ctx: _rewards(value, 1, fn)[0]}


def _rewards(value: Any, n: int, fn: Callable[..., Any]) -> list[Any]:
    if not isinstance(value, (list, tuple)) or len(value) != n:
        got = f"a list of {len(value)}" if isinstance(value, (list, tuple)) else type(value).__name__
        raise TypeError(f"{fn.__name__} (shape 'trl') must return one reward per completion ({n}); got {got}")
    return list(value)


def _call_verl(
    fn: Callable[..., Any], ctx: Context, sample: Sample, trajectory: Trajectory, text: bool
) -> dict[str, Any]:
    extra = sample.extra
    model = extra.get("reward_model")
    if "ground_truth" in extra:
        truth = extra["ground_truth"]
    elif isinstance(model, dict) and "ground_truth" in model:
        truth = model["ground_truth"]
    else:
        raise KeyError(
            f"{fn.__name__} (shape 'verl') needs the row's ground truth: give the row "
            '"extra": {"ground_truth": ...} (or verl\'s "reward_model": {"ground_truth": ...})'
        )
    args = (extra.get("data_source"), trajectory.completion, truth)
    params = inspect.signature(fn).parameters
    takes_info = "extra_info" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
    result = fn(*args, extra_info=extra.get("extra_info")) if takes_info else fn(*args)
    return {"result": result, "finish": lambda value, c: _verl_score(value, c, fn)}


def _verl_score(value: Any, ctx: Context, fn: Callable[..., Any]) -> Any:
    if isinstance(value, dict):
        if "score" not in value:
            raise TypeError(f"{fn.__name__} (shape 'verl') returned a dict without 'score': {sorted(value)}")
        for key, number in value.items():
            if key != "score" and isinstance(number, (int, float)) and not isinstance(number, bool):
                ctx.metric(str(key), float(number))
        value = value["score"]
    if isinstance(value, bool):
        return float(value)
    return value
