"""Where a job's metrics and plugin calls go besides the store: the trackers a TRL or verl user has.

- TensorBoard event files, always, under the job's folder (``jobs/ID/tensorboard``; read them with
  ``tensorboard --logdir``), one scalar per metric and step.
- Weights & Biases, when ``tracking.wandb`` asks for it: an offline run (nothing leaves the
  machine; ``wandb sync`` uploads it later) in ``jobs/ID/wandb``.
- OpenTelemetry traces, when ``tracking.otlp`` names a collector: one span per plugin call
  (plugin, status, cause, latency, trajectory id, call id, attempt, step, phase), exported over
  OTLP/HTTP in batches (``CallSpans``).

wandb and the OTLP exporter are imported only when asked for.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from plugtune.home import private_dir
from plugtune.sdk import Context

log = logging.getLogger(__name__)

TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"
TRACES_PATH = "/v1/traces"


class Trackers:
    """A job's metric writers: TensorBoard always, W&B (offline) with ``wandb_project``."""

    def __init__(
        self,
        job_dir: Path,
        run_name: str,
        wandb_project: str | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        from torch.utils.tensorboard import SummaryWriter

        private_dir(job_dir)
        self.tensorboard = SummaryWriter(log_dir=str(job_dir / TENSORBOARD_DIR))
        self.wandb_run: Any = None
        if wandb_project is not None:
            import wandb

            self.wandb_run = wandb.init(  # its files go to job_dir/wandb/offline-run-*
                project=wandb_project,
                name=run_name,
                dir=str(job_dir),
                mode="offline",
                config=config or {},
                settings=wandb.Settings(silent=True, console="off"),
            )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """The step's metrics (non-finite ones left out, as in the store), flushed to disk."""
        finite = {k: float(v) for k, v in metrics.items() if math.isfinite(v)}
        for name, value in finite.items():
            self.tensorboard.add_scalar(name, value, global_step=step)
        self.tensorboard.flush()
        if self.wandb_run is not None:
            self.wandb_run.log(finite, step=step)

    def close(self) -> None:
        self.tensorboard.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()
            self.wandb_run = None

    def __enter__(self) -> Trackers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def traces_url(endpoint: str) -> str:
    """The collector's OTLP/HTTP traces URL: ``endpoint`` as given when it ends in /v1/traces."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith(TRACES_PATH) else endpoint + TRACES_PATH


class CallSpans:
    """One OpenTelemetry span per plugin call, exported to an OTLP/HTTP collector (no-op without one).

    The tracer provider is this object's own (no global state): ``close`` exports what is left.
    """

    def __init__(self, endpoint: str | None = None, job_id: str = "") -> None:
        self._tracer: Any = None
        self._provider: Any = None
        if endpoint is None:
            return
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        resource = Resource.create({"service.name": "plugtune", "plugtune.job_id": job_id})
        self._provider = TracerProvider(resource=resource, shutdown_on_exit=True)
        self._provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url(endpoint))))
        self._tracer = self._provider.get_tracer("plugtune.plugins")

    @property
    def is_on(self) -> bool:
        return self._tracer is not None

    def record(
        self,
        plugin: str,
        ctx: Context,
        started_ns: int,
        *,
        status: str,
        cause: str = "",
        call_id: str = "",
        message: str = "",
    ) -> None:
        """A finished call of ``plugin`` that started at ``started_ns`` (``time.time_ns()``)."""
        if self._tracer is None:
            return
        from opentelemetry.trace import Status, StatusCode

        ended = time.time_ns()
        span = self._tracer.start_span(f"plugin {plugin}", start_time=started_ns)
        span.set_attributes(
            {
                "plugtune.plugin": plugin,
                "plugtune.status": status,
                "plugtune.cause": cause,
                "plugtune.latency_ms": (ended - started_ns) / 1e6,
                "plugtune.trajectory_id": ctx.trajectory_id,
                "plugtune.call_id": call_id,
                "plugtune.attempt": ctx.attempt,
                "plugtune.step": ctx.step,
                "plugtune.phase": ctx.phase,
            }
        )
        if cause:
            span.set_status(Status(StatusCode.ERROR, f"{cause}: {message}"[:500]))
        span.end(end_time=ended)

    def close(self) -> None:
        """Export the spans not sent yet (waits for the collector, at most its timeout)."""
        if self._provider is not None:
            self._provider.shutdown()
            self._provider = self._tracer = None

    def __enter__(self) -> CallSpans:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
