"""PT401-PT403, PT405: which functions are plugins, and whether the runtime will accept them.

A function is a plugin when a plugtune decorator marks it, when a ``job.yaml`` names it, or when it
looks like one (parameters ``(ctx, policy, sample)`` / ``(ctx, sample, trajectory[s])``, or a
rollout/grader name in a file under ``plugins/``). A plugin shaped like another framework's reward
function (TRL's ``(completions, **kwargs)`` over a batch, verl's ``compute_score(data_source,
solution_str, ground_truth, ...)``) is PT405 until a ``shape=`` decorator adapts it (then its
signature is checked against that shape).
"""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import dataclass
from typing import Any

from plugtune.lint.findings import Finding, finding
from plugtune.lint.names import own_nodes, qualified
from plugtune.sdk.decorators import PARAMETERS, Kind, signature_problems
from plugtune.sdk.shapes import shape_problems

DECORATORS = {kind.value: kind for kind in Kind}
EXITS = {"sys.exit", "os._exit", "exit", "quit", "os.abort", "os.kill"}
NAME_HINT = re.compile(r"(^|_)(rollout|grader|group_grader)(_|$)")


@dataclass(frozen=True)
class Plugin:
    """A top-level function that is (or should be) a plugin."""

    node: ast.FunctionDef | ast.AsyncFunctionDef
    kind: Kind
    decorated: Kind | None


def find_plugins(
    tree: ast.Module, imports: dict[str, str], expected: dict[str, Kind], in_plugins_dir: bool
) -> list[Plugin]:
    """Top-level functions that are plugins; ``expected`` maps names job.yaml gives a kind."""
    out: list[Plugin] = []
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        decorated = _decorator_kind(node, imports)
        kind = expected.get(node.name) or decorated or _looks_like(node, in_plugins_dir)
        if kind is not None:
            out.append(Plugin(node, kind, decorated))
    return out


def check_plugin(plugin: Plugin, expected: dict[str, Kind], file: str) -> list[Finding]:
    """Missing decorator, wrong kind for job.yaml, a signature or decorator the runtime rejects."""
    node, kind = plugin.node, plugin.kind
    named = " (job.yaml names it)" if node.name in expected else ""
    if plugin.decorated is None:
        message = f"`{node.name}` looks like a {kind.value}{named} but has no @{kind.value} decorator"
        fix = f"add `@{kind.value}` above it (`from plugtune import {kind.value}`)"
        return [finding(file, node, "PT401", message, fix)]
    out: list[Finding] = []
    if node.name in expected and plugin.decorated is not expected[node.name]:
        used = expected[node.name].value
        message = f"job.yaml uses `{node.name}` as a {used}, but it is decorated @{plugin.decorated.value}"
        out.append(finding(file, node, "PT403", message, f"decorate it with @{expected[node.name].value}"))
    for problem in signature_problems(_signature_only(node), plugin.decorated):
        want = f"def {node.name}({', '.join(PARAMETERS[plugin.decorated])})"
        out.append(
            finding(
                file, node, "PT402", f"@{plugin.decorated.value} `{node.name}` {problem}", f"use `{want}`"
            )
        )
    out.extend(_decorator_arguments(node, file))
    return out


def foreign_shape(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """ "TRL" or "verl" when the function's parameters are those of that framework's reward function."""
    args = node.args
    names = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
    if {"solution_str", "ground_truth"} <= names:
        return "verl"
    if "completions" in names and not names & {"ctx", "sample", "trajectory", "trajectories"}:
        return "TRL"
    return None


def check_foreign(plugin: Plugin, shape: str, expected: dict[str, Kind], file: str) -> Finding:
    """PT405: a TRL or verl reward function used as a plugin without the decorator that takes it."""
    node, name = plugin.node, plugin.node.name
    if shape == "verl":
        what = f"`{name}` is a verl reward function (data_source, solution_str, ground_truth, ...)"
        decorate, section = '@grader(shape="verl")', "graders"
        how = "ground_truth from the row's extra.ground_truth (or extra.reward_model.ground_truth)"
    else:
        what = f"`{name}` is a TRL reward function (a batch of completions in, a list of floats out)"
        decorate, section = '@group_grader(shape="trl")', "group_graders"
        how = (
            "a group's completions in one call, each row's extra fields as keyword lists; "
            'shape="trl-text" if it reads completions as strings'
        )
    named = " job.yaml names it as a plugin, but" if name in expected else ""
    message = (
        f"{what}:{named} a plugtune {plugin.kind.value} is called as "
        f"({', '.join(PARAMETERS[plugin.kind])}), so it needs the decorator that adapts it"
    )
    fix = (
        f"leave `{name}` as it is: decorate it {decorate} (`from plugtune import "
        f"{decorate[1:].split('(')[0]}`; {how}) and list it in job.yaml under plugins.{section}"
    )
    return finding(file, node, "PT405", message, fix)


def decorator_shape(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """The ``shape=`` a plugtune decorator gives the function (a string literal), else None."""
    for decorator in node.decorator_list:
        if not isinstance(decorator, ast.Call):
            continue
        for keyword in decorator.keywords:
            if keyword.arg == "shape" and isinstance(keyword.value, ast.Constant):
                value = keyword.value.value
                return value if isinstance(value, str) else None
    return None


def check_shaped(plugin: Plugin, shape: str, file: str) -> list[Finding]:
    """PT402 for a function decorated with ``shape=``: what its framework's shape needs of it."""
    node = plugin.node
    out: list[Finding] = []
    kind = plugin.decorated or plugin.kind
    for problem in shape_problems(_signature_only(node), shape, kind is Kind.GROUP_GRADER):
        out.append(finding(file, node, "PT402", f"{kind.value} (shape {shape!r}) `{node.name}`: {problem}"))
    return out


def check_exits(plugin: Plugin, imports: dict[str, str], file: str) -> list[Finding]:
    """Calls in a plugin's body that end its instance's process."""
    out: list[Finding] = []
    for node in own_nodes(plugin.node):
        if isinstance(node, ast.Call) and qualified(node.func, imports) in EXITS:
            name = qualified(node.func, imports)
            message = f"{plugin.kind.value} `{plugin.node.name}` calls `{name}`, which ends its instance"
            out.append(finding(file, node, "PT302", message))
    return out


def _decorator_kind(node: ast.FunctionDef | ast.AsyncFunctionDef, imports: dict[str, str]) -> Kind | None:
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = qualified(target, imports)
        if name is None:
            continue
        last = name.rsplit(".", 1)[-1]
        if last in DECORATORS and (name == last or name.startswith("plugtune")):
            return DECORATORS[last]
    return None


def _looks_like(node: ast.FunctionDef | ast.AsyncFunctionDef, in_plugins_dir: bool) -> Kind | None:
    if node.name.startswith("_"):
        return None
    params = tuple(a.arg for a in node.args.posonlyargs + node.args.args)
    for kind, expected in PARAMETERS.items():
        if params == expected:
            return kind
    match = NAME_HINT.search(node.name) if in_plugins_dir else None
    if match is None:
        return None
    return DECORATORS[match.group(2)]


def _decorator_arguments(node: ast.FunctionDef | ast.AsyncFunctionDef, file: str) -> list[Finding]:
    out: list[Finding] = []
    for decorator in node.decorator_list:
        if not isinstance(decorator, ast.Call):
            continue
        for keyword in decorator.keywords:
            value = keyword.value
            number = _literal_number(value)
            if keyword.arg == "weight" and number is not None and number <= 0:
                message = f"`{node.name}` has weight={ast.unparse(value)}; the decorator rejects weights <= 0"
                out.append(finding(file, decorator, "PT402", message, "use a weight > 0"))
    return out


def _literal_number(node: ast.AST) -> float | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _literal_number(node.operand)
        return -inner if inner is not None else None
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, (int, float))
        and not isinstance(node.value, bool)
    ):
        return float(node.value)
    return None


class _SignatureOnly:
    """A callable that only carries a signature, so the SDK's own check can judge an AST function."""

    def __init__(self, name: str, signature: inspect.Signature) -> None:
        self.__name__ = name
        self.__signature__ = signature

    def __call__(self, *args: Any, **kwargs: Any) -> None:  # pragma: no cover - never called
        raise TypeError("signature only")


def _signature_only(node: ast.FunctionDef | ast.AsyncFunctionDef) -> _SignatureOnly:
    args = node.args
    P = inspect.Parameter
    positional = [(a, P.POSITIONAL_ONLY) for a in args.posonlyargs] + [
        (a, P.POSITIONAL_OR_KEYWORD) for a in args.args
    ]
    first_default = len(positional) - len(args.defaults)
    params = [
        P(a.arg, kind, default=None if i >= first_default else P.empty)
        for i, (a, kind) in enumerate(positional)
    ]
    if args.vararg is not None:
        params.append(P(args.vararg.arg, P.VAR_POSITIONAL))
    for a, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        params.append(P(a.arg, P.KEYWORD_ONLY, default=P.empty if default is None else None))
    if args.kwarg is not None:
        params.append(P(args.kwarg.arg, P.VAR_KEYWORD))
    return _SignatureOnly(node.name, inspect.Signature(params))
