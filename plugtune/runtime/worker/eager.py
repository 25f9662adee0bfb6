"""Start a coroutine at once, on the caller's stack; a task takes over only if it suspends.

A call that does not await anything (a reward computed from the text) then finishes in the loop
turn that read it, without a task and a second loop turn. This is Python 3.12's eager task start,
for 3.10 and 3.11 as well.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine, Generator
from typing import Any


def start_eagerly(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], context: contextvars.Context
) -> asyncio.Task[Any] | None:
    """Run ``coro`` in ``context`` up to its first suspension; None when it already finished.

    An exception it raises before suspending propagates to the caller.
    """
    try:
        first = context.run(coro.send, None)
    except StopIteration:
        return None
    return context.run(loop.create_task, _resume(coro, first))


async def _resume(coro: Coroutine[Any, Any, Any], first: Any) -> Any:
    return await _Resumed(coro, first)


class _Resumed:
    """Hands the task what the coroutine yielded first, then drives the coroutine as ``await`` would."""

    __slots__ = ("coro", "first")

    def __init__(self, coro: Coroutine[Any, Any, Any], first: Any) -> None:
        self.coro = coro
        self.first = first

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, value = self.coro, self.first
        self.first = None
        while True:
            try:
                sent = yield value
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # noqa: BLE001 - thrown in by the task (cancellation): pass it on
                try:
                    value = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    value = coro.send(sent)
                except StopIteration as stop:
                    return stop.value
