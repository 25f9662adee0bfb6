"""Importing the user's module and finding the plugin function, with errors that say what is wrong."""

from __future__ import annotations

import importlib.util
import inspect
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plugtune.sdk import PluginSpec, grader, group_grader, spec_of
from plugtune.sdk.decorators import signature_problems


class LoadError(Exception):
    """The plugin could not be loaded; ``message`` names the file, the function and the problem."""

    def __init__(self, message: str, tb: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.traceback = tb


@dataclass
class Plugin:
    module: Any
    function: Any
    spec: PluginSpec
    setup: Any  # the module's top-level ``setup()`` or None


def signal_error_in(exc: BaseException) -> BaseException | None:
    """The ``ValueError: signal only works in main thread`` (``signal.signal`` off the main thread)
    that is ``exc`` or in its cause chain (a library that wraps it: ``raise ... from``, or an error
    raised while handling it); None when there is none."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < 32:
        seen.add(id(current))
        if isinstance(current, ValueError) and "signal only works in main thread" in str(current):
            return current
        current = current.__cause__ or current.__context__
    return None


def user_traceback(exc: BaseException, code_root: str) -> str:
    """The traceback limited to the user's frames (innermost first line), paths relative to the root."""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if f.filename.startswith(code_root)]
    shown = mine or list(frames)
    lines = []
    if mine:
        last = mine[-1]
        lines.append(f"{_rel(last.filename, code_root)}:{last.lineno} in {last.name}")
    lines.append("Traceback (most recent call last):")
    for f in shown:
        lines.append(f'  File "{_rel(f.filename, code_root)}", line {f.lineno}, in {f.name}')
        if f.line:
            lines.append(f"    {f.line}")
    detail = "".join(traceback.format_exception_only(type(exc), exc)).rstrip()
    lines.append(detail.replace(code_root.rstrip("/") + "/", ""))
    return "\n".join(lines)


def user_line(exc: BaseException, code_root: str) -> str:
    """``file:line`` of the innermost frame in the user's code ("" when none is)."""
    mine = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(code_root)]
    return f"{_rel(mine[-1].filename, code_root)}:{mine[-1].lineno}" if mine else ""


def install_hint(exc: BaseException) -> str:
    """For a missing module: where to install it (plugins run in plugtune's own environment)."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return ""
    top = exc.name.split(".")[0]
    return (
        f". Plugins run in the Python environment plugtune runs from ({sys.executable}): install"
        f" the package that provides {top!r} there, e.g. `{sys.executable} -m pip install {top}`"
        " (the package name may differ from the module's), then deploy again"
    )


def _rel(filename: str, code_root: str) -> str:
    return filename[len(code_root) :].lstrip("/") if filename.startswith(code_root) else filename


def load(code_root: str, relpath: str, function: str, adapt: str = "") -> Plugin:
    path = Path(code_root) / relpath
    name = Path(relpath).stem
    if code_root not in sys.path:
        sys.path.insert(0, code_root)
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise LoadError(f"{relpath}: cannot be imported as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    except LoadError:
        raise
    except SyntaxError as exc:
        where = f"{relpath}:{exc.lineno}" if exc.lineno else relpath
        raise LoadError(
            f"{where}: syntax error while importing the plugin ({exc.msg})", user_traceback(exc, code_root)
        ) from None
    except BaseException as exc:  # noqa: BLE001 - any import-time failure is the user's to fix
        where = user_line(exc, code_root) or relpath
        raise LoadError(
            f"{where}: importing the plugin module failed with {type(exc).__name__}: {exc}"
            + install_hint(exc),
            user_traceback(exc, code_root),
        ) from None
    return _find(module, relpath, function, adapt)


def _adapted(
    fn: Any, spec: PluginSpec | None, relpath: str, function: str, adapt: str
) -> tuple[Any, PluginSpec]:
    """``fn``, a TRL/verl reward function job.yaml names with ``shape:``, adapted as the decorator
    with that ``shape=`` would (``adapt``: ``"<kind>/<shape>"``)."""
    kind, _, shape = adapt.partition("/")
    if spec is not None:
        raise LoadError(
            f"{relpath}:{function}: is decorated @{spec.kind.value} and job.yaml gives it shape: {shape}; "
            "keep one (the decorator's shape= or job.yaml's shape:)"
        )
    decorate = group_grader if kind == "group_grader" else grader
    try:
        adapted = decorate(fn, shape=shape)
    except (TypeError, ValueError) as exc:
        raise LoadError(f"{relpath}:{function}: job.yaml's shape: {shape}: {exc}") from None
    found = spec_of(adapted)
    assert found is not None
    return adapted, found


def _find(module: Any, relpath: str, function: str, adapt: str = "") -> Plugin:
    fn = module.__dict__.get(function)
    if fn is None:
        names = sorted(n for n, v in module.__dict__.items() if spec_of(v) is not None)
        found = f"; plugins in this file: {', '.join(names)}" if names else ""
        raise LoadError(f"{relpath}: has no function named {function!r}{found}")
    spec = spec_of(fn)
    if adapt:
        fn, spec = _adapted(fn, spec, relpath, function, adapt)
    if spec is None:
        raise LoadError(
            f"{relpath}:{function}: is not a plugin; decorate it with @rollout, @grader or @group_grader"
        )
    problems = signature_problems(fn, spec.kind)
    if problems:
        raise LoadError(f"{relpath}:{function}: wrong signature: {problems[0]}")
    setup = module.__dict__.get("setup")
    if setup is not None and not (inspect.isfunction(setup) and setup.__module__ == module.__name__):
        setup = None
    if setup is not None and inspect.signature(setup).parameters:
        raise LoadError(f"{relpath}: setup() must take no arguments")
    return Plugin(module=module, function=fn, spec=spec, setup=setup)
