"""``PolicyBridge``: the only way out of a ``policy-only`` function's network namespace.

Each instance's forwarder (``plugtune.runtime.worker.network``) connects to this Unix socket and
names a target (``"host port\\n"``); the bridge connects there only when one of the function's calls
was given a policy at that address (``allow``) or the function declared it as a dependency
(``declare``: job.yaml ``dependencies:``), else it refuses, with a log line. A plugin that talks to
the socket itself can therefore reach its policy and declared services and nothing else.

A connection to a declared dependency first waits for its :class:`~plugtune.runtime.budget.
DependencyBudget` (``rpm``, ``concurrency``; shared by every bridge of the backend, so by every
instance and plugin of the job): the budget counts connections, not requests (see that module for
what this means with kept-alive connections). ``observe`` feeds each call's outcome back to it
(a 429 halves the concurrency in use, successes add it back).

Each declared dependency has a :class:`~plugtune.runtime.meter.DependencyMeter` of this bridge (so
of this function): the connections let through to it, their durations, and the calls that failed
on it by cause; ``sample()`` gives the period's ``dependency/<name>/...`` values to the function's
metrics.

With ``inject`` set (``plugtune test --faas --inject dependency-429,...``), each connection to a
declared dependency first draws a dependency fault (``FaultInjection.draw_dependency``) and meets it
here instead of the service: a 429 with ``Retry-After: 1`` or a 503 answered once the request has
arrived, a refused connection, or no answer at all. The plugin's own client sees it as from the
service, so the whole path (classification, backoff, budgets, the outage wait) is exercised.

A dependency declared with ``timeout_s`` is held to it here, whatever the plugin's client does: a
connection that cannot be opened in ``timeout_s``, or a request whose reply has not begun
``timeout_s`` after its last bytes went out, is answered ``504`` with :data:`TIMEOUT_HEADER` (read
by the worker as the dependency's ``timeout``) and closed; inside TLS, where no reply can be
made, it is closed, with a log line. It bounds the wait for a reply to begin, not a reply that
streams slowly; the time a connection waits for the dependency's budget is not counted.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any

from plugtune.runtime.backend import Failed, Happened, Returned
from plugtune.runtime.budget import Budgets, DependencyBudget
from plugtune.runtime.dependencies import Dependency
from plugtune.runtime.faults import FaultInjection
from plugtune.runtime.meter import DependencyMeter
from plugtune.runtime.protocol import TYPE_KEY
from plugtune.runtime.reply_end import ReplyEnd
from plugtune.runtime.worker.dependency import TIMEOUT_HEADER
from plugtune.runtime.worker.network import HEADER_MAX, Splice
from plugtune.runtime.zygote_client import worker_env
from plugtune.sdk import Policy

#: ``log(level, text)``: the function's runtime log (the plugin's logs show it).
Log = Callable[[str, str], None]

INJECTED_REQUEST_MAX = 1 << 20  # an injected 429/5xx answers at the request's end or after this much
INJECTED_REPLIES = {
    "dependency-429": (b"429 Too Many Requests", b"Retry-After: 1\r\n", b"rate limited"),
    "dependency-5xx": (b"503 Service Unavailable", b"", b"service unavailable"),
}


PROBE = """
import sys
from plugtune.runtime.worker.network import NetworkUnavailable, unshare_network
try:
    unshare_network(sys.argv[1])
except NetworkUnavailable as exc:
    sys.exit(str(exc))
"""


async def network_problem(mode: str) -> str | None:
    """Why this host cannot give an instance network ``mode`` (None when it can): a short-lived
    process tries what the zygote will, so the deploy fails with the reason, not a crashed import."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        PROBE,
        mode,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=worker_env({}),
        cwd="/",  # `-c` imports from the working folder first (root: never a submitter's folder)
    )
    _, err = await proc.communicate()
    if proc.returncode == 0:
        return None
    text = err.decode(errors="replace").strip()
    return text or f"network: {mode} could not be set up (the probe exited with {proc.returncode})"


class PolicyBridge:
    def __init__(self, log: Log, budgets: Budgets | None = None) -> None:
        self.log = log
        self.budgets = budgets if budgets is not None else Budgets()
        self.allowed: set[tuple[str, int]] = set()
        self.declared: dict[tuple[str, int], str] = {}  # (host, port) -> the dependency's name
        self.timeouts: dict[tuple[str, int], float] = {}  # (host, port) -> its declared timeout_s
        self.tls: set[tuple[str, int]] = set()  # declared with https/wss: no reply can be injected
        self.inject: FaultInjection | None = None  # dependency faults (plugtune test --inject)
        self.by_name: dict[str, DependencyBudget] = {}
        self.meters: dict[str, DependencyMeter] = {}  # by name: one per declared dependency
        self.seen: set[str] = set()
        self.folder = ""
        self.path = ""
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> str:
        """Listen; returns the socket's path (its folder is traversable by a plugin's own uid)."""
        self.folder = tempfile.mkdtemp(prefix=f"plugtune-net-{os.getpid()}-")  # pid: see sandbox.remove_stale
        os.chmod(self.folder, 0o711)
        self.path = os.path.join(self.folder, "policy.sock")
        loop = asyncio.get_running_loop()
        self.server = await loop.create_unix_server(lambda: _Outbound(self), self.path)
        os.chmod(self.path, 0o666)  # instances run as the function's own unprivileged uid
        return self.path

    def declare(self, dependencies: Iterable[Dependency]) -> None:
        """Let the instances reach the function's declared dependencies (by their real host:port)."""
        for dep in dependencies:
            if (dep.host, dep.port) not in self.declared:  # declared again after the decorator's: once
                self.by_name[dep.name] = self.budgets.declare(dep)
                self.meters[dep.name] = DependencyMeter(dep.name, self.by_name[dep.name])
            self.declared[(dep.host, dep.port)] = dep.name
            if dep.timeout_s is not None:
                self.timeouts[(dep.host, dep.port)] = dep.timeout_s
            self.allowed.add((dep.host, dep.port))
            if dep.url.startswith(("https://", "wss://")):
                self.tls.add((dep.host, dep.port))

    def fault_for(self, target: tuple[str, int]) -> str | None:
        """The dependency fault a new connection to ``target`` meets (None: it goes through), said
        in the function's log as injected."""
        name = self.declared.get(target)
        if self.inject is None or name is None:
            return None
        fault = self.inject.draw_dependency()
        if fault is None:
            return None
        if fault in INJECTED_REPLIES and target in self.tls:
            fault = "dependency-unreachable"  # no reply can be made inside its TLS
        self.log(
            "WARNING",
            f"injected fault {fault} (plugtune test --inject): the connection to the dependency {name} "
            f"at {target[0]}:{target[1]} does not reach it",
        )
        return fault

    def observe(self, result: Returned | Failed) -> None:
        """A call's outcome, for the budgets' AIMD and the meters: a call that failed on a dependency
        (or whose plugin raised ``Retry`` on its failure) counts under its cause, and lowers its
        concurrency in use when rate limited; a call that returned otherwise raises those of this
        function's dependencies."""
        failed = failed_on(result)
        if failed is not None:
            cause, name = failed
            budget = self.by_name.get(name)
            if budget is not None and cause == "rate limited":
                budget.rate_limited()
            if name in self.meters:
                self.meters[name].failed(cause)
            return
        if isinstance(result, Failed):
            return
        for budget in self.by_name.values():
            budget.succeeded()

    def sample(self) -> dict[str, float]:
        """Each declared dependency's values over the period since the last sample (see meter)."""
        values: dict[str, float] = {}
        for meter in self.meters.values():
            values.update(meter.sample())
        return values

    def meter_of(self, target: tuple[str, int]) -> DependencyMeter | None:
        name = self.declared.get(target)
        return self.meters.get(name) if name is not None else None

    def allow_args(self, args: Iterable[Any]) -> None:
        """Let the instances reach the policy a call is given (a set lookup once it is known)."""
        for arg in args:
            if isinstance(arg, Policy) and arg.base_url not in self.seen:
                self.seen.add(arg.base_url)
                parts = urllib.parse.urlsplit(arg.base_url)
                port = parts.port or (443 if parts.scheme == "https" else 80)
                self.allowed.add((parts.hostname or "", port))

    def target(self, header: bytes) -> tuple[str, int] | None:
        host, _, port = header.decode("ascii", "replace").strip().partition(" ")
        target = (host, int(port)) if port.isdigit() else None
        if target is None or target not in self.allowed:
            self.log(
                "WARNING",
                f"network policy-only: refused a connection to {host or '?'}:{port or '?'} "
                "(only the policy this function's calls were given and its declared dependencies are "
                "reachable: declare the service in job.yaml `dependencies:`, e.g. "
                f"`judge: http://{host or 'host'}:{port or 'port'}`, or set `network: any`)",
            )
            return None
        return target

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)


def failed_on(result: Returned | Failed) -> tuple[str, str] | None:
    """``(cause, dependency name)`` of a call that failed on a dependency: a Dependency error, or a
    ``Retry`` its plugin raised on the dependency's failure (its status names it); else None."""
    if isinstance(result, Failed):
        if result.happened is not Happened.DEPENDENCY:
            return None
        cause, _, rest = result.cause.partition("/")
        return cause, rest.partition("/")[0]
    value = result.value
    if not isinstance(value, dict) or value.get(TYPE_KEY) != "status" or value.get("status") != "retry":
        return None
    dependency = value.get("dependency")
    if not isinstance(dependency, dict):
        return None
    return str(dependency.get("cause") or ""), str(dependency.get("name") or "")


class _Outbound(Splice):
    """An instance's connection: the first line names the target, the rest is relayed to it."""

    def __init__(self, bridge: PolicyBridge) -> None:
        super().__init__()
        self.bridge = bridge
        self.head = b""
        self.connecting = False
        self.budget: DependencyBudget | None = None  # held while the upstream connection is open
        self.task: asyncio.Task[None] | None = None
        self.last_request = self.last_reply = 0.0  # monotonic times of the last bytes each way
        self.injected: str | None = None  # the dependency fault this connection meets instead
        self.request = b""  # what the plugin sent, for an injected reply (bounded)
        self.meter: DependencyMeter | None = None  # a declared dependency's, once let through
        self.opened_at = 0.0  # monotonic time it was let through
        self.target: tuple[str, int] | None = None
        self.timeout_s: float | None = None  # the declared dependency's, once let through
        self.deadline: asyncio.TimerHandle | None = None
        self.turns = ReplyEnd()  # where each reply ends (a streamed reply's pause is not idleness)

    def idle_for(self, now: float) -> float:
        """Seconds the connection has sat between requests: since its last reply ended, or since it
        was let through when it has sent no request (0 while a reply is awaited or streams). Where
        the reply's framing is unknown (TLS, read to close), since the reply's last bytes when no
        request bytes came after them."""
        if self.opened_at == 0.0:
            return 0.0
        if self.turns.unknown or self.target in self.bridge.tls:
            if self.last_reply > self.last_request:
                return now - self.last_reply
            return now - self.opened_at if not self.asked else 0.0
        if not self.turns.done or self.last_request > self.last_reply:  # (a pipelined request too)
            return 0.0
        return now - max(self.last_reply, self.opened_at)

    @property
    def asked(self) -> bool:
        """Whether the plugin has sent the dependency any request bytes."""
        return self.last_request > 0.0

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self.injected is not None:
            self._injected(data)
            return
        if self.connecting:
            self.turns.request(data)
            if self.peer is None:  # still waiting for the budget or the connection: not counted;
                self.pending.append(data)  # _connect stamps and arms once these bytes go out
                return
            self.last_request = time.monotonic()
            super().data_received(data)
            self._arm()
            return
        self.head += data
        line, newline, rest = self.head.partition(b"\n")
        if not newline:
            if len(self.head) > HEADER_MAX and self.transport is not None:
                self.transport.close()
            return
        self.connecting = True
        target = self.bridge.target(line)
        if target is None:
            if self.transport is not None:
                self.transport.close()
            return
        self.target = target
        self.timeout_s = self.bridge.timeouts.get(target)
        self.injected = self.bridge.fault_for(target)
        if self.injected is not None:
            self._measure(target)
            self._injected(rest)
            if self.injected == "dependency-hang":
                self.last_request = time.monotonic()
                self._arm()  # a hang meets the declared timeout_s as a real one would
            return
        if rest:
            self.turns.request(rest)
            self.pending.append(rest)
        self.task = asyncio.get_running_loop().create_task(self._connect(target))

    def _injected(self, data: bytes) -> None:
        """Meet the injected fault: refused at once, never answered, or a 429/503 once the request
        is in (answering before it could reset the connection under the plugin's own write)."""
        if self.transport is None:
            return
        if self.injected == "dependency-unreachable":
            self.transport.close()
            return
        reply = INJECTED_REPLIES.get(self.injected or "")
        if reply is None:  # dependency-hang: read and drop, answer nothing
            return
        self.request = (self.request + data)[: INJECTED_REQUEST_MAX + 1]
        if not request_complete(self.request):
            return
        status, headers, what = reply
        self.transport.write(
            json_reply(status, headers, what + b" (a fault injected by plugtune test --inject)")
        )
        self.injected = "answered"  # the rest of the plugin's bytes are read and dropped
        self.transport.close()

    def _arm(self) -> None:
        """(Re)start the wait for the reply to begin: ``timeout_s`` from the request's last bytes."""
        if self.timeout_s is None or self.closed:
            return
        if self.deadline is not None:
            self.deadline.cancel()
        self.deadline = asyncio.get_running_loop().call_later(self.timeout_s, self._expire)

    def _expire(self) -> None:
        self.deadline = None
        if self.closed or self.transport is None or self.timeout_s is None:
            return
        if self.last_reply > self.last_request:
            return  # the reply began: no longer waiting (a later request re-arms)
        left = self.last_request + self.timeout_s - time.monotonic()
        if left > 0.001:
            self.deadline = asyncio.get_running_loop().call_later(left, self._expire)
            return
        self.timed_out()

    def timed_out(self) -> None:
        """The dependency outlived its ``timeout_s``: answer the plugin a 504 saying so (or, inside
        TLS, close), say it in the function's log, and close both ends."""
        if self.transport is None or self.closed:
            return
        target = self.target or ("?", 0)
        name = self.bridge.declared.get(target, "?")
        self.bridge.log(
            "WARNING",
            f"the dependency {name} at {target[0]}:{target[1]} did not begin its reply within its "
            f"declared timeout_s ({self.timeout_s:g} s): the request was ended"
            + (" (inside TLS: the connection was closed)" if target in self.bridge.tls else ""),
        )
        if target not in self.bridge.tls:
            bound = f"{self.timeout_s:g}".encode()
            message = b"the dependency %s did not answer within its declared timeout_s (%s s; plugtune)"
            header = b"%s: %s\r\n" % (TIMEOUT_HEADER.encode(), bound)
            self.transport.write(json_reply(b"504 Gateway Timeout", header, message % (name.encode(), bound)))
        self.injected = "answered"  # whatever else arrives is read and dropped
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None
        super().connection_lost(exc)
        if self.task is not None and not self.task.done():
            self.task.cancel()  # the plugin gave up while its connection waited for the budget
        self._release()
        meter, self.meter = self.meter, None
        if meter is not None:
            ended = self.last_reply if self.last_reply > self.opened_at else time.monotonic()
            meter.closed(ended - self.opened_at)

    def _measure(self, target: tuple[str, int]) -> None:
        """The connection goes to ``target`` now: counted by its dependency's meter from here."""
        self.meter = self.bridge.meter_of(target)
        if self.meter is not None:
            self.meter.opening()
            self.opened_at = time.monotonic()

    def _release(self) -> None:
        budget, self.budget = self.budget, None
        if budget is not None:
            budget.release(self)

    async def _connect(self, target: tuple[str, int]) -> None:
        loop = asyncio.get_running_loop()
        budget = self.bridge.budgets.get(target) if target in self.bridge.declared else None
        if budget is not None:
            await budget.acquire()
            if self.closed:
                budget.release()
                return
            self.budget = budget
            budget.hold(self)
        self._measure(target)
        try:
            _, upstream = await asyncio.wait_for(
                loop.create_connection(lambda: _Upstream(self), target[0], target[1]), self.timeout_s
            )
        except TimeoutError:
            self.last_request, self.last_reply = time.monotonic(), 0.0
            self.timed_out()
            self._release()
            return
        except OSError as exc:
            self._release()
            name = self.bridge.declared.get(target)
            what = f"the dependency {name}" if name else "the policy"
            self.bridge.log(
                "WARNING", f"network policy-only: {what} at {target[0]}:{target[1]} is unreachable: {exc}"
            )
            if self.transport is not None:
                self.transport.close()
            return
        sending = bool(self.pending)
        if sending:
            self.last_request = time.monotonic()  # the request goes out now, not when it came in
        self.join(upstream)
        if sending:
            self._arm()


def json_reply(status: bytes, headers: bytes, message: bytes) -> bytes:
    """A whole HTTP/1.1 reply the relay answers in the dependency's place (an injected fault, the
    declared timeout): ``status``, extra ``headers`` (each ending in CRLF), an OpenAI-style error
    body with ``message``, and ``Connection: close``."""
    body = b'{"error": {"message": "%s"}}' % message
    return (
        b"HTTP/1.1 %s\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n"
        b"Connection: close\r\n\r\n%s" % (status, headers, len(body), body)
    )


def request_complete(data: bytes) -> bool:
    """Whether ``data`` holds a whole HTTP/1.1 request (headers, then a ``Content-Length`` or
    chunked body), or more than ``INJECTED_REQUEST_MAX`` bytes of one."""
    if len(data) > INJECTED_REQUEST_MAX:
        return True
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == b"content-length" and value.isdigit():
            length = int(value)
        elif name == b"transfer-encoding" and b"chunked" in value:
            return body.endswith(b"0\r\n\r\n")
    return len(body) >= length


class _Upstream(Splice):
    """The dependency's side: notes when reply bytes last came (for the budget's idle connections)."""

    def __init__(self, owner: _Outbound) -> None:
        super().__init__()
        self.owner = owner

    def data_received(self, data: bytes) -> None:
        self.owner.last_reply = time.monotonic()
        self.owner.turns.reply(data)
        super().data_received(data)
