"""Eager start of a call's coroutine in the worker: at once, inside the task that owns it."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine
from typing import Any

import pytest

from plugtune.runtime.worker.eager import start_eagerly

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="-")


async def _quick(log: list[object]) -> int:
    VAR.set("quick")
    log.append(asyncio.current_task())
    return 1


async def _suspends(log: list[object]) -> int:
    VAR.set("slow")
    log.append(("before", VAR.get(), asyncio.current_task()))
    await asyncio.sleep(0.01)
    log.append(("after", VAR.get(), asyncio.current_task()))
    await asyncio.sleep(0)
    return 2


async def _waits_for_cancel(log: list[object]) -> None:
    try:
        await asyncio.sleep(10)
    except asyncio.CancelledError:
        log.append("cancelled")
        raise


async def _times_out_at_its_first_await(log: list[object]) -> str:
    try:
        async with asyncio.timeout(0.01):
            await asyncio.sleep(10)
    except TimeoutError:
        return "timed out"
    return "not timed out"


async def _raises_at_once() -> None:
    raise ValueError("before any await")


async def _start(coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
    """Start it from a loop callback, as the worker does (never from inside another task)."""
    loop = asyncio.get_running_loop()
    started: asyncio.Future[asyncio.Task[Any]] = loop.create_future()
    loop.call_soon(lambda: started.set_result(start_eagerly(loop, coro, contextvars.copy_context())[0]))
    return await started


async def test_a_coroutine_that_never_awaits_runs_at_once_inside_its_task() -> None:
    log: list[object] = []
    loop = asyncio.get_running_loop()
    started: asyncio.Future[tuple[asyncio.Task[Any], bool]] = loop.create_future()
    loop.call_soon(lambda: started.set_result(start_eagerly(loop, _quick(log), contextvars.copy_context())))
    task, finished = await started
    assert finished and log == [task]  # current_task() was the task, though the task had not stepped yet
    assert await task == 1
    assert VAR.get() == "-"  # it ran in its own context


async def test_a_suspended_coroutine_continues_in_the_same_task_and_context() -> None:
    log: list[object] = []
    task = await _start(_suspends(log))
    assert log == [("before", "slow", task)]  # ran up to the first await already
    assert await task == 2 and log[-1] == ("after", "slow", task)
    assert VAR.get() == "-"


@pytest.mark.parametrize("when", ["before its first step", "while it waits"])
async def test_cancelling_the_task_reaches_the_coroutine(when: str) -> None:
    log: list[object] = []
    loop = asyncio.get_running_loop()
    cancelled: asyncio.Future[asyncio.Task[Any]] = loop.create_future()

    def start_and_maybe_cancel() -> None:
        task, finished = start_eagerly(loop, _waits_for_cancel(log), contextvars.copy_context())
        assert not finished
        if when == "before its first step":
            task.cancel()  # the task has not run a step of its own yet
        cancelled.set_result(task)

    loop.call_soon(start_and_maybe_cancel)
    task = await cancelled
    if when == "while it waits":
        await asyncio.sleep(0.01)
        task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert log == ["cancelled"] and task.cancelled()


async def test_asyncio_timeout_as_the_first_await_works_and_fires() -> None:
    assert await (await _start(_times_out_at_its_first_await([]))) == "timed out"


async def test_an_exception_before_the_first_await_finishes_the_task_with_it() -> None:
    task = await _start(_raises_at_once())
    with pytest.raises(ValueError, match="before any await"):
        await task
