"""``InProcessRuntime``: the same deploy/invoke/close surface, running plugins in the caller.

For fast local tests, ``plugtune test`` and ``plugtune replay --in-process``: no isolation and no
memory limit, but the same validation, statuses and failure causes (``sys.exit`` and injected
crashes are reported as EOF, without ending the caller). The module is imported and ``setup()``
runs in the caller; each sync call runs in a forked child of it (:mod:`.forked`), so a call past
``timeout_s`` is killed and reported as ``Timeout`` even when it is stuck in C code that holds the
GIL (which would stop the caller's event loop, and its timeouts, if the call ran on a thread here).
As in the function runtime, the child runs the call on its main thread with ``max_concurrency: 1``
(signal handlers work: math-verify's timeouts) and on a thread otherwise. ``async def`` calls run
on the caller's event loop. A plugin whose import or ``setup()`` started CUDA (a reward model on the
GPU) keeps its sync calls on threads here, as before, since a fork cannot use the caller's CUDA: a
timeout still reports them, but cannot end one that holds the GIL (``plugtune test --faas`` can).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from plugtune.runtime import protocol as p
from plugtune.runtime.backend import CallRequest, DeployFailed, DeployRequest, Failed, Happened, Returned
from plugtune.runtime.forked import ChildDied, ChildError, Send, run_forked
from plugtune.runtime.loglimit import clip_line
from plugtune.runtime.runtime import BaseRuntime
from plugtune.runtime.shared_env import SharedEnviron, function_env
from plugtune.runtime.worker.loader import LoadError, Plugin, load, signal_error_in, user_traceback
from plugtune.sdk import Discard, Kind, PluginSpec, Retry, Runtime
from plugtune.types import LogLine

MAX_LOG_LINES = 20_000


class _ListHandler(logging.Handler):
    def __init__(
        self, sink: Callable[[LogLine], None], plugin: str, call_id: str, trajectory_id: str
    ) -> None:
        super().__init__(logging.DEBUG)
        self.sink = sink  # the call's list; in a forked child, the pipe back to the caller
        self.plugin = plugin
        self.call_id = call_id
        self.trajectory_id = trajectory_id

    def emit(self, record: logging.LogRecord) -> None:
        self.sink(
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


@contextlib.contextmanager
def _stderr_as_log_lines(send: Send, handler: _ListHandler) -> Iterator[None]:
    """In a forked call's child: what the call (or a library under it, even from C) writes to
    stderr becomes the call's own log lines (source ``stderr``, WARNING), as an instance's stderr
    is in the function runtime, instead of unattributed text on the test's terminal. Stdout stays
    the terminal's, so ``breakpoint()`` works."""
    _flush_stderr()
    read_fd, write_fd = os.pipe()
    saved = os.dup(2)
    os.dup2(write_fd, 2)
    os.close(write_fd)

    def relay() -> None:
        with os.fdopen(read_fd, "rb") as lines:
            for raw in lines:
                text = raw.decode(errors="replace").rstrip("\n")
                send(
                    LogLine(
                        time.time(),
                        "WARNING",
                        handler.plugin,
                        clip_line(text),
                        "stderr",
                        handler.call_id,
                        handler.trajectory_id,
                        "in-process",
                    )
                )

    reader = threading.Thread(target=relay, name="plugtune-inproc-stderr", daemon=True)
    reader.start()
    python_stderr = sys.stderr  # may write elsewhere than fd 2 (a test's capture): this child's is fd 2
    sys.stderr = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")  # noqa: SIM115
    try:
        yield
    finally:
        _flush_stderr()
        sys.stderr = python_stderr
        os.dup2(saved, 2)  # the pipe's last writer closes: the relay reads to its end
        os.close(saved)
        reader.join(5)


def _flush_stderr() -> None:
    try:
        sys.stderr.flush()
    except Exception:  # noqa: BLE001, S110 - a closed or odd stream: nothing to flush
        pass


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


def is_cuda_initialized() -> bool:
    """Has this process started CUDA (through torch)? A forked child cannot use it then."""
    torch = sys.modules.get("torch")
    try:
        return torch is not None and bool(torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - a broken or partial torch: no CUDA to speak of
        return False


async def run_on_daemon_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` on a new daemon thread; cancelling the await abandons the thread (it cannot be
    killed, and a call that holds the GIL stops this process's event loop until it returns)."""
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
            value = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            error = exc
        try:
            loop.call_soon_threadsafe(settle, value, error)
        except RuntimeError:  # the caller's loop is closed: nobody waits for this call any more
            pass

    threading.Thread(target=work, name="plugtune-inproc-call", daemon=True).start()
    return await done


def _returned(value: Any, ctx: Any) -> Returned:
    return Returned(p.encode_result(value), ctx.metrics, [], "in-process", 0.0)


def signal_hint(exc: BaseException, max_concurrency: int) -> str:
    """What a sync plugin that installs signal handlers off the main thread should do about it."""
    found = signal_error_in(exc)
    if found is None or max_concurrency == 1:
        return ""
    cause = "" if found is exc else f"; the error's cause: {type(found).__name__}: {found}"
    return (
        f" (this sync plugin has max_concurrency: {max_concurrency}, so its calls run on pool threads, "
        "here as in the function runtime, where Python cannot install signal handlers, e.g. "
        "signal-based timeouts such as math-verify's: set max_concurrency: 1 in its Runtime so that "
        f"every call runs on the instance's main thread, and scale with max_instances instead{cause})"
    )


class InProcessDeployment:
    def __init__(
        self,
        plugin: Plugin,
        runtime: Runtime,
        entry: str,
        code_root: str,
        env: dict[str, str],
        environ: SharedEnviron,
    ) -> None:
        self.plugin = plugin
        self.env = env
        self.environ = environ
        self.spec: PluginSpec = plugin.spec
        self.runtime = runtime
        self.entry = entry
        self.code_root = code_root
        self.semaphore = asyncio.Semaphore(runtime.max_concurrency)
        self.log_lines: collections.deque[LogLine] = collections.deque(maxlen=MAX_LOG_LINES)
        self.in_flight = 0
        self.holds_cuda = False  # its import or setup() started CUDA here, which a fork cannot use

    async def invoke(self, request: CallRequest) -> Returned | Failed:
        p.encode_args(self.spec.kind, request.args)  # the same argument checks as the local backend
        ctx = request.context
        logs: list[LogLine] = []
        handler = _ListHandler(logs.append, self.entry, request.call_id, ctx.trajectory_id)
        logger = logging.Logger(f"plugtune.plugin.{self.spec.name}")
        logger.addHandler(handler)
        call_ctx = type(ctx)(**{**ctx.info(), "call_id": request.call_id, "plugin": self.entry})
        call_ctx.deadline = time.time() + request.timeout_s
        call_ctx.logger = logger
        started = time.perf_counter()
        self.in_flight += 1
        try:
            async with self.semaphore:
                result = await asyncio.wait_for(self._run(call_ctx, request, handler), request.timeout_s)
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

    async def _run(self, ctx: Any, request: CallRequest, handler: _ListHandler) -> Returned | Failed:
        fault = request.fault
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
            return _returned([float("nan")] * n if n else float("nan"), ctx)
        if not self.spec.is_async and self.holds_cuda:  # a timeout cannot end a call that holds the GIL
            with self.environ.held(self.env):
                return _returned(await run_on_daemon_thread(self._call_sync, ctx, request.args), ctx)
        if not self.spec.is_async:
            return await self._call_in_child(ctx, request.args, handler)
        try:
            with self.environ.held(self.env):
                return _returned(await self.plugin.function(ctx, *request.args), ctx)
        except (SystemExit, KeyboardInterrupt) as exc:  # must not end the caller's event loop
            raise PluginExit(exc) from None

    async def _call_in_child(
        self, ctx: Any, args: tuple[Any, ...], handler: _ListHandler
    ) -> Returned | Failed:
        """A sync call in a forked child, its log lines sent back as they are written."""
        logs = handler.sink

        def work(send: Send) -> Returned | Failed:
            handler.sink = send
            os.environ.update(self.env)
            with _stderr_as_log_lines(send, handler):
                try:
                    return _returned(self._call_sync(ctx, args), ctx)
                except BaseException as exc:  # noqa: BLE001 - every failure is classified
                    return self._failure(exc, ctx.metrics, [])

        try:
            outcome: Returned | Failed = await run_forked(work, logs)
        except ChildDied as exc:
            return Failed(Happened.DIED, str(exc), [])
        except ChildError as exc:
            return Failed(Happened.RAISED, str(exc), [])
        return outcome

    def _call_sync(self, ctx: Any, args: tuple[Any, ...]) -> Any:
        """On this (the child's main) thread with max_concurrency: 1, else on a thread of its own:
        where the function runtime runs it, so that signal handlers work, or fail, as they will there."""
        fn = self.plugin.function
        if self.runtime.max_concurrency == 1:
            return _exit_safe(fn, ctx, args)
        ended: list[tuple[bool, Any]] = []

        def call() -> None:
            try:
                ended.append((True, _exit_safe(fn, ctx, args)))
            except BaseException as exc:  # noqa: BLE001 - raised again below
                ended.append((False, exc))

        thread = threading.Thread(target=call, name="plugtune-inproc-call")
        thread.start()
        thread.join()
        returned, value = ended[0]
        if not returned:
            raise value
        return value

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
        if not self.spec.is_async:
            text += signal_hint(exc, self.runtime.max_concurrency)
        if "Cannot re-initialize CUDA in forked subprocess" in text:
            text += (
                " (in-process, each sync call runs in a forked child of this process, which cannot use "
                "CUDA once this process has (the policy's model): load the model in setup(), so that "
                "its calls run on threads here, or test it with `plugtune test --faas`)"
            )
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

    def __init__(self) -> None:
        self.environ = SharedEnviron()

    async def deploy(self, request: DeployRequest) -> InProcessDeployment:
        """Import the plugin and run its ``setup()`` here, with its ``env`` set while they run."""
        env = function_env(request.env)
        self.environ.check(env)
        cuda_before = is_cuda_initialized()
        with self.environ.held(env):
            plugin = await _load(request)
        runtime = request.effective_runtime(plugin.spec.runtime)
        deployment = InProcessDeployment(
            plugin, runtime, request.entry, str(request.code_root), env, self.environ
        )
        deployment.holds_cuda = is_cuda_initialized() and not cuda_before
        return deployment

    async def close(self) -> None:
        return None


async def _load(request: DeployRequest) -> Plugin:
    root = str(request.code_root)
    try:
        plugin = load(root, request.relpath, request.function, request.adapt)
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
    return plugin


class InProcessRuntime(BaseRuntime):
    """Runs plugins inside the calling process (no isolation); same API as ``LocalRuntime``."""

    def __init__(self, quota: Any = None, state_dir: Any = None, *, metrics_period_s: float = 5.0) -> None:
        super().__init__(quota, state_dir, metrics_period_s)

    async def start(self) -> None:
        if self.backend is None:
            self.backend = InProcessBackend()
