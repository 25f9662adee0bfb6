"""PT201-PT204 and PT301: rewards that can come out NaN, None by accident, or not a number at all;
``except`` clauses that swallow errors (into a reward of 0).

A grader's ``None`` means "unscorable" and NaN/inf/non-numbers fail the call as ``Invalid reward``;
an error turned into 0 trains the model on a wrong reward without anyone noticing.
"""

from __future__ import annotations

import ast

from plugtune.lint.findings import Finding, finding
from plugtune.lint.names import own_nodes, qualified
from plugtune.sdk.decorators import Kind

NAN_STRINGS = {"nan", "inf", "infinity"}
NAN_ATTRS = {"nan", "NaN", "NAN", "inf", "Inf", "infty", "Infinity", "PINF", "NINF"}
NAN_MODULES = ("math.", "numpy.", "torch.", "cmath.")
#: numpy reductions that return NaN (with a warning) on an empty input.
EMPTY_NAN = {f"numpy.{n}" for n in ("mean", "average", "std", "var", "median", "nanmean", "nanmedian")}
EXITS = {"sys.exit", "os._exit", "exit", "quit", "os.abort"}
NON_NUMBER_CALLS = {"str", "dict", "list", "tuple", "set", "repr", "format", "json.dumps"}
BROAD = {"Exception", "BaseException", "builtins.Exception", "builtins.BaseException"}


def check_grader(
    fn: ast.FunctionDef | ast.AsyncFunctionDef, kind: Kind, imports: dict[str, str], file: str
) -> list[Finding]:
    """NaN/inf, unguarded division, falling off the end and non-number returns in one grader."""
    nodes = own_nodes(fn)
    tests = _guarded_names(nodes) | _constant_names(nodes, imports)
    out: list[Finding] = []
    for node in nodes:
        what = _nan_source(node, imports, tests)
        if what is not None:
            out.append(finding(file, node, "PT201", f"grader `{fn.name}` can return NaN/inf: {what}"))
        denominator = _unguarded_denominator(node, imports, tests)
        if denominator is not None:
            out.append(
                finding(
                    file,
                    node,
                    "PT202",
                    f"grader `{fn.name}` divides by `{denominator}`, which can be 0 "
                    "(ZeroDivisionError, or NaN with numpy)",
                )
            )
        if isinstance(node, ast.Return) and node.value is not None:
            wrong = _non_number(node.value, kind, imports)
            if wrong is not None:
                out.append(finding(file, node, "PT204", f"{kind.value} `{fn.name}` returns {wrong}"))
    if not ends(fn.body, imports):
        returns = any(isinstance(n, ast.Return) and n.value is not None for n in nodes)
        what = "can reach its end without `return`" if returns else "never returns a reward"
        message = f"{kind.value} `{fn.name}` {what}: it returns None (unscorable) by accident"
        out.append(finding(file, fn, "PT203", message))
    return out


def check_excepts(tree: ast.AST, graders: set[str], imports: dict[str, str], file: str) -> list[Finding]:
    """Bare ``except:`` that does not re-raise, and broad excepts in graders that return a number."""
    out: list[Finding] = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in own_nodes(fn):
            if not isinstance(node, ast.ExceptHandler) or _reraises(node):
                continue
            number = _returned_number(node)
            broad = node.type is None or qualified(node.type, imports) in BROAD
            if fn.name in graders and broad and number is not None:
                caught = "bare `except:`" if node.type is None else f"`except {ast.unparse(node.type)}:`"
                message = f"{caught} in grader `{fn.name}` turns every error into a reward of {number}"
                out.append(finding(file, node, "PT301", message))
            elif node.type is None:
                message = (
                    f"bare `except:` in `{fn.name}` swallows every error, including cancellation and "
                    "timeouts, so the runtime cannot stop or report the call"
                )
                out.append(finding(file, node, "PT301", message))
    return out


def ends(stmts: list[ast.stmt], imports: dict[str, str]) -> bool:
    """True when control cannot run past the end of ``stmts`` (every path returns or raises)."""
    return any(_stmt_ends(s, imports) for s in stmts)


def _stmt_ends(s: ast.stmt, imports: dict[str, str]) -> bool:
    if isinstance(s, (ast.Return, ast.Raise)):
        return True
    if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call):
        return qualified(s.value.func, imports) in EXITS
    if isinstance(s, ast.If):
        return ends(s.body, imports) and ends(s.orelse, imports)
    if isinstance(s, (ast.With, ast.AsyncWith)):
        return ends(s.body, imports)
    if isinstance(s, ast.Try) or type(s).__name__ == "TryStar":
        try_ = s  # ast.Try and ast.TryStar have the same fields
        if ends(try_.finalbody, imports):  # type: ignore[attr-defined]
            return True
        normal = ends(try_.body, imports) or ends(try_.orelse, imports)  # type: ignore[attr-defined]
        return normal and all(ends(h.body, imports) for h in try_.handlers)  # type: ignore[attr-defined]
    if isinstance(s, ast.While):
        forever = isinstance(s.test, ast.Constant) and bool(s.test.value)
        return not _breaks(s.body) and (forever or ends(s.orelse, imports))
    if isinstance(s, (ast.For, ast.AsyncFor)):
        return bool(s.orelse) and not _breaks(s.body) and ends(s.orelse, imports)
    if isinstance(s, ast.Match):
        total = any(
            isinstance(c.pattern, ast.MatchAs) and c.pattern.pattern is None and c.guard is None
            for c in s.cases
        )
        return total and all(ends(c.body, imports) for c in s.cases)
    return False


def _breaks(body: list[ast.stmt]) -> bool:
    stack: list[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Break):
            return True
        if isinstance(
            node, (ast.For, ast.AsyncFor, ast.While, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
        ):
            stack.extend(node.orelse if isinstance(node, (ast.For, ast.AsyncFor, ast.While)) else [])
            continue
        stack.extend(ast.iter_child_nodes(node))
    return False


def _nan_source(node: ast.AST, imports: dict[str, str], guarded: set[str]) -> str | None:
    if isinstance(node, ast.Call) and qualified(node.func, imports) == "float" and node.args:
        arg = node.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            if arg.value.strip().lstrip("+-").lower() in NAN_STRINGS:
                return f"`{ast.unparse(node)}`"
    if isinstance(node, ast.Attribute) and node.attr in NAN_ATTRS:
        name = qualified(node, imports) or ""
        if name.startswith(NAN_MODULES):
            return f"`{ast.unparse(node)}`"
    if isinstance(node, ast.Call) and qualified(node.func, imports) in EMPTY_NAN:
        if _names(node.args) & guarded:
            return None
        return f"`{ast.unparse(node.func)}` of an empty input is NaN"
    return None


def _guarded_names(nodes: list[ast.AST]) -> set[str]:
    """Names that appear in some condition of the function (if/while/assert/ternary/comprehension)."""
    tests: list[ast.AST] = []
    for node in nodes:
        if isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)):
            tests.append(node.test)
        elif isinstance(node, ast.comprehension):
            tests.extend(node.ifs)
        elif isinstance(node, ast.Try):
            for handler in node.handlers:
                if handler.type is not None and "ZeroDivisionError" in ast.unparse(handler.type):
                    tests.extend(node.body)
    return {n.id for test in tests for n in ast.walk(test) if isinstance(n, ast.Name)}


def _constant_names(nodes: list[ast.AST], imports: dict[str, str]) -> set[str]:
    """Local names only ever assigned a non-zero number (``total = 10``), so never a zero divisor."""
    values: dict[str, list[ast.AST]] = {}
    for node in nodes:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    values.setdefault(target.id, []).append(node.value)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and isinstance(node.target, ast.Name):
            values.setdefault(node.target.id, []).append(node.value or node.target)
    return {name for name, assigned in values.items() if all(_never_zero(v, imports) for v in assigned)}


def _unguarded_denominator(node: ast.AST, imports: dict[str, str], guarded: set[str]) -> str | None:
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod))):
        return None
    right = node.right
    if (
        isinstance(node.op, ast.Mod)
        and isinstance(node.left, ast.Constant)
        and isinstance(node.left.value, str)
    ):
        return None  # "%s" % value formatting
    if _never_zero(right, imports):
        return None
    if _names([right]) & guarded:
        return None
    return ast.unparse(right)


def _names(nodes: list[ast.expr]) -> set[str]:
    """Variable names inside ``nodes`` (not the builtins that wrap them)."""
    found = {n.id for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name)}
    return found - {"len", "sum", "abs", "float", "int", "max", "min"}


def _never_zero(node: ast.AST, imports: dict[str, str]) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool) and node.value != 0
    if isinstance(node, ast.Call) and qualified(node.func, imports) == "max":
        return any(_never_zero(a, imports) and not _negative(a) for a in node.args)
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
        return _never_zero(node.values[-1], imports)
    return False


def _negative(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and node.value < 0


def _non_number(value: ast.expr, kind: Kind, imports: dict[str, str]) -> str | None:
    if isinstance(value, ast.IfExp):
        return _non_number(value.body, kind, imports) or _non_number(value.orelse, kind, imports)
    if kind is Kind.GROUP_GRADER:
        if isinstance(value, ast.Constant) and value.value is not None:
            return f"`{ast.unparse(value)[:40]}`, not a list with one reward per trajectory"
        if isinstance(value, (ast.Dict, ast.JoinedStr, ast.DictComp, ast.Set, ast.SetComp)):
            return f"`{ast.unparse(value)[:40]}`, not a list with one reward per trajectory"
        return None
    if isinstance(value, ast.Constant) and isinstance(value.value, (str, bytes)):
        return f"text `{ast.unparse(value)[:40]}`, not a number"
    if isinstance(value, ast.Constant) and isinstance(value.value, bool):
        return f"the bool `{value.value}`, not a number"
    if isinstance(value, (ast.JoinedStr, ast.Dict, ast.List, ast.Tuple, ast.Set)):
        what = "an f-string" if isinstance(value, ast.JoinedStr) else f"a {type(value).__name__.lower()}"
        return f"{what} `{ast.unparse(value)[:40]}`, not a number"
    if isinstance(value, (ast.ListComp, ast.DictComp, ast.SetComp, ast.GeneratorExp)):
        return f"a collection `{ast.unparse(value)[:40]}`, not a number"
    if isinstance(value, ast.Call) and qualified(value.func, imports) in NON_NUMBER_CALLS:
        return f"`{ast.unparse(value)[:40]}`, not a number"
    return None


def _reraises(handler: ast.ExceptHandler) -> bool:
    return any(isinstance(n, ast.Raise) for stmt in handler.body for n in ast.walk(stmt))


def _returned_number(handler: ast.ExceptHandler) -> str | None:
    for stmt in handler.body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Return) and isinstance(node.value, ast.Constant):
                value = node.value.value
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    return repr(value)
            if isinstance(node, ast.Return) and isinstance(node.value, ast.UnaryOp):
                return ast.unparse(node.value) if isinstance(node.value.operand, ast.Constant) else None
    return None
