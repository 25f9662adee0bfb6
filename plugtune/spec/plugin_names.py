"""Plugin names: the key a plugin's reward component, metrics, logs and console row are kept under.

A grader is named by its ``name:`` in job.yaml, else by its function; the rollout by its function.
Two plugins of one job with the same name would overwrite each other's rewards and evidence, so
that is an ``Invalid value`` before any compute, naming both entries and suggesting a ``name:``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from plugtune.errors import Problem
from plugtune.spec.models import BUILTIN_ROLLOUT, ENTRY_PATTERN

Path_ = tuple[str | int, ...]


@dataclass(frozen=True)
class NamedEntry:
    """One plugin entry of job.yaml and the name it resolves to."""

    name: str
    field: str  # where it is: plugins.graders[1]
    line: int | None
    own_name: bool  # the name comes from job.yaml's `name:`, not the function
    suggestion: str  # a unique-looking `name:` to offer


def named_entries(plugins: Any, lines: Mapping[Path_, int]) -> list[NamedEntry]:
    """The rollout (or the built-in one), graders and group graders of a raw ``plugins`` mapping,
    each with its resolved name; entries whose name cannot be read yet are left out."""
    plugins = plugins if isinstance(plugins, dict) else {}
    out: list[NamedEntry] = []
    rollout = plugins.get("rollout")
    if rollout is None:
        function = BUILTIN_ROLLOUT.rpartition(":")[2]
        out.append(NamedEntry(function, "plugins.rollout (the built-in rollout)", None, False, function))
    elif isinstance(rollout, dict):
        found = _entry_name(rollout.get("entry"), ("plugins", "rollout"), lines, None)
        out.extend([found] if found is not None else [])
    for section in ("graders", "group_graders"):
        items = plugins.get(section)
        for index, item in enumerate(items if isinstance(items, list) else []):
            if isinstance(item, dict):
                name = item.get("name")
                own = name if isinstance(name, str) and name else None
                found = _entry_name(item.get("entry"), ("plugins", section, index), lines, own)
                out.extend([found] if found is not None else [])
    return out


def _entry_name(entry: Any, loc: Path_, lines: Mapping[Path_, int], own: str | None) -> NamedEntry | None:
    if not isinstance(entry, str):
        return None
    match = ENTRY_PATTERN.match(entry.strip())
    if match is None and entry != BUILTIN_ROLLOUT:
        return None  # the entry check reports it
    function = entry.rpartition(":")[2]
    stem = PurePosixPath(match["file"]).stem if match is not None else "builtin"
    field = f"{loc[0]}.{loc[1]}" + (f"[{loc[2]}]" if len(loc) > 2 else "")
    line = lines.get((*loc, "name")) if own else lines.get((*loc, "entry"), lines.get(loc))
    return NamedEntry(own or function, field, line, own is not None, f"{stem}_{function}")


#: The longest plugin name: it is part of metric names (``eval/grader/<name>/unscorable_share``,
#: ``metric/<name>/...``) that the store keeps up to 200 characters, as a job.yaml ``name:`` is.
NAME_MAX = 100


def long_names(entries: Sequence[NamedEntry], file: str) -> list[Problem]:
    """One problem for every entry whose name (its function's, when no ``name:``) is over
    :data:`NAME_MAX` characters."""
    return [
        Problem(
            file,
            f"plugin name `{entry.name[:40]}…` is {len(entry.name)} characters, over {NAME_MAX}: a "
            "plugin's name is part of the names its metrics are stored under; give this entry a "
            "shorter `name:`",
            entry.line,
            f"{entry.field}.entry",
        )
        for entry in entries
        if not entry.own_name and len(entry.name) > NAME_MAX
    ]


def duplicate_names(entries: Sequence[NamedEntry], file: str) -> list[Problem]:
    """One problem for every entry whose name an earlier entry already has."""
    first: dict[str, NamedEntry] = {}
    problems: list[Problem] = []
    for entry in entries:
        taken = first.setdefault(entry.name, entry)
        if taken is entry:
            continue
        where = f"{taken.field} (line {taken.line})" if taken.line is not None else taken.field
        fix = "choose another `name:`" if entry.own_name else "give this entry its own `name:`"
        problems.append(
            Problem(
                file,
                f"plugin name `{entry.name}` is already used by {where}: each plugin's rewards, metrics "
                f"and logs are kept under its name, so two plugins cannot share one; {fix} "
                f"(e.g. `name: {entry.suggestion}`)",
                entry.line,
                f"{entry.field}.{'name' if entry.own_name else 'entry'}",
            )
        )
    return problems
