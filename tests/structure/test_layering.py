"""The layering test: plugtune's imports follow the map in ``layers.toml`` (DESIGN.md section 5).

Every import is read from the source with :mod:`ast`, so an import inside a function (a lazy one)
counts like one at the top, and so does a plugtune module named in a string (what
``importlib.import_module`` or ``find_spec`` is given). A forbidden import fails with the file, the
line and the rule it breaks; a module of a part the map does not name fails too, and so does an
``[[allow]]`` entry that no import uses any more (the map stays true both ways).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
MAP = Path(__file__).with_name("layers.toml")


@dataclass(frozen=True)
class Import:
    source: str  # the importing module, dotted
    target: str  # the imported module (or a name in it), dotted
    where: str  # file:line


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path, known: set[str]) -> list[Import]:
    """Every plugtune import of one file: statements anywhere in it, and strings naming a module."""
    source = module_name(path, root)
    package = source if path.name == "__init__.py" else source.rpartition(".")[0]
    found = []
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                targets = [".".join([*base, node.module] if node.module else base)]
            else:
                targets = [node.module or ""]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in known:
            targets = [node.value]  # importlib.import_module("plugtune.x"), a registry of names
        for target in targets:
            if target == "plugtune" or target.startswith("plugtune."):
                found.append(Import(source, target, f"{path.relative_to(root)}:{node.lineno}"))  # type: ignore[attr-defined]
    return found


def part_of(module: str) -> str:
    bits = module.split(".")
    return bits[1] if len(bits) > 1 else "plugtune"


def _within(module: str, prefixes: list[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def violations(root: Path, layer_map: dict) -> list[str]:  # type: ignore[type-arg]
    """What breaks the map under ``root`` (the folder holding the ``plugtune`` package)."""
    level = {part: i for i, layer in enumerate(layer_map["layers"]) for part in layer}
    allowed = {(a["from"], a["to"]) for a in layer_map.get("allow", [])}
    plugin_code = layer_map.get("plugin_code", [])
    worker = layer_map.get("worker", {})
    files = sorted((root / "plugtune").rglob("*.py"))
    known = {module_name(f, root) for f in files}
    problems, used = [], set()
    for f in files:
        module = module_name(f, root)
        if _within(module, plugin_code):
            for imp in imports_of(f, root, known):
                if not _within(imp.target, ["plugtune.sdk"]) and imp.target != "plugtune":
                    problems.append(f"{imp.where}: plugin code imports {imp.target} (the SDK only)")
            continue
        if part_of(module) not in level:
            problems.append(f"{f.relative_to(root)}: part {part_of(module)!r} is on no layer of {MAP.name}")
            continue
        for imp in imports_of(f, root, known):
            a, b = part_of(imp.source), part_of(imp.target)
            if worker and _within(imp.source, [worker["modules"]]):
                ok = imp.target == "plugtune" or _within(imp.target, worker["may_import"][1:])
                if not ok:
                    problems.append(
                        f"{imp.where}: the worker imports {imp.target} (only {worker['may_import']})"
                    )
                continue
            if a == b or b not in level:
                if b not in level:
                    problems.append(f"{imp.where}: {imp.target} is in no part of {MAP.name}")
                continue
            if (a, b) in allowed:
                used.add((a, b))
            elif level[b] == level[a]:
                problems.append(f"{imp.where}: {a} imports {b}, a part of its own layer")
            elif level[b] > level[a]:
                problems.append(f"{imp.where}: {a} imports {b}, a layer above it")
    problems += [f"{MAP.name}: [[allow]] {a} -> {b} is used by no import" for a, b in sorted(allowed - used)]
    return problems


def _map() -> dict:  # type: ignore[type-arg]
    return tomllib.loads(MAP.read_text())


def test_plugtune_follows_its_layer_map() -> None:
    problems = violations(ROOT, _map())
    assert not problems, "\n".join(problems)


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in {"plugtune/__init__.py": "", **files}.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (  # a middle part imports another, lazily inside a function
            {
                "plugtune/store/__init__.py": "def f():\n    from plugtune.runtime import x\n",
                "plugtune/runtime/__init__.py": "",
            },
            "plugtune/store/__init__.py:2: store imports runtime, a part of its own layer",
        ),
        (  # a lower layer imports jobs, relatively
            {
                "plugtune/trainer/a.py": "from ..jobs import b\n",
                "plugtune/jobs/__init__.py": "",
                "plugtune/trainer/__init__.py": "",
            },
            "plugtune/trainer/a.py:1: trainer imports jobs, a layer above it",
        ),
        (  # jobs names an integration in a string for importlib
            {
                "plugtune/jobs/__init__.py": "import importlib\nE = {'trl': 'plugtune.integrations.trl'}\n",
                "plugtune/integrations/__init__.py": "",
                "plugtune/integrations/trl.py": "",
            },
            "plugtune/jobs/__init__.py:2: jobs imports integrations, a layer above it",
        ),
        (  # the worker imports the runtime's supervisor side
            {
                "plugtune/runtime/__init__.py": "",
                "plugtune/runtime/deployment.py": "",
                "plugtune/runtime/worker/__init__.py": "from plugtune.runtime import deployment\n",
            },
            "plugtune/runtime/worker/__init__.py:1: the worker imports plugtune.runtime",
        ),
        (  # plugin code imports more than the SDK
            {
                "plugtune/demo/plugins.py": "from plugtune.store import Store\n",
                "plugtune/store/__init__.py": "",
            },
            "plugtune/demo/plugins.py:1: plugin code imports plugtune.store (the SDK only)",
        ),
        (  # a new part nobody put on the map
            {"plugtune/newpart/__init__.py": ""},
            "plugtune/newpart/__init__.py: part 'newpart' is on no layer",
        ),
    ],
)
def test_the_check_finds_each_kind_of_forbidden_import(
    tmp_path: Path, files: dict[str, str], expected: str
) -> None:
    problems = violations(_tree(tmp_path, files), {**_map(), "allow": []})
    assert any(p.startswith(expected) for p in problems), problems


def test_an_allow_entry_no_import_uses_is_reported(tmp_path: Path) -> None:
    stale = {**_map(), "allow": [{"from": "store", "to": "runtime", "why": "gone"}]}
    problems = violations(_tree(tmp_path, {}), stale)
    assert f"{MAP.name}: [[allow]] store -> runtime is used by no import" in problems


def test_jobs_find_an_engine_by_its_entry_point_not_by_import() -> None:
    """``trainer: trl`` is found through the package's metadata (the core names no integration)."""
    from plugtune.integrations.trl import train_job
    from plugtune.jobs.attempt import engine_trainer

    assert engine_trainer("trl") is train_job
    with pytest.raises(RuntimeError, match="trainer: tensorflow: no installed package declares"):
        engine_trainer("tensorflow")
