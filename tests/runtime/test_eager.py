"""Eager start of a call's coroutine in the worker: finish at once, or continue as a task."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from plugtune.runtime.worker.eager import start_eagerly

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="-")


async def _quick() -> int:
    VAR.set("quick")
    return 1


async def _suspends(log: list[object]) -> int:
    VAR.set("slow")
    log.append(("before", VAR.get()))
    await asyncio.sleep(0.01)
    log.append(("after", VAR.get()))
    await asyncio.sleep(0)
    return 2


async def _waits_for_cancel(log: list[object]) -> None:
    try:
        await asyncio.sleep(10)
    except asyncio.CancelledError:
        log.append("cancelled")
        raise


async def _raises_at_once() -> None:
    raise ValueError("before any await")


async def test_a_coroutine_that_never_awaits_finishes_without_a_task() -> None:
    assert start_eagerly(asyncio.get_running_loop(), _quick(), contextvars.copy_context()) is None
    assert VAR.get() == "-"  # it ran in its own context


async def test_a_suspended_coroutine_continues_as_a_task_in_its_context() -> None:
    log: list[object] = []
    task = start_eagerly(asyncio.get_running_loop(), _suspends(log), contextvars.copy_context())
    assert task is not None and log == [("before", "slow")]  # ran up to the first await already
    assert await task == 2 and log[-1] == ("after", "slow")
    assert VAR.get() == "-"


async def test_cancelling_the_task_reaches_the_coroutine() -> None:
    log: list[object] = []
    task = start_eagerly(asyncio.get_running_loop(), _waits_for_cancel(log), contextvars.copy_context())
    assert task is not None
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert log == ["cancelled"] and task.cancelled()


async def test_an_exception_before_the_first_await_reaches_the_caller() -> None:
    with pytest.raises(ValueError, match="before any await"):
        start_eagerly(asyncio.get_running_loop(), _raises_at_once(), contextvars.copy_context())
