"""Start a call's coroutine at once, on the caller's stack, inside the real task that will own it.

The task is created first and entered as the loop's current task while the coroutine runs up to
its first suspension, so ``asyncio.current_task()`` is that task from the first line of the
plugin: ``asyncio.timeout()``, sniffio (openai, httpx, anyio) and everything else that asks which
task runs work as in any task. A call that does not await anything (a reward computed from the
text) sends its reply in the loop turn that read it; the task only picks up the finished result
in its first step. This is Python 3.12's eager task start, for 3.10 and 3.11 as well.
"""

from __future__ import annotations

import asyncio
import contextvars
from asyncio.tasks import _enter_task, _leave_task
from collections.abc import Coroutine, Generator
from typing import Any

_NOTHING: Any = object()


def start_eagerly(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], context: contextvars.Context
) -> tuple[asyncio.Task[Any], bool]:
    """Run ``coro`` in ``context`` up to its first suspension, as the task returned; the flag says
    whether it already returned (then the task only collects the result in its first step).

    The task finishes with what the coroutine returned or raised, also when it finished (or
    raised) before suspending. Call it outside any task (from a loop callback).
    """
    started = _Started(coro, context)
    task: asyncio.Task[Any] = asyncio.Task(started, loop=loop)
    _enter_task(loop, task)
    try:
        started.step()
    finally:
        _leave_task(loop, task)
    return task, started.result is not _NOTHING


class _Started(Coroutine[Any, Any, Any]):
    """What the task drives: the user's coroutine, whose first step already ran eagerly.

    The task's first ``send(None)`` gets what that step yielded (or its result or exception);
    later sends and throws go straight to the coroutine. A cancel that arrives before the task's
    first step is thrown into the coroutine, which waits at its first ``await``. Every step runs
    in ``context`` (the task's own context is a copy that only its callbacks see; Python 3.10's
    ``Task`` cannot be given one).
    """

    __slots__ = ("coro", "context", "yielded", "result", "error")

    def __init__(self, coro: Coroutine[Any, Any, Any], context: contextvars.Context) -> None:
        self.coro = coro
        self.context = context
        self.yielded: Any = _NOTHING
        self.result: Any = _NOTHING
        self.error: BaseException | None = None

    def step(self) -> None:
        try:
            self.yielded = self.context.run(self.coro.send, None)
        except StopIteration as stop:
            self.result = stop.value
        except BaseException as exc:  # noqa: BLE001 - the task finishes with it
            self.error = exc

    def send(self, value: Any) -> Any:
        if self.yielded is not _NOTHING:
            yielded, self.yielded = self.yielded, _NOTHING
            return yielded
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        if self.result is not _NOTHING:
            result, self.result = self.result, _NOTHING
            raise StopIteration(result)
        return self.context.run(self.coro.send, value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        if self.result is not _NOTHING or self.error is not None:
            return self.send(None)  # finished already: its reply has left, the cancel comes late
        self.yielded = _NOTHING  # the task never waited on it: the coroutine is told instead
        if val is None and tb is None:
            return self.context.run(self.coro.throw, typ)
        return self.context.run(self.coro.throw, typ, val, tb)

    def close(self) -> None:
        self.coro.close()

    def __await__(self) -> Generator[Any, Any, Any]:
        try:
            value = self.send(None)
            while True:
                try:
                    sent = yield value
                except GeneratorExit:
                    self.close()
                    raise
                except BaseException as exc:  # noqa: BLE001 - thrown in by whoever drives us: pass it on
                    value = self.throw(exc)
                else:
                    value = self.send(sent)
        except StopIteration as stop:
            return stop.value
