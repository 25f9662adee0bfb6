"""The supervisor reads an instance's frames by name: a frame that lacks a field (a broken or hostile
instance) kills the instance with the frame and the missing field named, and the function serves on."""

from __future__ import annotations

from pathlib import Path

import pytest

from plugtune.errors import Cause, PluginCallError
from plugtune.runtime import LocalRuntime
from plugtune.sdk import Runtime
from tests.runtime.helpers import ctx, sample, trajectory

# The channel is found as hostile code would find it: the root logger's handler holds it.
SHORT_FRAMES = """
import logging
import time

from plugtune import grader
from plugtune.runtime.protocol import OK, pack


@grader
def short_ok(ctx, sample, trajectory):
    if sample.extra.get("do") == "short":
        channel = logging.getLogger().handlers[0].channel
        channel.send_bytes(pack([OK, ctx.call_id, 1.0]))  # no metrics
        time.sleep(30)
    return 1.0
"""


@pytest.mark.timeout(60)
async def test_a_frame_missing_a_field_kills_its_instance_naming_the_field(tmp_path: Path) -> None:
    plugin = tmp_path / "short_frames.py"
    plugin.write_text(SHORT_FRAMES)
    async with LocalRuntime() as rt:
        fn = await rt.deploy(f"{plugin}:short_ok", runtime=Runtime(timeout_s=20))
        with pytest.raises(PluginCallError) as info:
            await fn.invoke(ctx(), sample(do="short"), trajectory())
        assert info.value.cause == Cause.EOF.value, info.value
        message = str(info.value)
        assert "a frame the supervisor refuses" in message, message
        assert "Ok" in message and "'metrics'" in message, message
        assert (await fn.invoke(ctx(), sample(), trajectory())).value == 1.0  # a new instance serves
