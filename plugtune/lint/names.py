"""Resolve what a name in a module refers to (``np.mean`` -> ``numpy.mean``), from its imports."""

from __future__ import annotations

import ast


def import_map(tree: ast.AST) -> dict[str, str]:
    """Local name -> qualified name, for every import in the module (any depth; shadowing ignored)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    names[top] = top
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            for alias in node.names:
                names[alias.asname or alias.name] = f"{module}.{alias.name}" if module else alias.name
    return names


def qualified(node: ast.AST, imports: dict[str, str]) -> str | None:
    """The dotted name an expression refers to, or None when it is not a plain (dotted) name."""
    if isinstance(node, ast.Name):
        return imports.get(node.id, node.id)
    if isinstance(node, ast.Attribute):
        base = qualified(node.value, imports)
        return f"{base}.{node.attr}" if base is not None else None
    return None


def own_nodes(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.AST]:
    """Every node in ``fn``'s body, not descending into nested functions, lambdas or classes."""
    out: list[ast.AST] = []
    stack: list[ast.AST] = list(reversed(fn.body))
    while stack:
        node = stack.pop()
        out.append(node)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        stack.extend(reversed(list(ast.iter_child_nodes(node))))
    return out
