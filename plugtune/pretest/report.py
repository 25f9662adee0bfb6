"""The report of ``plugtune test`` (local or ``--faas``): one JSON document, and its text rendering.

Everything a plugin, a dataset or a model wrote is printed as plain text (no console markup).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from plugtune.errors import ErrorType
from plugtune.pretest import summary as s
from plugtune.pretest.calls import CallRecord
from plugtune.pretest.trial import TrialResult
from plugtune.types import LogLine, TrajectoryRecord

MAX_CONTENT_CHARS = 2000


def build_summary(result: TrialResult, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    calls = result.calls
    failed = [c for c in calls if c.error is not None]
    out: dict[str, Any] = {
        "calls": len(calls),
        "failed_calls": len(failed),
        "trajectories": len(result.trajectories),
        "failed_trajectories": sum(1 for t in result.trajectories if t.status == "failed"),
        "ok": not failed and all(t.status != "failed" for t in result.trajectories),
        "wall_s": round(result.wall_s, 3),
        "qps": round(len(calls) / result.wall_s, 3) if result.wall_s > 0 else 0.0,
        "latency": s.latency(calls),
        "errors_by_cause": s.errors_by_cause(calls),
        "dependency_errors": s.dependency_errors(calls),
        "plugin_metrics": s.plugin_metrics(calls),
        "plugins": [s.plugin_summary(fn, calls, result.wall_s) for fn in result.functions],
    }
    out.update(extra or {})
    return out


def trajectory_document(record: TrajectoryRecord, logs: Sequence[LogLine]) -> dict[str, Any]:
    return {
        "trajectory_id": record.trajectory_id,
        "sample_index": record.sample_index,
        "status": record.status,
        "reward": record.reward,
        "reward_components": record.reward_components,
        "messages": record.messages,
        "metrics": record.metrics,
        "errors": [e.__dict__ for e in record.errors],
        "logs": [line.to_dict() for line in logs],
    }


def logs_of(record: TrajectoryRecord, result: TrialResult) -> list[LogLine]:
    """Every plugin's lines about one trajectory (a retried rollout's ``id.N`` ids included) and
    its group graders' lines (a group call belongs to no one trajectory), by time."""
    tid = record.trajectory_id
    lines = [
        line
        for fn in result.functions
        for line in fn.logs
        if line.trajectory_id == tid or line.trajectory_id.startswith(tid + ".")
    ]
    lines += [
        line
        for call in result.calls
        if call.kind == "group_grader"
        and (call.step, call.sample_index) == (record.step, record.sample_index)
        for line in call.logs
    ]
    return sorted(lines, key=lambda line: line.time)


def document(
    mode: str, result: TrialResult, header: dict[str, Any], extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The ``--json`` document: ``{"mode", ..., "calls": [...], "summary": {...}}``."""
    doc: dict[str, Any] = {"mode": mode, **header}
    doc["calls"] = [c.to_dict() for c in sorted(result.calls, key=lambda c: c.started)]
    if mode == "local":
        doc["trajectories"] = [trajectory_document(t, logs_of(t, result)) for t in result.trajectories]
    doc["summary"] = build_summary(result, extra)
    return doc


def dumps(doc: dict[str, Any]) -> str:
    """Strict JSON: a NaN or inf a plugin wrote (say, with ``ctx.metric``) becomes its string."""
    return json.dumps(_finite(doc), indent=2, default=str, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


# --- text --------------------------------------------------------------------------------------


def render_error(console: Console, error: dict[str, Any], indent: str = "  ") -> None:
    """type (owner): cause — message, the hint, and the traceback when there is one."""
    head = Text(indent)
    what = f"{error.get('type')} ({error.get('owner', 'plugin')}): {error.get('cause')}"
    head.append(what, style="bold red")
    if error.get("plugin"):
        head.append(f"  [{error['plugin']}]", style="dim")
    console.print(head)
    console.print(Text(f"{indent}  {error.get('message', '')}"))
    if error.get("hint"):
        console.print(Text(f"{indent}  what to do: {error['hint']}", style="yellow"))
    if error.get("traceback"):
        for line in str(error["traceback"]).splitlines():
            console.print(Text(f"{indent}  | {line}", style="dim"))


def render_message(console: Console, message: dict[str, Any]) -> None:
    role = str(message.get("role", "?"))
    style = {"user": "cyan", "assistant": "green", "tool": "magenta", "system": "blue"}.get(role, "")
    line = Text("    ")
    line.append(f"{role:>9}: ", style=f"bold {style}".strip())
    content = message.get("content")
    text = content if isinstance(content, str) else json.dumps(content) if content else ""
    if role == "tool" and message.get("tool_call_id"):
        line.append(f"[{message['tool_call_id']}] ", style="dim")
    line.append(_clip(text))
    console.print(line)
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        tool = Text("               → ")
        tool.append(f"{function.get('name', '?')}({function.get('arguments', '')})", style="magenta")
        if call.get("id"):
            tool.append(f"  [{call['id']}]", style="dim")
        console.print(tool)


def render_trajectory(console: Console, t: dict[str, Any]) -> None:
    ok = t["status"] == "success"
    head = Text(f"● {t['trajectory_id']}  sample {t['sample_index']}  ", style="bold")
    head.append(t["status"], style="green" if ok else "red")
    reward = "-" if t["reward"] is None else f"{t['reward']:.4g}"
    parts = ", ".join(
        f"{name}={'None' if v is None else f'{v:.4g}'}" for name, v in t["reward_components"].items()
    )
    head.append(f"  reward {reward}" + (f" ({parts})" if parts else ""))
    console.print(head)
    own = {k: v for k, v in (t.get("metrics") or {}).items() if not k.startswith("history/")}
    if own:
        console.print(
            Text("    metrics: " + ", ".join(f"{k}={v:.4g}" for k, v in sorted(own.items())), style="dim")
        )
    for message in t["messages"]:
        render_message(console, message)
    for line in t["logs"]:
        stamp = Text(f"    log {line['level']:<7} ", style="dim")
        stamp.append(f"{_short(line['plugin'])}: ", style="dim")
        stamp.append(_clip(line["message"]))
        console.print(stamp)
    for error in t["errors"]:
        render_error(console, error, indent="    ")
    console.print()


def render_local(console: Console, doc: dict[str, Any]) -> None:
    console.print(Text(f"plugtune test: {doc['job']['name']} — policy {doc['policy']}", style="bold"))
    console.print(Text("plugins ran in this process, unsandboxed (--faas: in the sandbox)", style="dim"))
    console.print()
    for t in doc["trajectories"]:
        render_trajectory(console, t)
    summary = doc["summary"]
    render_plugin_metrics(console, summary.get("plugin_metrics") or {})
    verdict = "all calls succeeded" if summary["ok"] else "FAILED"
    console.print(
        Text(
            f"{summary['trajectories']} trajectories, {summary['calls']} calls, "
            f"{summary['failed_calls']} failed, {summary['wall_s']:.2f} s — {verdict}",
            style="bold green" if summary["ok"] else "bold red",
        )
    )


def render_faas(console: Console, doc: dict[str, Any]) -> None:
    summary = doc["summary"]
    console.print(
        Text(
            f"plugtune test --faas: {doc['job']['name']} — {summary['calls']} calls in "
            f"{summary['wall_s']:.2f} s "
            f"at concurrency {summary['concurrency']} (limits: {summary['limits']})",
            style="bold",
        )
    )
    if summary.get("injection"):
        inj = summary["injection"]
        console.print(Text(f"injected faults: {', '.join(inj['faults'])} on {inj['rate']:.0%} of calls"))
    console.print(_plugins_table(summary["plugins"]))
    for plugin in summary["plugins"]:
        blocking = plugin["event_loop_blocking"]
        if blocking["count"]:
            what = f"event-loop blocking: {plugin['name']} — {blocking['count']} warning(s)"
            console.print(Text(what, style="yellow"))
            for line in blocking["first"].splitlines():
                console.print(Text(f"  | {line}", style="dim"))
    for cause, first in summary["errors_by_cause"].items():
        if first["type"] == ErrorType.DEPENDENCY.value:
            continue  # below, by dependency
        what = f"\n{cause}: {first['count']} call(s); first in {first['plugin']}"
        console.print(Text(what, style="bold red"))
        render_error(console, {**first, "cause": cause})
    deps = summary["dependency_errors"]
    _render_dependency_errors(console, deps)
    render_plugin_metrics(console, summary.get("plugin_metrics") or {})
    _render_demand(console, summary["demand"])
    ok = summary["ok"]
    verdict = "\nall calls succeeded" if ok else "\nFAILED"
    if not ok and deps["calls"] and not deps["plugin_errors"]:
        verdict += " (on dependencies: the services the plugins call, not the plugins' code)"
    console.print(Text(verdict, style="bold green" if ok else "bold red"))


def _render_dependency_errors(console: Console, deps: dict[str, Any]) -> None:
    """The calls that failed on a service the plugins call, by dependency and cause, apart from the
    plugins' own errors (build_summary's ``dependency_errors``)."""
    if not deps["calls"]:
        return
    console.print(
        Text(
            f"\ndependency errors: {deps['calls']} call(s) failed on services the plugins call, not on "
            f"their code (plugin errors: {deps['plugin_errors']})",
            style="bold red",
        )
    )
    for name, causes in deps["by_dependency"].items():
        counts = ", ".join(f"{cause} {first['count']}" for cause, first in causes.items())
        console.print(Text(f"  {name}: {counts}"))
        for cause, first in causes.items():
            console.print(Text(f"    {cause}, first in {first['plugin']}: {_clip(first['message'])}"))
            console.print(Text(f"    what to do: {first['hint']}", style="dim"))


def render_plugin_metrics(console: Console, found: dict[str, dict[str, dict[str, float]]]) -> None:
    """Each plugin's ``ctx.metric`` names over the test's calls, as a job's curves will show them."""
    if not found:
        return
    console.print(
        Text("plugin metrics (ctx.metric over the calls; a job draws these per step):", style="bold")
    )
    for plugin, names in found.items():
        for name, v in names.items():
            console.print(
                Text(
                    f"  {plugin} {name}: mean {v['mean']:.4g}, min {v['min']:.4g}, max {v['max']:.4g} "
                    f"({v['count']:.0f} values)"
                )
            )
    console.print()


def _plugins_table(plugins: list[dict[str, Any]]) -> Table:
    title = "plugins (latency in ms; peak memory / limit in MiB)"
    table = Table(title=title, title_justify="left", box=box.SIMPLE)
    columns = ("plugin", "kind", "calls", "failed", "QPS", "p50", "p95", "p99", "mem/lim", "inst.")
    for column in columns:
        table.add_column(column, justify="left" if column in ("plugin", "kind") else "right")
    for p in plugins:
        lat, mem = p["latency"], p["memory"]
        peak = "-" if mem["peak_mb"] is None else f"{mem['peak_mb']:.0f}"
        table.add_row(
            Text(p["name"]),
            p["kind"],
            str(p["calls"]),
            str(p["failed"]),
            f"{p['qps']:.2f}",
            f"{lat['p50_ms']:.0f}",
            f"{lat['p95_ms']:.0f}",
            f"{lat['p99_ms']:.0f}",
            f"{peak}/{mem['limit_mb']:.0f}",
            str(p["instances_used"]),
        )
    return table


def _render_demand(console: Console, d: dict[str, Any]) -> None:
    verdict = "keeps up" if d["keeps_up"] else "does NOT keep up"
    console.print(
        Text(
            f"\ntrainer demand: {d['rollouts_per_step']} rollouts per step; capacity {d['capacity']}; "
            f"measured {d['measured_qps']:.2f} rollouts/s, needed {d['needed_qps']:.2f}/s "
            f"(p95 in the function {d['service_time_p95_ms']:.0f} ms, "
            f"p95 wait {d['queue_wait_p95_ms']:.0f} ms) — {verdict}",
            style="green" if d["keeps_up"] else "yellow",
        )
    )
    if d.get("suggestion"):
        console.print(Text(f"  suggestion: {d['suggestion']}", style="yellow"))
    for dep in d.get("dependencies", ()):
        _render_dependency_demand(console, dep, d["needed_qps"])
    if d.get("note"):
        console.print(Text(f"  note: {d['note']}", style="dim"))


def _render_dependency_demand(console: Console, dep: dict[str, Any], needed_qps: float) -> None:
    """One line per declared dependency: what the trainer's pace asks of it against its budget."""
    per = dep["requests_per_rollout"]
    line = f"  dependency {dep['name']}: {per:.2f} requests per rollout"
    if dep["rpm"] is None:
        line += f", {dep['needed_rpm']:.0f}/min at the trainer's pace; no rpm declared"
    else:
        pace = f"the trainer's pace ({needed_qps:.2f} rollouts/s)"
        line += f"; {pace} needs {dep['needed_rpm']:.0f}/min, rpm {dep['rpm']}"
        if dep["rpm_sets_pace"]:
            line += (
                f" allows {dep['allowed_qps']:.2f} rollouts/s — the budget, not the runtime, sets the "
                "pace (raise the dependency's rpm if its service allows)"
            )
        else:
            line += " — within budget"
    if dep["concurrency_full"]:
        line += f"; all of its concurrency {dep['concurrency']} was in use: calls waited for it"
    if dep["rate_limited"]:
        line += f"; it answered 429 {dep['rate_limited']} time(s)"
    warn = dep["rpm_sets_pace"] or dep["concurrency_full"] or dep["rate_limited"]
    console.print(Text(line, style="yellow" if warn else "green"))


def _clip(text: str) -> str:
    return text if len(text) <= MAX_CONTENT_CHARS else text[:MAX_CONTENT_CHARS] + f"… ({len(text)} chars)"


def _short(entry: str) -> str:
    path, _, function = entry.rpartition(":")
    return f"{path.rsplit('/', 1)[-1]}:{function}" if path else entry


__all__ = ["CallRecord", "build_summary", "document", "dumps", "render_faas", "render_local", "render_replay"]


def render_replay(console: Console, doc: dict[str, Any]) -> None:
    """The replayed trajectory, then the recorded and replayed outcomes side by side."""
    turns = doc["policy_turns"]
    console.print(
        Text(
            f"plugtune replay: job {doc['job_id']} trajectory {doc['trajectory_id']} — "
            f"{turns['played']}/{turns['recorded']} recorded policy turns played back",
            style="bold",
        )
    )
    sandbox = str(doc.get("sandbox") or "")
    if sandbox:
        console.print(Text(f"sandbox: {sandbox}", style="yellow" if sandbox.startswith("none") else "dim"))
    console.print()
    render_trajectory(console, doc["trajectory"])
    for name in ("recorded", "replayed"):
        o = doc[name]
        line = Text(f"{name:>9}: {o['status']}")
        if o["error"]:
            line.append(f" — {_failure(o)}")
        else:
            line.append(f" — reward {o['reward']}")
        console.print(line)
    for divergence in doc["divergences"]:
        console.print(Text(f"  divergence: {divergence}", style="yellow"))
    said, style = verdict_line(doc)
    console.print(Text(said, style=style))
    if doc["verdict"] == "failed differently":
        for name in ("recorded", "replayed"):
            console.print(Text(f"  {name} message: {doc[name]['error']['message']}"))


def verdict_line(doc: dict[str, Any]) -> tuple[str, str]:
    """The replay's verdict in one line, and its style."""
    recorded, replayed = doc["recorded"], doc["replayed"]
    found = doc["verdict"]
    if found == "reproduced":
        return "reproduced: the replay ends as the job's trajectory did", "bold green"
    if found == "failed differently":
        return (
            f"failed differently: recorded {_failure(recorded)}, replay {_failure(replayed)}",
            "bold red",
        )
    if found == "did not reproduce":
        return (
            f"did not reproduce: the job's trajectory failed ({_failure(recorded)}), the replay ended "
            f"{_ending(replayed)}; the failure needs what a replay does not recreate (load, timing, limits, "
            "the instance's state): try `plugtune test --faas`",
            "bold yellow",
        )
    return f"ended differently: recorded {_ending(recorded)}, replay {_ending(replayed)}", "bold red"


def _failure(outcome: dict[str, Any]) -> str:
    error = outcome["error"]
    if error is None:
        return outcome["status"]
    raised = f" ({error['raised']})" if error.get("raised") else ""
    return f"{error['type']}: {error['cause']}{raised} in {_short(error['plugin'])}"


def _ending(outcome: dict[str, Any]) -> str:
    if outcome["error"] is not None:
        return f"{outcome['status']} ({_failure(outcome)})"
    return f"{outcome['status']} (reward {outcome['reward']})"
