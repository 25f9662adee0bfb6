"""``@rollout``, ``@grader`` and ``@group_grader``: mark a function as a plugin.

The decorators only attach a :class:`PluginSpec`; the function itself is unchanged, so it can
still be called and tested directly. With ``shape="trl"``, ``"trl-text"`` or ``"verl"`` a grader is
a TRL or verl reward function as it is, and the decorator returns an adapter that plugtune calls
(see :mod:`plugtune.sdk.shapes`; called as its framework calls it, it calls the function so).
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from plugtune.sdk.runtime_spec import Runtime
from plugtune.sdk.shapes import SHAPES, adapt, shape_problems

F = TypeVar("F", bound=Callable[..., Any])

SPEC_ATTR = "__plugtune__"


class Kind(str, enum.Enum):
    ROLLOUT = "rollout"
    GRADER = "grader"
    GROUP_GRADER = "group_grader"


#: The positional parameters each kind of plugin is called with.
PARAMETERS: dict[Kind, tuple[str, ...]] = {
    Kind.ROLLOUT: ("ctx", "policy", "sample"),
    Kind.GRADER: ("ctx", "sample", "trajectory"),
    Kind.GROUP_GRADER: ("ctx", "sample", "trajectories"),
}


@dataclass(frozen=True)
class PluginSpec:
    kind: Kind
    name: str
    runtime: Runtime
    weight: float = 1.0
    is_async: bool = False


def signature_problems(fn: Callable[..., Any], kind: Kind) -> list[str]:
    """What is wrong with ``fn``'s signature for a plugin of ``kind`` ([] when it is fine)."""
    expected = PARAMETERS[kind]
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as exc:
        return [f"cannot read the signature: {exc}"]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    has_varargs = any(p.kind is p.VAR_POSITIONAL for p in params)
    required = [p for p in positional if p.default is p.empty]
    want = f"def {getattr(fn, '__name__', 'fn')}({', '.join(expected)})"
    if len(required) > len(expected):
        return [
            f"takes {len(required)} required arguments, a {kind.value} is called with {len(expected)}: {want}"
        ]
    if len(positional) < len(expected) and not has_varargs:
        return [
            f"takes {len(positional)} positional arguments, a {kind.value} is called with "
            f"{len(expected)}: {want}"
        ]
    kw_required = [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    if kw_required:
        return [
            f"has required keyword-only argument(s) {', '.join(kw_required)}; a {kind.value} "
            f"is called as {want}"
        ]
    return []


def _decorate(
    kind: Kind, fn: F | None, runtime: Runtime | None, weight: float, shape: str | None = None
) -> Any:
    if runtime is not None and not isinstance(runtime, Runtime):
        raise TypeError(f"@{kind.value}(runtime=...) needs a plugtune.Runtime, got {type(runtime).__name__}")
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
        raise ValueError(f"@{kind.value}(weight={weight!r}): weight must be a number > 0")

    if shape is not None and shape not in SHAPES:
        raise ValueError(f"@{kind.value}(shape={shape!r}): use one of {', '.join(map(repr, SHAPES))}")

    def wrap(f: F) -> F:
        if not callable(f):
            raise TypeError(f"@{kind.value} decorates a function, got {type(f).__name__}")
        if shape is not None:
            foreign = shape_problems(f, shape, kind is Kind.GROUP_GRADER)
            if foreign:
                raise TypeError(f"@{kind.value}(shape={shape!r}) {f.__name__}: {foreign[0]}")
            adapter = adapt(f, shape, kind is Kind.GROUP_GRADER)
            setattr(adapter, SPEC_ATTR, _spec(kind, f, runtime, weight))
            return adapter  # type: ignore[return-value]
        problems = signature_problems(f, kind)
        if problems:
            raise TypeError(f"@{kind.value} {f.__name__}: {problems[0]}")
        setattr(f, SPEC_ATTR, _spec(kind, f, runtime, weight))
        return f

    return wrap(fn) if fn is not None else wrap


def _spec(kind: Kind, f: Callable[..., Any], runtime: Runtime | None, weight: float) -> PluginSpec:
    return PluginSpec(
        kind=kind,
        name=f.__name__,
        runtime=runtime or Runtime(),
        weight=float(weight),
        is_async=inspect.iscoroutinefunction(f),
    )


@overload
def rollout(fn: F, *, runtime: Runtime | None = None) -> F: ...
@overload
def rollout(fn: None = None, *, runtime: Runtime | None = None) -> Callable[[F], F]: ...
def rollout(fn: F | None = None, *, runtime: Runtime | None = None) -> F | Callable[[F], F]:
    """Mark ``fn(ctx, policy, sample) -> RolloutResult | None`` as the job's rollout."""
    return _decorate(Kind.ROLLOUT, fn, runtime, 1.0)


@overload
def grader(fn: F, *, weight: float = 1.0, runtime: Runtime | None = None, shape: str | None = None) -> F: ...
@overload
def grader(
    fn: None = None, *, weight: float = 1.0, runtime: Runtime | None = None, shape: str | None = None
) -> Callable[[F], F]: ...
def grader(
    fn: F | None = None, *, weight: float = 1.0, runtime: Runtime | None = None, shape: str | None = None
) -> F | Callable[[F], F]:
    """Mark ``fn(ctx, sample, trajectory) -> float | None`` as a grader (``None`` = unscorable);
    ``shape="verl"``: a verl ``compute_score(data_source, solution_str, ground_truth, extra_info)``,
    ``"trl"``/``"trl-text"``: a TRL reward function, called with one completion at a time."""
    return _decorate(Kind.GRADER, fn, runtime, weight, shape)


@overload
def group_grader(
    fn: F, *, weight: float = 1.0, runtime: Runtime | None = None, shape: str | None = None
) -> F: ...
@overload
def group_grader(
    fn: None = None, *, weight: float = 1.0, runtime: Runtime | None = None, shape: str | None = None
) -> Callable[[F], F]: ...
def group_grader(
    fn: F | None = None, *, weight: float = 1.0, runtime: Runtime | None = None, shape: str | None = None
) -> F | Callable[[F], F]:
    """Mark ``fn(ctx, sample, trajectories) -> list[float | None]`` as a group grader;
    ``shape="trl"``/``"trl-text"``: a TRL reward function, called with the group's completions."""
    return _decorate(Kind.GROUP_GRADER, fn, runtime, weight, shape)


def spec_of(fn: Any) -> PluginSpec | None:
    """The plugin spec a decorator attached to ``fn``, or None when it is not decorated."""
    spec = getattr(fn, SPEC_ATTR, None)
    return spec if isinstance(spec, PluginSpec) else None
