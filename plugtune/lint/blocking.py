"""PT101: calls that block the event loop inside ``async def``.

An ``async def`` plugin runs on its instance's event loop next to up to ``max_concurrency`` other
calls; one blocking call stalls all of them, and they end as ``Timeout``.
"""

from __future__ import annotations

import ast

from plugtune.lint.findings import ASYNC_FIX, Finding, finding
from plugtune.lint.names import own_nodes, qualified

SLEEP = "use `await asyncio.sleep(...)`"
HTTP = "use `httpx.AsyncClient` (or aiohttp)"
PROCESS = "use `await asyncio.create_subprocess_exec(...)`"
OPENAI = "use `openai.AsyncOpenAI` / `policy.async_openai()`"
SOCKET = "use `asyncio.open_connection(...)` / `loop.getaddrinfo(...)`"

#: Qualified call names that block, and the async alternative.
EXACT: dict[str, str] = {
    "time.sleep": SLEEP,
    "subprocess.run": PROCESS,
    "subprocess.call": PROCESS,
    "subprocess.check_call": PROCESS,
    "subprocess.check_output": PROCESS,
    "os.system": PROCESS,
    "httpx.Client": HTTP,
    "openai.OpenAI": OPENAI,
    "openai.AzureOpenAI": OPENAI,
    "socket.create_connection": SOCKET,
    "socket.getaddrinfo": SOCKET,
    "socket.gethostbyname": SOCKET,
    "socket.gethostbyname_ex": SOCKET,
    "socket.gethostbyaddr": SOCKET,
    "socket.getfqdn": SOCKET,
    "input": "read what you need before the job starts: a plugin has no terminal",
}
for _verb in ("get", "post", "put", "patch", "delete", "head", "options", "request", "stream"):
    EXACT[f"httpx.{_verb}"] = HTTP

#: Qualified name prefixes whose every call blocks.
PREFIXES: dict[str, str] = {"requests.": HTTP, "urllib.request.": HTTP, "urllib3.": HTTP}

#: Methods of a blocking socket object.
SOCKET_METHODS = {
    "recv",
    "recv_into",
    "recvfrom",
    "send",
    "sendall",
    "sendto",
    "connect",
    "accept",
    "makefile",
}
SOCKET_MAKERS = {"socket.socket", "socket.create_connection", "socket.socketpair"}

#: Blocking methods of the SDK's Policy, and their async forms.
POLICY_METHODS = {"chat": "use `await policy.achat(...)`", "openai": "use `policy.async_openai()`"}


def check_blocking(tree: ast.AST, imports: dict[str, str], file: str) -> list[Finding]:
    """Every blocking call made directly in the body of an ``async def`` in ``tree``."""
    out: list[Finding] = []
    for fn in ast.walk(tree):
        if isinstance(fn, ast.AsyncFunctionDef):
            out.extend(_check_function(fn, imports, file))
    return out


def _check_function(fn: ast.AsyncFunctionDef, imports: dict[str, str], file: str) -> list[Finding]:
    nodes = own_nodes(fn)
    sockets = _socket_names(nodes, imports)
    policy = _policy_name(fn)
    out: list[Finding] = []
    for node in nodes:
        if not isinstance(node, ast.Call):
            continue
        found = _blocking(node, imports, sockets, policy)
        if found is not None:
            what, alternative = found
            message = f"`{what}` blocks the event loop inside `async def {fn.name}`"
            out.append(finding(file, node, "PT101", message, f"{alternative}, {ASYNC_FIX}"))
    return out


def _blocking(
    call: ast.Call, imports: dict[str, str], sockets: set[str], policy: str | None
) -> tuple[str, str] | None:
    name = qualified(call.func, imports)
    if name is not None:
        if name in EXACT and not (name == "input" and "input" in imports):
            return name, EXACT[name]
        for prefix, alternative in PREFIXES.items():
            if name.startswith(prefix):
                return name, alternative
    func = call.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        owner, method = func.value.id, func.attr
        if owner in sockets and method in SOCKET_METHODS:
            return f"{owner}.{method}", SOCKET
        if owner == policy and method in POLICY_METHODS:
            return f"{owner}.{method}", POLICY_METHODS[method]
    return None


def _socket_names(nodes: list[ast.AST], imports: dict[str, str]) -> set[str]:
    """Local names bound to a blocking socket (``s = socket.socket()``, ``with ... as s``)."""
    names: set[str] = set()
    for node in nodes:
        pairs: list[tuple[ast.AST, ast.AST | None]] = []
        if isinstance(node, ast.Assign):
            pairs = [(target, node.value) for target in node.targets]
        elif isinstance(node, ast.withitem):
            pairs = [(node.optional_vars, node.context_expr)] if node.optional_vars else []
        for target, value in pairs:
            if isinstance(target, ast.Name) and isinstance(value, ast.Call):
                if qualified(value.func, imports) in SOCKET_MAKERS:
                    names.add(target.id)
    return names


def _policy_name(fn: ast.AsyncFunctionDef) -> str | None:
    """The parameter that holds the rollout's Policy: ``policy``, or the 2nd of ``(ctx, p, sample)``."""
    params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    if "policy" in params:
        return "policy"
    if len(params) == 3 and params[0] == "ctx" and params[2] == "sample":
        return params[1]
    return None
