"""Validation before any compute: ``job.yaml``, its paths, its plugins' entries and every dataset row.

Every problem is collected (not only the first), each with file, line and field. Missing or empty
inputs raise :class:`InvalidDataError`; malformed values raise :class:`InvalidValueError`. When both
kinds exist the data error is raised, carrying all problems.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from plugtune.errors import InvalidValueError, Problem
from plugtune.sdk.decorators import Kind
from plugtune.spec import job_yaml
from plugtune.spec.models import (
    BUILTIN_MODEL_PREFIX,
    BUILTIN_ROLLOUT,
    DEFAULT_TASK,
    GraderEntry,
    JobSpec,
    RolloutEntry,
    RuntimeOverrides,
    TaskPluginEntry,
    TaskSpec,
    nested_model,
    parse_entry,
    resolve_model,
)
from plugtune.spec.plugin_names import duplicate_names, long_names, named_entries
from plugtune.spec.reach import Confinement, Reach
from plugtune.spec.rows import (
    Found,
    describe,
    parse_rows,
    read_dataset,
    read_text,
    task_problems,
    validate_row,
)
from plugtune.trainer.config import TrainerConfig, config_message

SECTION_KINDS = {"rollout": Kind.ROLLOUT, "graders": Kind.GRADER, "group_graders": Kind.GROUP_GRADER}

__all__ = [
    "PluginRef",
    "ValidatedJob",
    "load_spec",
    "plugin_name_problems",
    "read_dataset",
    "validate_job",
    "validate_row",
]

Path_ = tuple[str | int, ...]


@dataclass(frozen=True)
class PluginRef:
    """One plugin of a validated job: where its code is, and job.yaml's weight / runtime overrides.

    ``path`` is the resolved file for user plugins; ``module`` is set instead for the built-in rollout.
    ``name`` keys its rewards, metrics and logs (job.yaml's ``name:``, else the function; unique in
    the job); ``field`` and ``line`` say where job.yaml lists it.
    Merge the decorator's Runtime with ``runtime`` using :func:`plugtune.spec.models.merge_runtime`.
    """

    kind: Kind
    entry: str
    function: str
    path: Path | None
    module: str | None
    weight: float | None = None
    runtime: RuntimeOverrides | None = None
    shape: str | None = None  # job.yaml's shape: an undecorated TRL/verl reward function
    name: str = ""
    field: str = ""
    line: int | None = None


@dataclass(frozen=True)
class TaskPlugins:
    """One task's plugin set (job.yaml's ``tasks.<name>``), its plugins resolved."""

    rollout: PluginRef
    graders: tuple[PluginRef, ...]
    group_graders: tuple[PluginRef, ...]


@dataclass(frozen=True)
class ValidatedJob:
    """A job whose spec, paths, plugin entries and datasets all passed validation."""

    spec: JobSpec
    job_file: Path
    base_dir: Path
    model_dir: Path
    train_path: Path
    validation_path: Path | None
    train_rows: int
    validation_rows: int
    rollout: PluginRef
    graders: tuple[PluginRef, ...]
    group_graders: tuple[PluginRef, ...]
    lines: Mapping[Path_, int] = dataclasses.field(default_factory=dict, repr=False, compare=False)
    text: str = dataclasses.field(default="", repr=False, compare=False)  # job.yaml as validated
    tasks: Mapping[str, TaskPlugins] = dataclasses.field(default_factory=dict)  # tasks: (multi-task)

    def plugin_refs(self) -> tuple[PluginRef, ...]:
        """Every plugin the job deploys, once each: the rollout, graders and group graders of
        ``plugins``, then each task's that no set before it has (by name)."""
        sets = [(self.rollout, *self.graders, *self.group_graders)]
        sets += [(t.rollout, *t.graders, *t.group_graders) for t in self.tasks.values()]
        seen: dict[str, PluginRef] = {}
        for ref in (r for group in sets for r in group):
            seen.setdefault(ref.name, ref)
        return tuple(seen.values())

    def line_of(self, loc: Path_) -> int | None:
        """The line of job.yaml that holds ``loc`` (e.g. ``("secrets", 0)``), or of the nearest key
        above it; read when the job was validated, so job.yaml is not parsed again."""
        return _line_of(loc, self.lines)


# --- job.yaml -------------------------------------------------------------------------------


def load_spec(path: str | Path) -> JobSpec:
    """Read and type-check ``job.yaml`` (no file-system checks beyond the file itself)."""
    found = Found()
    spec, _, _, _ = _load(Path(path), found)
    found.raise_if_any()
    if spec is None:  # every failure path above records a problem
        raise InvalidValueError([Problem(str(path), "job.yaml could not be read")])
    return spec


def validate_job(
    path: str | Path,
    *,
    check_model: bool = True,
    base_dir: str | Path | None = None,
    confine: Confinement | None = None,
    text: str | None = None,
    plugin_files: Mapping[str, Path] | None = None,
) -> ValidatedJob:
    """Validate everything a job needs before compute starts; raise with every problem found.

    ``check_model=False`` skips only the check that the model folder exists. Relative paths in
    job.yaml are resolved against ``base_dir`` (default: the job.yaml's folder). Data and plugin
    files among plugtune's own (the store, PLUGTUNE_HOME's files and folders) are refused;
    ``confine`` (a job submitted over the API) keeps them inside its submission and shared folders
    and its secrets in the allow-list.

    A submitted job is validated again from what it was submitted with: ``text`` is job.yaml's
    content (``path`` still names it and anchors its relative paths) and ``plugin_files`` maps
    each plugin entry's file, as job.yaml writes it, to its submitted copy, which is read instead.
    """
    job_file = Path(path)
    found = Found()
    spec, raw, lines, read = _load(job_file, found, text)
    if raw is None:
        found.raise_if_any()
    base_dir = Path(base_dir).resolve() if base_dir is not None else job_file.resolve().parent
    name = str(job_file)
    reach = Reach.of(job_file, confine)
    model_dir = _check_model(raw, lines, base_dir, name, found) if check_model else None
    counts = _check_data(raw, lines, base_dir, name, found, reach)
    refs = _check_plugins(raw, lines, base_dir, name, found, reach, plugin_files)
    tasks: dict[str, TaskPlugins] = {}
    if spec is not None:
        tasks = _check_tasks(spec, refs, lines, base_dir, Problem(name, ""), found, reach, plugin_files)
        everyone = {
            **refs,
            "tasks": [r for t in tasks.values() for r in (t.rollout, *t.graders, *t.group_graders)],
        }
        found.value.extend(_policy_plugin_problems(spec, everyone, lines, name))
        found.value.extend(_engine_problems(spec, lines, name))
    if confine is not None:
        found.value.extend(_secret_problems(raw, lines, name, confine))
    found.raise_if_any()
    if spec is None:  # pragma: no cover - a failed spec always records a problem
        raise InvalidValueError([Problem(name, "job.yaml could not be validated")])
    data = spec.data
    rollout = _with_overrides(refs["rollout"], [spec.plugins.rollout])[0]
    graders = _with_overrides(refs["graders"], spec.plugins.graders)
    group_graders = _with_overrides(refs["group_graders"], spec.plugins.group_graders)
    return ValidatedJob(
        spec=spec,
        job_file=job_file.resolve(),
        base_dir=base_dir,
        model_dir=model_dir or resolve_model(spec.model, base_dir),
        train_path=(base_dir / data.train).resolve(),
        validation_path=(base_dir / data.validation).resolve() if data.validation else None,
        train_rows=counts.get("train", 0),
        validation_rows=counts.get("validation", 0),
        rollout=rollout,
        graders=graders,
        group_graders=group_graders,
        lines=dict(lines),
        text=read,
        tasks=_with_plugins_overrides(tasks, (rollout, *graders, *group_graders)),
    )


def _with_plugins_overrides(
    tasks: dict[str, TaskPlugins], listed: Sequence[PluginRef]
) -> dict[str, TaskPlugins]:
    """The tasks' sets with ``plugins``' own refs (job.yaml's weight and runtime attached) where a
    task names one of them."""
    by_name = {r.name: r for r in listed}

    def same(refs: Sequence[PluginRef]) -> tuple[PluginRef, ...]:
        return tuple(by_name.get(r.name, r) for r in refs)

    return {
        task: TaskPlugins(same([t.rollout])[0], same(t.graders), same(t.group_graders))
        for task, t in tasks.items()
    }


def _policy_plugin_problems(
    spec: JobSpec, refs: dict[str, list[PluginRef]], lines: dict[Path_, int], name: str
) -> list[Problem]:
    """``failure_policy.plugins`` keys that name no plugin of the job (a typo would go unused)."""
    names = sorted({r.name for group in refs.values() for r in group})
    out = []
    for key in spec.failure_policy.plugins:
        if key not in names:
            loc: Path_ = ("failure_policy", "plugins", key)
            message = (
                f"no plugin of this job is named {key!r}; name one of {', '.join(names)} (a plugin's "
                "name is its `name:` in plugins, else its function)"
            )
            out.append(Problem(name, message, _line_of(loc, lines), _field_text(loc)))
    return out


def _with_overrides(
    refs: list[PluginRef], entries: Sequence[RolloutEntry | GraderEntry | None]
) -> tuple[PluginRef, ...]:
    """Attach job.yaml's weight and runtime overrides (every entry is valid by now, in order)."""
    out = []
    for ref, entry in zip(refs, list(entries) + [None] * (len(refs) - len(entries)), strict=True):
        weight = entry.weight if isinstance(entry, GraderEntry) else None
        shape = entry.shape if isinstance(entry, GraderEntry) else None
        out.append(
            replace(ref, weight=weight, runtime=entry.runtime if entry is not None else None, shape=shape)
        )
    return tuple(out)


def _load(
    path: Path, found: Found, text: str | None = None
) -> tuple[JobSpec | None, dict[str, Any] | None, dict[Path_, int], str]:
    """job.yaml (``text``, else ``path``'s content) parsed and type-checked, its lines, and its text."""
    name = str(path)
    text = read_text(path, name, found, what="job spec") if text is None else text
    if text is None:
        return None, None, {}, ""
    try:
        raw, lines, node = _compose(text)
    except job_yaml.SpecTooLarge as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark is not None else None
        found.value.append(Problem(name, f"job.yaml cannot be read: {exc.problem}", line=line))
        return None, None, {}, text
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        found.value.append(Problem(name, f"YAML syntax error: {exc.problem or exc}", line=line))
        return None, None, {}, text
    except yaml.YAMLError as exc:
        found.value.append(Problem(name, f"YAML error: {exc}"))
        return None, None, {}, text
    if not isinstance(raw, dict):
        found.value.append(
            Problem(
                name, f"job.yaml must be a mapping of keys (name, model, ...), got {describe(raw)}", line=1
            )
        )
        return None, None, {}, text
    found.value.extend(_duplicates(node, name))
    try:
        spec = JobSpec.model_validate(raw)
    except ValidationError as exc:
        found.value.extend(_pydantic_problems(exc, lines, name))
        return None, raw, lines, text
    return spec, raw, lines, text


def _display(path: Path) -> str:
    """``path`` relative to the working directory when it is below it, else absolute."""
    resolved = path.resolve()
    try:
        return str(resolved.relative_to(Path.cwd()))
    except ValueError:
        return str(resolved)


def _compose(text: str) -> tuple[Any, dict[Path_, int], yaml.Node | None]:
    """Load YAML (within :mod:`plugtune.spec.job_yaml`'s bounds), the 1-based line of every key and
    list item by path, and the node tree."""
    data, node = job_yaml.compose(text)
    lines: dict[Path_, int] = {}
    if node is not None:
        _mark_lines(node, (), lines)
    return data, lines, node


def _mark_lines(node: yaml.Node, path: Path_, lines: dict[Path_, int]) -> None:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            child = (*path, str(key.value))
            lines[child] = key.start_mark.line + 1
            _mark_lines(value, child, lines)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _mark_lines(item, (*path, index), lines)


def _duplicates(node: yaml.Node | None, name: str) -> list[Problem]:
    problems: list[Problem] = []
    stack = [node] if node is not None else []
    while stack:
        current = stack.pop()
        if isinstance(current, yaml.MappingNode):
            seen: set[str] = set()
            for key, value in current.value:
                if str(key.value) in seen:
                    problems.append(
                        Problem(
                            name,
                            "key appears twice; the first value would be ignored",
                            line=key.start_mark.line + 1,
                            field=str(key.value),
                        )
                    )
                seen.add(str(key.value))
                stack.append(value)
        elif isinstance(current, yaml.SequenceNode):
            stack.extend(current.value)
    return problems


def _pydantic_problems(exc: ValidationError, lines: dict[Path_, int], name: str) -> list[Problem]:
    problems = []
    for error in exc.errors(include_url=False):
        loc: Path_ = tuple(error["loc"])
        if len(loc) > 1 and loc[0] == "hyperparameters":
            problems.append(_trainer_problem(error, lines, name))
            continue
        message = _message(error)
        if error["type"] in _BOUNDS and _description(loc):
            message += f" ({_description(loc)})"
        problems.append(Problem(name, message, line=_line_of(loc, lines), field=_field_text(loc) or None))
    return problems


def _trainer_problem(error: Any, lines: dict[Path_, int], name: str) -> Problem:
    """A ``hyperparameters`` problem in the trainer's own words, with its field's description when
    it is out of range."""
    field, message = config_message({**error, "loc": error["loc"][1:]})
    info = TrainerConfig.model_fields.get(field) if field != "lora" else None
    doc = (info.description or "").rstrip(".") if info is not None else ""
    if "range" in message and doc:
        message += f" ({doc})"
    dotted = f"hyperparameters.{field}"
    return Problem(name, message, _line_of(tuple(dotted.split(".")), lines), dotted)


_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}


def _message(error: Any) -> str:
    kind, value, ctx = error["type"], error.get("input"), error.get("ctx") or {}
    if kind == "missing":
        return "required key is missing"
    if kind == "extra_forbidden":
        allowed = ", ".join(_allowed_keys(tuple(error["loc"][:-1])))
        return f"unknown key (check the spelling); allowed here: {allowed}"
    if kind in ("model_type", "dict_type", "dataclass_exact_type", "dataclass_type"):
        return f"must be a mapping of keys, got {describe(value)}"
    if kind in ("int_type", "int_from_float"):
        return f"must be a whole number, got {_short(value)}"
    if kind == "float_type":
        return f"must be a number, got {_short(value)}"
    if kind in _BOUNDS:
        bound = next(iter(ctx.values()), "?")
        return f"must be {_BOUNDS[kind]} {bound}, got {_short(value)}"
    if kind in ("string_type", "list_type", "literal_error", "string_pattern_mismatch", "string_too_short"):
        return f"{error['msg'][0].lower()}{error['msg'][1:]}, got {_short(value)}"
    text = str(error["msg"]).removeprefix("Value error, ")
    return f"{text[0].lower()}{text[1:]}"


def _short(value: Any, limit: int = 200) -> str:
    """``repr(value)``, cut to ``limit`` characters (a wrong value can be a large list)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _allowed_keys(loc: Path_) -> list[str]:
    model = _model_at(loc)
    return list(model.model_fields) if model is not None else []


def _description(loc: Path_) -> str:
    model = _model_at(loc[:-1])
    info = model.model_fields.get(str(loc[-1])) if model is not None and loc else None
    return (info.description or "").rstrip(".") if info is not None else ""


def _model_at(loc: Path_) -> type[BaseModel] | None:
    model: type[BaseModel] | None = JobSpec
    keyed = False  # the previous part was a mapping of name -> model (dependencies:): this part is a name
    for part in loc:
        if model is None or isinstance(part, int) or keyed:
            keyed = False
            continue
        info = model.model_fields.get(part)
        model = nested_model(info.annotation) if info is not None else None
        keyed = info is not None and getattr(info.annotation, "__origin__", None) is dict
    return model


def _line_of(loc: Path_, lines: Mapping[Path_, int]) -> int | None:
    for end in range(len(loc), -1, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return None


def _field_text(loc: Path_) -> str:
    out = ""
    for part in loc:
        if part == "[key]":  # pydantic's marker for a mapping's key (env: {NAME: ...})
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


# --- paths and plugins ----------------------------------------------------------------------


def _section(raw: dict[str, Any] | None, key: str) -> dict[str, Any]:
    value = (raw or {}).get(key)
    return value if isinstance(value, dict) else {}


def _check_model(
    raw: dict[str, Any] | None, lines: dict[Path_, int], base: Path, name: str, found: Found
) -> Path | None:
    model = (raw or {}).get("model")
    if not isinstance(model, str) or not model:
        return None
    line = lines.get(("model",))
    try:
        model_dir = resolve_model(model, base)
    except ValueError as exc:
        found.value.append(Problem(name, str(exc), line, "model"))
        return None
    hint = "build or download the model first" if model.startswith(BUILTIN_MODEL_PREFIX) else "fix the path"
    if not model_dir.is_dir():
        found.data.append(Problem(name, f"model folder {model_dir} does not exist; {hint}", line, "model"))
    elif not (model_dir / "config.json").is_file():
        message = f"{model_dir} is not a Hugging Face model folder (no config.json)"
        found.data.append(Problem(name, message, line, "model"))
    return model_dir


def _check_data(
    raw: dict[str, Any] | None, lines: dict[Path_, int], base: Path, name: str, found: Found, reach: Reach
) -> dict[str, int]:
    counts: dict[str, int] = {}
    for key, value in _section(raw, "data").items():
        if key not in ("train", "validation") or not isinstance(value, str) or not value:
            continue  # the spec check reports these
        dataset = base / value
        label = _display(dataset)
        where = f" (data.{key} in {name}:{lines.get(('data', key), '?')})"
        refused = reach.refusal(dataset, "data")
        if refused is not None:  # said before the file is looked at: nothing tells whether it exists
            found.data.append(
                Problem(name, f"data.{key} {value!r} {refused}", lines.get(("data", key)), f"data.{key}")
            )
            continue
        text = read_text(dataset, label, found, what="dataset", where=where)
        if text is not None:
            rows, problems = parse_rows(text, label)
            found.value.extend(problems)
            found.value.extend(task_problems(text, label, _task_names(raw), where))
            counts[key] = len(rows)
    return counts


def _task_names(raw: dict[str, Any] | None) -> set[str]:
    """The plugin sets a row's ``task`` may name: job.yaml's ``tasks``, and ``default`` (rows without
    one) unless a multi-task job's ``plugins`` has no grader."""
    tasks = (raw or {}).get("tasks")
    named = {str(k) for k in (tasks if isinstance(tasks, dict) else {})}
    plugins = (raw or {}).get("plugins")
    graded = isinstance(plugins, dict) and any(plugins.get(k) for k in ("graders", "group_graders"))
    return {*named, DEFAULT_TASK} if graded or not named else named


def _secret_problems(
    raw: dict[str, Any] | None, lines: dict[Path_, int], name: str, confine: Confinement
) -> list[Problem]:
    """A submitted job's secrets that the server's operator has not allowed (``serve --secret``)."""
    secrets = (raw or {}).get("secrets")
    problems = []
    for index, secret in enumerate(secrets if isinstance(secrets, list) else []):
        if isinstance(secret, str) and secret not in confine.policy.secrets:
            allowed = ", ".join(sorted(confine.policy.secrets)) or "none"
            message = (
                f"secret {secret} is not one this server hands to submitted jobs (allowed: {allowed}): "
                f"its operator allows it with `plugtune serve --secret {secret}` (or "
                "PLUGTUNE_SUBMIT_SECRETS); otherwise remove it"
            )
            problems.append(Problem(name, message, _line_of(("secrets", index), lines), f"secrets[{index}]"))
    return problems


def _check_plugins(
    raw: dict[str, Any] | None,
    lines: dict[Path_, int],
    base: Path,
    name: str,
    found: Found,
    reach: Reach,
    submitted: Mapping[str, Path] | None = None,
) -> dict[str, list[PluginRef]]:
    plugins = _section(raw, "plugins")
    refs: dict[str, list[PluginRef]] = {key: [] for key in SECTION_KINDS}
    rollout = plugins.get("rollout")
    entries: list[tuple[str, Path_, dict[str, Any]]] = []
    if isinstance(rollout, dict):
        entries.append(("rollout", ("plugins", "rollout"), rollout))
    for key in ("graders", "group_graders"):
        items = plugins.get(key)
        for index, item in enumerate(items if isinstance(items, list) else []):
            if isinstance(item, dict):
                entries.append((key, ("plugins", key, index), item))
    for key, loc, item in entries:
        entry, own = item.get("entry"), item.get("name")
        if isinstance(entry, str):
            where = Problem(name, "", _line_of((*loc, "entry"), lines), _field_text((*loc, "entry")))
            ref = _check_entry(key, entry, base, where, found, reach, submitted)
            if ref is not None:
                named = own if isinstance(own, str) and own else ref.function
                refs[key].append(replace(ref, name=named, field=_field_text(loc), line=where.line))
    if not refs["rollout"]:
        refs["rollout"].append(_builtin_rollout())
    named_plugins = named_entries(plugins, lines)
    found.value.extend(duplicate_names(named_plugins, name) + long_names(named_plugins, name))
    return refs


def plugin_name_problems(path: str | Path) -> list[Problem]:
    """Plugins of ``job.yaml`` that share a name (``plugtune lint`` reports them before a job runs);
    [] when the file cannot be read or parsed (validation reports that)."""
    try:
        raw, lines, _ = _compose(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return []
    plugins = raw.get("plugins") if isinstance(raw, dict) else None
    return duplicate_names(named_entries(plugins, lines), str(path))


def _builtin_rollout() -> PluginRef:
    ref = parse_entry(BUILTIN_ROLLOUT)
    function, module = ref.function, ref.module
    return PluginRef(
        Kind.ROLLOUT, BUILTIN_ROLLOUT, function, None, module, name=function, field="plugins.rollout"
    )


def _check_entry(
    section: str,
    entry: str,
    base: Path,
    where: Problem,
    found: Found,
    reach: Reach,
    submitted: Mapping[str, Path] | None = None,
) -> PluginRef | None:
    def problem(message: str) -> None:
        found.value.append(Problem(where.file, message, where.line, where.field))

    try:
        ref = parse_entry(entry)
    except ValueError as exc:
        problem(str(exc))
        return None
    if ref.file is None:
        return PluginRef(SECTION_KINDS[section], entry, ref.function, None, ref.module)
    if submitted is not None:  # its copy, kept when the job was submitted (and checked then)
        return _submitted_entry(section, entry, ref.file, ref.function, submitted, problem)
    path = (base / ref.file).resolve()
    refused = reach.refusal(path, "plugins")
    if refused is not None:
        problem(f"plugin file {ref.file} {refused}")
        return None
    if reach.holds_home(path.parent):
        problem(
            f"the folder of {ref.file} ({path.parent}) holds PLUGTUNE_HOME ({reach.home}), and a plugin's "
            "whole folder is copied into its snapshot: move the plugin into its own folder (e.g. "
            "plugins/), or set PLUGTUNE_HOME elsewhere"
        )
        return None
    if not path.is_file():
        problem(f"plugin file {ref.file} does not exist (looked in {path.parent})")
        return None
    defined = _top_level_names(path)
    if defined is not None and ref.function not in defined:
        known = ", ".join(sorted(n for n in defined if not n.startswith("_"))) or "none"
        problem(f"{ref.file} defines no function `{ref.function}` (public names: {known})")
        return None
    return PluginRef(SECTION_KINDS[section], entry, ref.function, path, None)


def _submitted_entry(
    section: str,
    entry: str,
    file: str,
    function: str,
    submitted: Mapping[str, Path],
    problem: Callable[[str], None],
) -> PluginRef | None:
    copy = submitted.get(file)
    if copy is None or not copy.is_file():
        problem(f"plugin file {file} is not in the job's submitted snapshot; submit the job again")
        return None
    defined = _top_level_names(copy)
    if defined is not None and function not in defined:
        problem(f"{file} as submitted defines no function `{function}`")
        return None
    return PluginRef(SECTION_KINDS[section], entry, function, copy, None)


def _top_level_names(path: Path) -> set[str] | None:
    """Names a module defines at its top level, or None when it cannot be parsed here.

    A file that does not parse is left to the runtime, which reports it as a `Create faas fault`.
    """
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError, OSError):
        return None
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Name,)) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


# --- tasks (multi-task jobs) ------------------------------------------------------------------

Item = tuple[str, Path_, TaskPluginEntry]  # its section (rollout, graders, ...), where, what


def _task_items(task: str, spec: TaskSpec) -> list[Item]:
    items: list[Item] = []
    if spec.rollout is not None:
        items.append(("rollout", ("tasks", task, "rollout"), spec.rollout))
    for section in ("graders", "group_graders"):
        for index, item in enumerate(getattr(spec, section)):
            items.append((section, ("tasks", task, section, index), item))
    return items


#: The longest metric name the store keeps (its metric series' name column).
METRIC_NAME_MAX = 200


def _check_tasks(
    spec: JobSpec,
    refs: dict[str, list[PluginRef]],
    lines: dict[Path_, int],
    base: Path,
    job: Problem,
    found: Found,
    reach: Reach,
    submitted: Mapping[str, Path] | None,
) -> dict[str, TaskPlugins]:
    """Each task's plugin set: its own entries checked as ``plugins``' are (a name unique in the job),
    its names of plugins resolved (a name no plugin has, or a plugin of another kind, is refused);
    without a rollout, ``plugins``' (or the built-in one)."""
    named = {r.name: r for group in refs.values() for r in group}
    own: dict[Path_, PluginRef] = {}
    for task, task_spec in spec.tasks.items():
        for section, loc, item in _task_items(task, task_spec):
            if item.entry is None:
                continue
            where = replace(job, line=_line_of((*loc, "entry"), lines), field=_field_text((*loc, "entry")))
            ref = _check_entry(section, item.entry, base, where, found, reach, submitted)
            if ref is None:
                continue
            ref = replace(
                ref,
                name=item.name or ref.function,
                field=_field_text(loc),
                line=where.line,
                weight=item.weight,
                runtime=item.runtime,
                shape=item.shape,
            )
            taken = named.get(ref.name)
            if taken is not None:
                said = f"{taken.field} (line {taken.line})" if taken.line else taken.field
                key = "name" if item.name else "entry"
                message = (
                    f"plugin name `{ref.name}` is already used by {said}: each plugin's rewards, metrics "
                    f"and logs are kept under its name. To use that plugin in this task, give its name "
                    f"(`- {ref.name}`); for another plugin, give this entry its own `name:`"
                )
                found.value.append(
                    replace(
                        job,
                        message=message,
                        line=_line_of((*loc, key), lines),
                        field=_field_text((*loc, key)),
                    )
                )
                continue
            named[ref.name] = ref
            own[loc] = ref
    return {
        task: _task_set(task, task_spec, refs["rollout"][0], named, own, lines, job, found)
        for task, task_spec in spec.tasks.items()
    }


def _task_set(
    task: str,
    spec: TaskSpec,
    rollout: PluginRef,
    named: Mapping[str, PluginRef],
    own: Mapping[Path_, PluginRef],
    lines: dict[Path_, int],
    job: Problem,
    found: Found,
) -> TaskPlugins:
    picked: dict[str, list[PluginRef]] = {"rollout": [], "graders": [], "group_graders": []}
    for section, loc, item in _task_items(task, spec):
        field = _field_text(loc)
        if item.use is None:
            ref = own.get(loc)
        else:
            ref = named.get(item.use)
            kind = SECTION_KINDS[section]
            if ref is None or ref.kind is not kind:
                same = sorted(n for n, r in named.items() if r.kind is kind)
                what = (
                    f"no plugin of this job is named `{item.use}`"
                    if ref is None
                    else f"`{item.use}` is a {ref.kind.value} ({ref.field}), not a {kind.value}"
                )
                message = (
                    f"{what}: name one of the job's {kind.value}s ({', '.join(same) or 'none'}; a plugin's "
                    "name is its `name:`, else its function), or give an `entry:` of its own"
                )
                found.value.append(replace(job, message=message, line=_line_of(loc, lines), field=field))
                ref = None
        if ref is None:
            continue
        if any(r.name == ref.name for r in picked[section]):
            message = f"`{ref.name}` is listed twice in tasks.{task}.{section}; list each plugin once"
            found.value.append(replace(job, message=message, line=_line_of(loc, lines), field=field))
            continue
        longest = f"task/{task}/grader/{ref.name}/unscorable_share"  # its longest per-task metric
        if section != "rollout" and len(longest) > METRIC_NAME_MAX:
            message = (
                f"the task's metrics of `{ref.name}` would have names of {len(longest)} characters "
                f"(task/{task}/grader/<plugin>/unscorable_share); the store keeps names of at most "
                f"{METRIC_NAME_MAX}: shorten the task's name ({len(task)} characters) or the plugin's "
                f"({len(ref.name)}: give it a shorter `name:` where it is listed)"
            )
            found.value.append(replace(job, message=message, line=_line_of(loc, lines), field=field))
            continue
        picked[section].append(ref)
    return TaskPlugins(
        rollout=picked["rollout"][0] if picked["rollout"] else rollout,
        graders=tuple(picked["graders"]),
        group_graders=tuple(picked["group_graders"]),
    )


def _engine_problems(spec: JobSpec, lines: dict[Path_, int], name: str) -> list[Problem]:
    """``tasks:`` on an engine that does not route rows to plugin sets (TRL)."""
    if not spec.tasks or spec.trainer == "plugtune":
        return []
    message = (
        f"tasks: (multi-task jobs) runs on plugtune's trainer only; trainer: {spec.trainer} scores every "
        "row with the top-level plugins. Remove trainer: (or set trainer: plugtune), or run one job per task"
    )
    return [Problem(name, message, _line_of(("tasks",), lines), "tasks")]


def refuse_tasks(job: ValidatedJob, engine: str) -> None:
    """``InvalidValueError`` for a multi-task job run by an engine (TRL, verl) that scores every row
    with one plugin set: it would grade each row with every task's graders."""
    if not job.tasks:
        return
    message = (
        f"tasks: (multi-task jobs) runs on plugtune's trainer only: {engine} scores every row with one "
        "plugin set, so each row would be graded by every task's graders. Run it with plugtune's "
        "trainer (trainer: plugtune), or one job per task"
    )
    raise InvalidValueError([Problem(str(job.job_file), message, job.line_of(("tasks",)), "tasks")])
