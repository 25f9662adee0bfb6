"""Issue 23, items 9 and 14 (parts): what a plugin sends and what a client asks is bounded.

A plugin's frames, log lines and log volume per call are capped by the supervisor (the worker runs
the plugin's code, so its own cuts are a courtesy); the policy gateway refuses a request too large
for the context before tokenizing it; the console's Host check parses strictly; the API's OpenAPI
schema documents the errors its routes answer and the values its enum parameters accept.
"""

from __future__ import annotations

import gc
from pathlib import Path

import psutil
import pytest

from plugtune.errors import Cause, PluginCallError
from plugtune.runtime import LocalRuntime
from plugtune.runtime.loglimit import MAX_CALL_CHARS, MAX_CALL_LINES, MAX_LINE_CHARS
from plugtune.runtime.protocol import MAX_FRAME
from plugtune.sdk import Runtime
from tests.runtime.helpers import ctx, sample, trajectory

MiB = 1 << 20

# The channel is found as hostile code would find it: the root logger's handler holds it.
HOSTILE = """
import logging
import struct
import time

from plugtune import grader
from plugtune.runtime.protocol import LOG, pack


def _channel():
    return logging.getLogger().handlers[0].channel


def _raw_log(ctx, text):
    _channel().send_bytes(pack([LOG, time.time(), "INFO", text, "logger", ctx.call_id, ctx.trajectory_id]))


@grader
def warm(ctx, sample, trajectory):
    return 1.0


@grader
def huge_lines(ctx, sample, trajectory):
    line = "x" * (40 << 20)
    ctx.logger.info(line)
    print(line)
    return 1.0


@grader
def raw_flood(ctx, sample, trajectory):
    big = "y" * (20 << 20)
    _raw_log(ctx, big)
    _raw_log(ctx, big)
    for i in range(20_000):
        _raw_log(ctx, f"line {i}")
    return 1.0


@grader
def oversize_frame(ctx, sample, trajectory):
    _channel().send_bytes(struct.pack(">I", 100 << 20) + b"\\x00" * 4096)
    time.sleep(60)
    return 1.0
"""


@pytest.fixture
def hostile(tmp_path: Path) -> str:
    path = tmp_path / "hostile.py"
    path.write_text(HOSTILE)
    return str(path)


def _rss_mib() -> float:
    gc.collect()
    return float(psutil.Process().memory_info().rss / MiB)


@pytest.mark.timeout(60)
async def test_huge_log_lines_are_cut_and_the_supervisor_stays_small(hostile: str) -> None:
    async with LocalRuntime() as rt:
        fn = await rt.deploy(f"{hostile}:huge_lines", runtime=Runtime(memory_mb=1024))
        await fn.invoke(ctx(), sample(), trajectory())  # warm: the runtime's own first-call costs
        before = _rss_mib()
        out = await fn.invoke(ctx(), sample(), trajectory())
        grown = _rss_mib() - before
        lines = [line for line in out.logs if line.message.startswith("xxx")]
        assert len(lines) == 2 and {line.source for line in lines} == {"logger", "stdout"}
        for line in lines:
            assert len(line.message) < MAX_LINE_CHARS + 100
            assert line.message.endswith(
                f"… [truncated {(40 << 20) - MAX_LINE_CHARS:,} characters: "
                f"a log line keeps at most {MAX_LINE_CHARS:,}]"
            )
        stored = sum(len(line.message) for line in fn.logs())
        assert stored < 5 * MAX_LINE_CHARS, stored  # two calls: what a job would store
        assert grown < 30, f"the supervisor grew {grown:.0f} MiB for 80 MiB of log lines"


@pytest.mark.timeout(60)
async def test_a_worker_that_skips_the_cuts_is_cut_and_counted_by_the_supervisor(hostile: str) -> None:
    async with LocalRuntime() as rt:
        fn = await rt.deploy(f"{hostile}:raw_flood", runtime=Runtime(memory_mb=1024))
        out = await fn.invoke(ctx(), sample(), trajectory())
        assert out.value == 1.0
        big = [line for line in out.logs if line.message.startswith("yyy")]
        assert len(big) == 2 and all("… [truncated" in line.message for line in big)
        assert all(len(line.message) < MAX_LINE_CHARS + 100 for line in big)
        kept = [line for line in out.logs if line.message.startswith("line ")]
        assert len(kept) == MAX_CALL_LINES - 2
        (marker,) = [line for line in out.logs if line.source == "runtime"]
        dropped = 20_000 - len(kept)
        assert marker.message.startswith(f"[plugtune dropped {dropped:,} log lines (")
        assert f"at most {MAX_CALL_LINES:,} lines or {MAX_CALL_CHARS:,} characters" in marker.message
        assert marker.call_id == out.call_id and marker.trajectory_id == "traj-1"
        assert sum(len(line.message) for line in fn.logs()) < MAX_CALL_CHARS


@pytest.mark.timeout(60)
async def test_an_oversize_raw_frame_kills_the_instance_with_the_limit_named(hostile: str) -> None:
    async with LocalRuntime() as rt:
        fn = await rt.deploy(f"{hostile}:oversize_frame", runtime=Runtime(timeout_s=40))
        before = _rss_mib()
        with pytest.raises(PluginCallError) as info:
            await fn.invoke(ctx(), sample(), trajectory())
        assert info.value.cause == Cause.EOF.value
        message = str(info.value)
        assert f"a frame of {100 << 20:,} bytes is larger than the limit of {MAX_FRAME:,}" in message
        assert f"at most {MAX_FRAME >> 20} MiB" in message
        assert _rss_mib() - before < 30
        warm = await rt.deploy(f"{hostile}:warm")
        assert (await warm.invoke(ctx(), sample(), trajectory())).value == 1.0  # the supervisor serves on
