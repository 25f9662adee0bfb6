"""``InProcessRuntime``: the same deploy/invoke/close surface, running plugins in the caller.

For fast local tests and ``plugtune test``: no isolation and no memory limit, but the same
validation, statuses and failure causes (``sys.exit`` and injected crashes are reported as EOF,
without ending the caller). A sync function runs on a daemon thread of its own, so a call that
never returns is reported as ``Timeout`` after ``timeout_s`` and abandoned: the caller goes on
and can exit (a thread cannot be killed; a pool's threads would be joined at exit).

Running a sync call on the caller's main thread instead would block its event loop and leave no
way to abandon a hung call, so signal handlers (``signal.signal``: math-verify's default timeouts)
cannot be installed here, although they work in the function runtime with ``max_concurrency: 1``:
such a failure's message says so and points to ``plugtune test --faas``.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import threading
import time
from typing import Any

from plugtune.runtime import protocol as p
from plugtune.runtime.backend import CallRequest, DeployFailed, DeployRequest, Failed, Happened, Returned
from plugtune.runtime.runtime import BaseRuntime
from plugtune.runtime.worker.loader import LoadError, Plugin, load, signal_error_in, user_traceback
from plugtune.sdk import Discard, Kind, PluginSpec, Retry, Runtime
from plugtune.types import LogLine

MAX_LOG_LINES = 20_000


class _ListHandler(logging.Handler):
    def __init__(self, sink: list[LogLine], plugin: str, call_id: str, trajectory_id: str) -> None:
        super().__init__(logging.DEBUG)
        self.sink = sink
        self.plugin = plugin
        self.call_id = call_id
        self.trajectory_id = trajectory_id

    def emit(self, record: logging.LogRecord) -> None:
        self.sink.append(
            LogLine(
                record.created,
                record.levelname,
                self.plugin,
                record.getMessage(),
                "logger",
                self.call_id,
                self.trajectory_id,
                "in-process",
            )
        )


class PluginExit(Exception):
    """``sys.exit`` inside a plugin, carried without ending the caller."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(f"sys.exit({getattr(exc, 'code', None)!r})")
        self.code = getattr(exc, "code", None)
        self.__traceback__ = exc.__traceback__


def _exit_safe(fn: Any, ctx: Any, args: tuple[Any, ...]) -> Any:
    try:
        return fn(ctx, *args)
    except (SystemExit, KeyboardInterrupt) as exc:
        raise PluginExit(exc) from None


async def run_on_daemon_thread(fn: Any, ctx: Any, args: tuple[Any, ...], name: str) -> Any:
    """``fn(ctx, *args)`` on a new daemon thread; cancelling the await abandons the thread."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any, exc: BaseException | None) -> None:
        if done.done():  # timed out (cancelled) before the function returned
            return
        if exc is not None:
            done.set_exception(exc)
        else:
            done.set_result(value)

    def work() -> None:
        value, error = None, None
        try:
            value = _exit_safe(fn, ctx, args)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            error = exc
        try:
            loop.call_soon_threadsafe(settle, value, error)
        except RuntimeError:  # the caller's loop is closed: nobody waits for this call any more
            pass

    threading.Thread(target=work, name=name, daemon=True).start()
    return await done


def signal_hint(max_concurrency: int) -> str:
    """What a sync plugin that installs signal handlers should know about in-process tests."""
    where = (
        "in the function runtime (`plugtune test --faas` and jobs) this plugin runs every call on its "
        "instance's main thread (max_concurrency: 1), where it works: check it with `plugtune test --faas`"
        if max_concurrency == 1
        else f"in the function runtime it fails too, with max_concurrency: {max_concurrency} (pool "
        "threads): set max_concurrency: 1 so that every call runs on the instance's main thread, scale "
        "with max_instances, and check it with `plugtune test --faas`"
    )
    return (
        " (in-process `plugtune test` runs sync plugins on threads of its own, where Python cannot "
        f"install signal handlers, e.g. signal-based timeouts such as math-verify's; {where})"
    )


class InProcessDeployment:
    def __init__(self, plugin: Plugin, runtime: Runtime, entry: str, code_root: str) -> None:
        self.plugin = plugin
        self.spec: PluginSpec = plugin.spec
        self.runtime = runtime
        self.entry = entry
        self.code_root = code_root
        self.semaphore = asyncio.Semaphore(runtime.max_concurrency)
        self.log_lines: collections.deque[LogLine] = collections.deque(maxlen=MAX_LOG_LINES)
        self.in_flight = 0

    async def invoke(self, request: CallRequest) -> Returned | Failed:
        p.encode_args(self.spec.kind, request.args)  # the same argument checks as the local backend
        ctx = request.context
        logs: list[LogLine] = []
        logger = logging.Logger(f"plugtune.plugin.{self.spec.name}")
        logger.addHandler(_ListHandler(logs, self.entry, request.call_id, ctx.trajectory_id))
        call_ctx = type(ctx)(**{**ctx.info(), "call_id": request.call_id, "plugin": self.entry})
        call_ctx.deadline = time.time() + request.timeout_s
        call_ctx.logger = logger
        started = time.perf_counter()
        self.in_flight += 1
        try:
            async with self.semaphore:
                value = await asyncio.wait_for(self._run(call_ctx, request), request.timeout_s)
            result: Returned | Failed = Returned(
                p.encode_result(value), call_ctx.metrics, logs, "in-process", 0.0
            )
        except asyncio.TimeoutError:
            result = Failed(Happened.DEADLINE, f"the call ran past timeout_s={request.timeout_s:g}", logs)
        except BaseException as exc:  # noqa: BLE001 - every failure is classified
            result = self._failure(exc, call_ctx.metrics, logs)
        finally:
            self.in_flight -= 1
        self.log_lines.extend(logs)
        latency = (time.perf_counter() - started) * 1000
        if isinstance(result, Returned):
            return Returned(result.value, result.metrics, logs, "in-process", latency)
        return Failed(result.happened, result.message, logs, result.traceback, "in-process", None, latency)

    async def _run(self, ctx: Any, request: CallRequest) -> Any:
        fault = request.fault
        fn = self.plugin.function
        if fault == "timeout":
            await asyncio.sleep(request.timeout_s + 1.0)
        elif fault == "eof":
            raise PluginExit(SystemExit(71))
        elif fault == "oom":
            raise MemoryError("injected fault: oom (FaultInjection)")
        elif fault == "500":
            raise RuntimeError("injected fault: 500 (FaultInjection)")
        elif fault == "nan" and self.spec.kind is not Kind.ROLLOUT:
            n = len(request.args[1]) if self.spec.kind is Kind.GROUP_GRADER else 0
            return [float("nan")] * n if n else float("nan")
        if self.spec.is_async:
            try:
                return await fn(ctx, *request.args)
            except (SystemExit, KeyboardInterrupt) as exc:  # must not end the caller's event loop
                raise PluginExit(exc) from None
        return await run_on_daemon_thread(fn, ctx, request.args, f"plugtune-inproc-{request.call_id}")

    def _failure(
        self, exc: BaseException, metrics: dict[str, float], logs: list[LogLine]
    ) -> Returned | Failed:
        if isinstance(exc, Retry):
            return Returned(p.encode_status("retry", exc.reason), metrics, logs, "in-process", 0.0)
        if isinstance(exc, Discard):
            return Returned(p.encode_status("discard", exc.reason), metrics, logs, "in-process", 0.0)
        text = f"{type(exc).__name__}: {exc}"
        tb = user_traceback(exc, self.code_root)
        if isinstance(exc, PluginExit):
            return Failed(Happened.DIED, f"the plugin called sys.exit({exc.code!r})", logs, tb)
        if isinstance(exc, MemoryError):
            return Failed(Happened.MEMORY_ERROR, text, logs, tb)
        if not self.spec.is_async and signal_error_in(exc) is not None:
            text += signal_hint(self.runtime.max_concurrency)
        return Failed(Happened.RAISED, text, logs, tb)

    async def scale(self, instances: int) -> None:
        return None

    async def kill(self, instance_id: str | None = None) -> None:
        return None

    def sample(self) -> dict[str, float]:
        return {"instances": 1.0, "concurrency_per_instance": float(self.in_flight), "outbound_bytes": 0.0}

    def logs(self) -> list[LogLine]:
        return list(self.log_lines)

    async def close(self) -> None:
        return None


class InProcessBackend:
    limits_mechanism = "none (in-process)"

    async def deploy(self, request: DeployRequest) -> InProcessDeployment:
        root = str(request.code_root)
        try:
            plugin = load(root, request.relpath, request.function)
        except LoadError as exc:
            raise DeployFailed(exc.message, exc.traceback) from None
        if plugin.setup is not None:
            try:
                result = plugin.setup()
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:  # noqa: BLE001
                raise DeployFailed(
                    f"{request.relpath}: setup() failed: {type(exc).__name__}: {exc}",
                    user_traceback(exc, root),
                ) from None
        return InProcessDeployment(
            plugin, request.effective_runtime(plugin.spec.runtime), request.entry, root
        )

    async def close(self) -> None:
        return None


class InProcessRuntime(BaseRuntime):
    """Runs plugins inside the calling process (no isolation); same API as ``LocalRuntime``."""

    def __init__(self, quota: Any = None, state_dir: Any = None, *, metrics_period_s: float = 5.0) -> None:
        super().__init__(quota, state_dir, metrics_period_s)

    async def start(self) -> None:
        if self.backend is None:
            self.backend = InProcessBackend()
