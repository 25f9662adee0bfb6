"""plugtune.runtime has no import circle: no module of it reaches itself again through its imports.

Every import counts, as in the layering test: at module level, inside a function (a lazy one), under
``TYPE_CHECKING``, and a runtime module named in a string (``importlib.import_module``). A circle
fails with each step's file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

Graph = dict[str, dict[str, str]]  # module -> {module it imports: where (file:line)}


def modules_of(package_dir: Path, root: Path) -> dict[str, Path]:
    found = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _targets(node: ast.AST, package: str, modules: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            bits = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join([*bits, node.module] if node.module else bits)
        # ``from package import module`` imports the module; ``from module import name``, the module
        return [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in modules:
        return [node.value]
    return []


def import_graph(package_dir: Path, root: Path) -> Graph:
    """Which of the package's modules each of its modules imports, and where."""
    modules = modules_of(package_dir, root)
    graph: Graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: dict[str, str] = {}
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            for target in _targets(node, package, modules):
                while target and target not in modules:  # a name inside a module: the module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.setdefault(target, f"{path.relative_to(root)}:{node.lineno}")  # type: ignore[attr-defined]
        graph[name] = edges
    return graph


def find_circle(graph: Graph) -> list[str]:
    """One import circle as its modules in order (the first again at the end); [] when none."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path, on_path = [start], {start}
        stack = [(start, iter(sorted(graph[start])))]
        while stack:
            module, following = stack[-1]
            step = next(following, None)
            if step is None:
                stack.pop()
                path.pop()
                on_path.discard(module)
                done.add(module)
            elif step in on_path:
                return path[path.index(step) :] + [step]
            elif step not in done:
                stack.append((step, iter(sorted(graph[step]))))
                path.append(step)
                on_path.add(step)
    return []


def describe(graph: Graph, circle: list[str]) -> str:
    return "\n".join(f"  {a} imports {b} at {graph[a][b]}" for a, b in zip(circle, circle[1:], strict=False))


def test_the_runtime_has_no_import_circle() -> None:
    graph = import_graph(ROOT / "plugtune" / "runtime", ROOT)
    assert len(graph) > 30, sorted(graph)  # the runtime's modules were all found
    circle = find_circle(graph)
    assert not circle, "plugtune.runtime has an import circle:\n" + describe(graph, circle)


def test_a_circle_through_a_lazy_or_type_checking_import_is_found(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.c import C\n"
    )
    (package / "c.py").write_text("def late():\n    from . import a\n")
    (package / "d.py").write_text("import pkg.a\n")  # reaches the circle, is not in it
    graph = import_graph(package, tmp_path)
    assert find_circle(graph) == ["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]
    assert "pkg/c.py:2" in describe(graph, find_circle(graph))

    (package / "c.py").write_text("import json\n")  # the circle broken
    assert find_circle(import_graph(package, tmp_path)) == []
