"""``CallRecord`` and the recording caller: every plugin call a test makes, timed, with its error."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from plugtune.errors import PluginCallError
from plugtune.jobs.plugins import JobFunction
from plugtune.sdk import Context, PluginSpec
from plugtune.types import CallOutcome, LogLine


@dataclass(frozen=True)
class CallError:
    """A failed call in the taxonomy's words (DESIGN §2)."""

    type: str
    owner: str
    cause: str
    message: str
    hint: str
    traceback: str = ""
    peak_memory_mb: float | None = None
    dependency: str = ""  # a Dependency error's service, as job.yaml declares it ("" when undeclared)

    @classmethod
    def of(cls, exc: PluginCallError) -> CallError:
        return cls(
            exc.type,
            exc.owner,
            exc.cause,
            exc.message,
            exc.hint,
            exc.traceback,
            exc.peak_memory_mb,
            str(getattr(exc, "dependency", "") or ""),
        )

    def to_dict(self) -> dict[str, Any]:
        out = {
            "type": self.type,
            "owner": self.owner,
            "cause": self.cause,
            "message": self.message,
            "hint": self.hint,
            "traceback": self.traceback,
        }
        if self.owner == "dependency":
            out["dependency"] = self.dependency
        return out


@dataclass(frozen=True)
class CallRecord:
    """One plugin call: which plugin (its entry, ``file.py:function``), which sample, how it went."""

    plugin: str
    name: str
    kind: str
    sample_index: int
    trajectory_id: str
    ok: bool
    latency_ms: float
    service_ms: float  # time inside the function, as the runtime measured it (0 when it failed)
    status: str  # the plugin's status (success / failure / retry / discard) or "error"
    value: Any = None
    error: CallError | None = None
    logs: list[LogLine] = field(default_factory=list)
    started: float = 0.0
    step: int = 0
    metrics: dict[str, float] = field(default_factory=dict)  # its ctx.metric values

    def to_dict(self) -> dict[str, Any]:
        return {
            "plugin": self.plugin,
            "name": self.name,
            "kind": self.kind,
            "sample_index": self.sample_index,
            "trajectory_id": self.trajectory_id,
            "ok": self.ok,
            "status": self.status,
            "latency_ms": round(self.latency_ms, 3),
            "value": self.value if self.kind != "rollout" else None,
            "error": None if self.error is None else self.error.to_dict(),
            "metrics": self.metrics,
        }


class CallLog:
    """Where recorded calls go: a list, and an optional callback (the live progress display)."""

    def __init__(self, on_call: Callable[[CallRecord], None] | None = None) -> None:
        self.records: list[CallRecord] = []
        self.on_call = on_call

    def add(self, record: CallRecord) -> None:
        self.records.append(record)
        if self.on_call is not None:
            self.on_call(record)


class RecordedFunction:
    """A deployed plugin whose every call (one attempt, failures propagate) is recorded."""

    def __init__(self, fn: JobFunction, log: CallLog) -> None:
        self.fn = fn
        self.log = log

    @property
    def spec(self) -> PluginSpec:
        return self.fn.spec

    @property
    def entry(self) -> str:
        return self.fn.fn.entry

    async def invoke(self, ctx: Context, *args: Any) -> CallOutcome:
        started = time.time()
        t0 = time.perf_counter()
        try:
            outcome = await self.fn.invoke(ctx, *args)
        except PluginCallError as exc:
            self._add(ctx, t0, started, None, exc)
            raise
        self._add(ctx, t0, started, outcome, None)
        return outcome

    def _add(
        self,
        ctx: Context,
        t0: float,
        started: float,
        outcome: CallOutcome | None,
        exc: PluginCallError | None,
    ) -> None:
        status = outcome.status if outcome is not None else "error"
        self.log.add(
            CallRecord(
                plugin=self.entry,
                name=self.spec.name,
                kind=self.spec.kind.value,
                sample_index=ctx.sample_id,
                trajectory_id=ctx.trajectory_id,
                ok=outcome is not None and status == "success",
                latency_ms=(time.perf_counter() - t0) * 1000,
                service_ms=outcome.latency_ms if outcome is not None else 0.0,
                status=status,
                value=outcome.value if outcome is not None else None,
                error=CallError.of(exc) if exc is not None else None,
                logs=list(outcome.logs if outcome is not None else getattr(exc, "logs", [])),
                started=started,
                step=ctx.step,
                metrics=dict(outcome.metrics) if outcome is not None else {},
            )
        )
