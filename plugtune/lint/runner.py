"""Run every lint rule over files and folders; ``job.yaml`` files tell which functions are plugins.

Beside the findings, lint notes each grader a ``job.yaml`` names that no fixture covers in the
``fixtures.jsonl`` beside it (``plugtune test --expect``): a fixture covers the grader its ``grader``
names, or the job's only grader when it names none. A note never changes the findings or the exit
status; group graders are left out (fixtures do not cover them yet).
"""

from __future__ import annotations

import ast
import io
import json
import re
import tokenize
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from plugtune.lint.blocking import check_blocking
from plugtune.lint.findings import RULES, Finding, finding
from plugtune.lint.graders import check_excepts, check_grader
from plugtune.lint.names import import_map
from plugtune.lint.plugins import (
    check_exits,
    check_foreign,
    check_plugin,
    check_shaped,
    decorator_shape,
    find_plugins,
    foreign_shape,
)
from plugtune.sdk.decorators import Kind
from plugtune.spec import job_yaml

SKIP_DIRS = {"__pycache__", "node_modules", "site-packages", "venv", "build", "dist"}
JOB_FILES = ("job.yaml", "job.yml")
SECTIONS = {"rollout": Kind.ROLLOUT, "graders": Kind.GRADER, "group_graders": Kind.GROUP_GRADER}
FIXTURES_FILE = "fixtures.jsonl"
MAX_FIXTURE_LINES = 10_000  # as many as `plugtune test --expect` reads
NOQA = re.compile(r"#\s*noqa(?::\s*(?P<rules>[A-Z0-9, ]+))?", re.IGNORECASE)


@dataclass
class LintReport:
    """What ``plugtune lint`` found, over how many files."""

    files: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    plugins: list[str] = field(default_factory=list)  # "file:function (kind)", each one checked
    # notes, not findings: {"job", "grader", "fixtures"} for each grader or group grader no fixture
    # beside its job.yaml covers
    graders_without_fixtures: list[dict[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        by_rule: dict[str, int] = {}
        for f in self.findings:
            by_rule[f.rule] = by_rule.get(f.rule, 0) + 1
        return {
            "findings": [f.to_dict() for f in self.findings],
            "summary": {
                "files": len(self.files),
                "findings": len(self.findings),
                "by_rule": by_rule,
                "plugins": self.plugins,
                "graders_without_fixtures": self.graders_without_fixtures,
            },
        }

    def notes(self) -> list[str]:
        """Lines for stderr about what is not wrong but not checked either (never a finding)."""
        by_job: dict[tuple[str, str], list[str]] = {}
        for note in self.graders_without_fixtures:
            by_job.setdefault((note["job"], note["fixtures"]), []).append(note["grader"])
        return [
            f"note: {job}: no fixture in {fixtures} covers grader(s) {', '.join(graders)}; add a line "
            f'with "grader": "{graders[0]}" and run plugtune test --expect {fixtures}'
            for (job, fixtures), graders in by_job.items()
        ]

    def checked(self) -> str:
        """What was checked, for a run that found nothing."""
        python = sum(1 for f in self.files if f.endswith(".py"))
        jobs = len(self.files) - python
        what = f"{python} Python file(s)" + (f" and {jobs} job.yaml file(s)" if jobs else "")
        if not self.plugins:
            return (
                f"no finding in {what}, and no plugin among them: lint checks functions decorated "
                "@rollout, @grader or @group_grader, named in a job.yaml, or with a plugin's parameters"
            )
        by_file: dict[str, list[str]] = {}
        for plugin in self.plugins:
            file, name = plugin.rsplit(":", 1)
            by_file.setdefault(file, []).append(name)
        plugins = "; ".join(f"{file}: {', '.join(names)}" for file, names in by_file.items())
        rules = ", ".join(f"{r.id} {r.name}" for r in RULES.values())
        return f"no finding in {what}\n  plugins checked: {plugins}\n  rules: {rules}"


def lint_paths(paths: Sequence[str | Path]) -> LintReport:
    """Lint every ``.py`` file under ``paths`` (files or folders); ``job.yaml`` files name the plugins.

    Raises FileNotFoundError for a path that does not exist.
    """
    roots = [Path(p) for p in paths] or [Path(".")]
    for root in roots:
        if not root.exists():
            raise FileNotFoundError(f"no such file or folder: {root}")
    job_files = _job_files(roots)
    expected = _expected_kinds(job_files)
    shapes = _expected_shapes(job_files)
    files = sorted({*_python_files(roots), *expected})
    report = LintReport(files=[str(f) for f in files] + [str(j) for j in job_files])
    for path in files:
        report.findings.extend(lint_file(path, expected.get(path, {}), shapes.get(path, {})))
        report.plugins.extend(_plugin_names(path, expected.get(path, {})))
    for job in job_files:
        report.findings.extend(_name_findings(job))
        report.graders_without_fixtures.extend(_graders_without_fixtures(job))
    return report


def _graders_without_fixtures(job: Path) -> list[dict[str, str]]:
    """The graders and group graders of ``job`` (by job.yaml name) that no fixture in the
    fixtures.jsonl beside it covers (a fixture without ``grader`` covers the job's one grader).

    Lines that are not a fixture are skipped here (``plugtune test --expect`` names them); [] when
    the job.yaml cannot be read (validation reports that).
    """
    from plugtune.spec.plugin_names import named_entries

    try:
        spec = job_yaml.load(job.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return []
    plugins = spec.get("plugins") if isinstance(spec, dict) else None
    entries = named_entries(plugins, {})
    graders = [e.name for e in entries if e.field.startswith("plugins.graders[")]
    group_graders = [e.name for e in entries if e.field.startswith("plugins.group_graders[")]
    if not graders and not group_graders:
        return []
    fixtures = job.parent / FIXTURES_FILE
    covered: set[str] = set()
    try:
        lines = fixtures.read_bytes().splitlines()[:MAX_FIXTURE_LINES]
    except OSError:
        lines = []  # no fixtures file: no grader is covered
    for line in lines:
        try:
            data = json.loads(line) if line.strip() else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if not isinstance(data, dict):
            continue
        named = data.get("grader")
        if named is None and len(graders) == 1:
            covered.add(graders[0])
        elif isinstance(named, str):
            covered.add(named)
    return [
        {"job": _display(job), "grader": g, "fixtures": _display(fixtures)}
        for g in (*graders, *group_graders)
        if g not in covered
    ]


def _name_findings(job: Path) -> list[Finding]:
    """PT404: two plugins of one job.yaml resolving to the same name (the job would be refused)."""
    from plugtune.spec.validation import plugin_name_problems  # pydantic and the spec: only when needed

    return [
        Finding(p.file, p.line or 1, 1, "PT404", f"[{p.field}] {p.message}", RULES["PT404"].fix)
        for p in plugin_name_problems(_display(job))
    ]


def lint_file(
    path: Path, expected: dict[str, Kind] | None = None, shapes: dict[str, str] | None = None
) -> list[Finding]:
    """Findings for one file; ``expected`` maps function names job.yaml gives a plugin kind,
    ``shapes`` those it gives a ``shape:`` (a TRL/verl reward function used as it is)."""
    name = _display(path)
    try:
        source = path.read_bytes()
    except OSError as exc:
        return [
            finding(
                name, 1, "PT000", f"cannot read the file: {exc.strerror or exc}", "fix the file's permissions"
            )
        ]
    in_plugins = "plugins" in path.resolve().parts[:-1]
    return lint_source(source, name, expected=expected, in_plugins_dir=in_plugins, shapes=shapes)


def lint_source(
    source: str | bytes,
    file: str = "<string>",
    *,
    expected: dict[str, Kind] | None = None,
    in_plugins_dir: bool = False,
    shapes: dict[str, str] | None = None,
) -> list[Finding]:
    """Findings for one module's source text."""
    expected = expected or {}
    try:
        tree = ast.parse(source, filename=file)
    except SyntaxError as exc:
        message = f"the file does not parse: {exc.msg}"
        return [
            Finding(
                file, exc.lineno or 1, exc.offset or 1, "PT000", message, finding(file, 1, "PT000", "").fix
            )
        ]
    except ValueError as exc:  # e.g. null bytes
        return [finding(file, 1, "PT000", f"the file does not parse: {exc}")]
    imports = import_map(tree)
    out = check_blocking(tree, imports, file)
    plugins = find_plugins(tree, imports, expected, in_plugins_dir)
    graders = {p.node.name for p in plugins if p.kind in (Kind.GRADER, Kind.GROUP_GRADER)}
    for plugin in plugins:
        shaped = decorator_shape(plugin.node) if plugin.decorated is not None else None
        if plugin.decorated is None:
            shaped = (shapes or {}).get(plugin.node.name)  # job.yaml's shape: adapts it as it is
        if shaped is not None:  # a TRL/verl function the decorator adapts: its own shape's checks
            out.extend(check_shaped(plugin, shaped, file))
            out.extend(check_exits(plugin, imports, file))
            continue
        shape = foreign_shape(plugin.node)
        if shape is not None:  # the other rules would steer it to a decorator it cannot take
            out.append(check_foreign(plugin, shape, expected, file))
            continue
        out.extend(check_plugin(plugin, expected, file))
        out.extend(check_exits(plugin, imports, file))
        if plugin.kind in (Kind.GRADER, Kind.GROUP_GRADER):
            out.extend(check_grader(plugin.node, plugin.kind, imports, file))
    out.extend(check_excepts(tree, graders, imports, file))
    return sorted(_not_silenced(out, source), key=lambda f: (f.line, f.col, f.rule))


def _plugin_names(path: Path, expected: dict[str, Kind]) -> list[str]:
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return []  # PT000 says why
    in_plugins = "plugins" in path.resolve().parts[:-1]
    found = find_plugins(tree, import_map(tree), expected, in_plugins)
    return [f"{_display(path)}:{p.node.name} ({p.kind.value})" for p in found]


def _not_silenced(findings: list[Finding], source: str | bytes) -> list[Finding]:
    silenced: dict[int, set[str] | None] = {}
    text = source.decode("utf-8", "replace") if isinstance(source, bytes) else source
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            match = NOQA.search(token.string) if token.type == tokenize.COMMENT else None
            if match is not None:
                rules = match["rules"]
                silenced[token.start[0]] = {r.strip().upper() for r in rules.split(",")} if rules else None
    except (tokenize.TokenError, SyntaxError):
        return findings
    return [f for f in findings if not _is_silenced(f, silenced)]


def _is_silenced(f: Finding, silenced: dict[int, set[str] | None]) -> bool:
    if f.line not in silenced:
        return False
    rules = silenced[f.line]
    return rules is None or f.rule in rules


def _display(path: Path) -> str:
    """``path`` relative to the working directory when it is below it (as editors expect), else absolute."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _walk(roots: Iterable[Path], match: Any) -> list[Path]:
    out: list[Path] = []
    for root in roots:
        if root.is_file():
            out.extend([root] if match(root) else [])
            continue
        for path in sorted(root.rglob("*")):
            relative = path.relative_to(root).parts
            if any(part in SKIP_DIRS or part.startswith(".") for part in relative[:-1]):
                continue
            if path.is_file() and match(path):
                out.append(path)
    return out


def _python_files(roots: list[Path]) -> list[Path]:
    return [p.resolve() for p in _walk(roots, lambda p: p.suffix == ".py")]


def _job_files(roots: list[Path]) -> list[Path]:
    explicit = [r for r in roots if r.is_file() and r.suffix in (".yaml", ".yml")]
    found = _walk([r for r in roots if r.is_dir()], lambda p: p.name in JOB_FILES)
    return explicit + found


def _expected_shapes(job_files: list[Path]) -> dict[Path, dict[str, str]]:
    """Plugin file -> {function: shape}, from the entries of every readable job.yaml with `shape:`."""
    out: dict[Path, dict[str, str]] = {}
    for job in job_files:
        try:
            spec = job_yaml.load(job.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        plugins = spec.get("plugins") if isinstance(spec, dict) else None
        for section in ("graders", "group_graders"):
            items = plugins.get(section) if isinstance(plugins, dict) else None
            for item in items if isinstance(items, list) else []:
                entry = item.get("entry") if isinstance(item, dict) else None
                shape = item.get("shape") if isinstance(item, dict) else None
                if isinstance(entry, str) and isinstance(shape, str) and entry.count(":") == 1:
                    file, function = entry.split(":")
                    out.setdefault((job.parent / file).resolve(), {})[function] = shape
    return out


def _expected_kinds(job_files: list[Path]) -> dict[Path, dict[str, Kind]]:
    """Plugin file -> {function: kind}, from the entries of every readable job.yaml (its
    ``plugins`` and each of its ``tasks``' plugin sets)."""
    out: dict[Path, dict[str, Kind]] = {}
    for job in job_files:
        try:
            spec = job_yaml.load(job.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue  # `plugtune run` / validation reports a broken job.yaml
        plugins = spec.get("plugins") if isinstance(spec, dict) else None
        tasks = spec.get("tasks") if isinstance(spec, dict) else None
        for plugin_set in [plugins, *(tasks.values() if isinstance(tasks, dict) else [])]:
            for section, kind in SECTIONS.items():
                items = plugin_set.get(section) if isinstance(plugin_set, dict) else None
                for item in items if isinstance(items, list) else [items]:
                    entry = item.get("entry") if isinstance(item, dict) else None
                    if (
                        isinstance(entry, str)
                        and entry.count(":") == 1
                        and entry.split(":")[0].endswith(".py")
                    ):
                        file, function = entry.split(":")
                        path = (job.parent / file).resolve()
                        if path.is_file():
                            out.setdefault(path, {})[function] = kind
    return out
