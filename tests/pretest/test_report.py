"""The text report: tool calls readable, errors with cause and hint, untrusted text never markup;
the live progress counts rollouts and errors by cause."""

from __future__ import annotations

import io
import json
from typing import Any

from rich.console import Console

from plugtune.pretest.calls import CallError, CallRecord
from plugtune.pretest.progress import LiveProgress
from plugtune.pretest.report import dumps, render_local


def console() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, width=200, highlight=False, color_system=None), buffer


def local_doc() -> dict[str, Any]:
    call = {"id": "c1", "function": {"name": "calculator", "arguments": '{"expression": "3+4"}'}}
    error = {
        "type": "Call plugin error",
        "owner": "plugin",
        "cause": "500",
        "message": "ValueError: bad [bold]markup[/bold]",
        "hint": "The plugin raised an exception.",
        "plugin": "plugins/grader.py:exact",
        "traceback": "grader.py:7 in exact",
    }
    trajectory = {
        "trajectory_id": "s0-p0-r0",
        "sample_index": 0,
        "status": "failed",
        "reward": None,
        "reward_components": {},
        "messages": [
            {"role": "user", "content": "What is 3+4? [red]not markup[/red]"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "7"},
        ],
        "errors": [error],
        "logs": [{"level": "INFO", "plugin": "/p/plugins/rollout.py:solve", "message": "tool call -> 7"}],
    }
    summary = {"trajectories": 1, "calls": 2, "failed_calls": 1, "wall_s": 0.5, "ok": False}
    return {"job": {"name": "demo"}, "policy": "tiny", "trajectories": [trajectory], "summary": summary}


def test_trajectory_is_readable_and_untrusted_text_stays_text() -> None:
    out, buffer = console()
    render_local(out, local_doc())
    text = buffer.getvalue()
    assert '→ calculator({"expression": "3+4"})  [c1]' in text
    assert "tool: [c1] 7" in text
    assert "[red]not markup[/red]" in text and "bad [bold]markup[/bold]" in text
    assert "Call plugin error (plugin): 500" in text and "what to do: The plugin raised" in text
    assert "| grader.py:7 in exact" in text and "rollout.py:solve: tool call -> 7" in text
    assert "FAILED" in text


def record(kind: str, cause: str = "") -> CallRecord:
    error = CallError("Call plugin error", "plugin", cause, "m", "h") if cause else None
    return CallRecord(
        "p.py:f", "f", kind, 0, "t", not cause, 1.0, 1.0, "error" if cause else "success", error=error
    )


def test_live_progress_counts_rollouts_and_errors_by_cause() -> None:
    out, buffer = console()
    with LiveProgress(3, out) as live:
        live.on_call(record("rollout"))
        live.on_call(record("grader", "Invalid reward"))
        live.on_call(record("rollout", "Timeout"))
        task = live.progress.tasks[0]
        assert task.completed == 2 and task.total == 3
        assert task.fields["detail"] == "· 3 calls · 2 errors (Invalid reward 1, Timeout 1)"


def test_json_stays_strict_when_a_plugin_metric_is_nan() -> None:
    text = dumps({"trajectories": [{"metrics": {"turns": float("nan"), "ok": 1.0}}]})
    assert json.loads(text)["trajectories"][0]["metrics"] == {"turns": "nan", "ok": 1.0}
