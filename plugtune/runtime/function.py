"""``Function``: a deployed plugin, whatever backend runs it."""

from __future__ import annotations

import itertools
import os
import time
from typing import Any

from plugtune.errors import Cause
from plugtune.runtime.backend import PREFER_INSTANCE, CallRequest, Deployment, Failed
from plugtune.runtime.classify import InvalidReturn, call_error, classify, validate
from plugtune.runtime.faults import FaultInjection
from plugtune.runtime.metrics import MetricsRecorder
from plugtune.runtime.snapshot import CodeSnapshot
from plugtune.sdk import Kind, PluginSpec, Runtime
from plugtune.sdk.context import Context
from plugtune.types import CallOutcome, LogLine, MetricPoint

RUNNING, CLOSED = "running", "closed"


class Function:
    """A deployed plugin. ``invoke`` returns a :class:`CallOutcome` or raises ``PluginCallError``
    naming the plugin by ``name``: the name the job gives it (job.yaml's), else its entry."""

    def __init__(
        self,
        entry: str,
        deployment: Deployment,
        snapshot: CodeSnapshot,
        inject: FaultInjection | None,
        metrics_period_s: float,
        name: str = "",
    ) -> None:
        self.entry = entry
        self.name = name or entry
        self.deployment = deployment
        self.spec: PluginSpec = deployment.spec
        self.runtime: Runtime = deployment.runtime
        self.code_hash = snapshot.code_hash
        self.snapshot = snapshot
        self.inject = inject
        self.status = RUNNING
        self._ids = itertools.count(1)
        self._prefix = os.urandom(4).hex()
        self.recorder = MetricsRecorder(entry, metrics_period_s, self._gauges)
        self.recorder.start()

    async def invoke(self, ctx: Context, *args: Any) -> CallOutcome:
        """Call the plugin: ``(policy, sample)`` for a rollout, ``(sample, trajectory)`` for a grader,
        ``(sample, trajectories)`` for a group grader. Under ``PREFER_INSTANCE`` (an instance id) the
        call runs on that instance when it is still healthy and has a free slot, else on any."""
        if self.status != RUNNING:
            raise RuntimeError(f"{self.entry} is closed; deploy it again")
        if not isinstance(ctx, Context):
            raise TypeError(f"invoke() needs a plugtune.sdk.Context first, got {type(ctx).__name__}")
        call_id = f"{self._prefix}-{next(self._ids)}"
        fault = self.inject.draw() if self.inject is not None else None
        request = CallRequest(call_id, ctx, args, self.runtime.timeout_s, fault, PREFER_INSTANCE.get())
        started = time.perf_counter()
        result = await self.deployment.invoke(request)
        if isinstance(result, Failed):
            error = classify(
                result,
                plugin=self.name,
                call_id=call_id,
                trajectory_id=ctx.trajectory_id,
                code_hash=self.code_hash,
                is_async=self.spec.is_async,
            )
            self.recorder.record(result.latency_ms or (time.perf_counter() - started) * 1000, error.cause)
            if result.peak_memory_mb:  # its instance died: the peak it reached, not the last sample's
                self.recorder.record_point(
                    "memory_percent", 100.0 * result.peak_memory_mb / self.runtime.memory_mb
                )
            raise error
        group = len(args[1]) if self.spec.kind is Kind.GROUP_GRADER else 0
        try:
            status, value, reason = validate(self.spec.kind, result.value, group)
        except InvalidReturn as exc:
            self.recorder.record(result.latency_ms, exc.cause.value)
            raise call_error(
                exc.cause,
                exc.message,
                plugin=self.name,
                call_id=call_id,
                instance_id=result.instance_id,
                trajectory_id=ctx.trajectory_id,
                code_hash=self.code_hash,
                logs=result.logs,
            ) from None
        self.recorder.record(result.latency_ms)
        return CallOutcome(
            status=status,
            value=value,
            reason=reason,
            metrics=dict(result.metrics),
            logs=result.logs,
            call_id=call_id,
            instance_id=result.instance_id,
            latency_ms=result.latency_ms,
        )

    def _gauges(self) -> dict[str, float]:
        """The instances' resource gauges, and each declared dependency's values where the function's
        connections go through the policy-only relay (``dependency/<name>/...``, runtime.meter)."""
        values = self.deployment.sample()
        bridge = getattr(self.deployment, "bridge", None)  # the local backend's, under policy-only
        if bridge is not None:
            values.update(bridge.sample())
        return values

    def metrics(self) -> list[MetricPoint]:
        """The sampled series so far (one point per metric per period)."""
        return list(self.recorder.points)

    def flush_metrics(self) -> None:
        """Close the current metrics window now, so a short run still leaves its points."""
        self.recorder.flush()

    def logs(self) -> list[LogLine]:
        """Every line this function's instances (and the runtime about them) wrote, oldest first."""
        return self.deployment.logs()

    def code(self) -> dict[str, bytes]:
        """The snapshot that runs: relative path -> content."""
        return self.snapshot.files()

    async def scale(self, instances: int) -> None:
        await self.deployment.scale(instances)

    async def close(self) -> None:
        if self.status == CLOSED:
            return
        self.status = CLOSED
        await self.recorder.stop()
        await self.deployment.close()


__all__ = ["CLOSED", "RUNNING", "Cause", "Function"]
