"""One attempt of a job, in its own process: ``python -m plugtune.jobs.attempt JOB_ID``.

It validates the job again as it was submitted (its stored job.yaml, plugin code — or the code of a
``jobs retry --code``, recorded per attempt — and data
fingerprints: :mod:`plugtune.jobs.submitted`), deploys the plugins, loads the model behind the
policy gateway, resumes from the last checkpoint and trains, writing trajectories, metrics and
plugin logs to the store as it goes. Whatever ends it is recorded on the attempt as exactly one classified
error; the scheduler (another process) decides what happens next.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plugtune.errors import PlatformError
from plugtune.home import OWNER_ONLY_UMASK, private_dir
from plugtune.jobs.caller import JobStop, OutageWatch, PolicyCaller, StepCounts
from plugtune.jobs.classify import classify
from plugtune.jobs.evaluate import build_evaluator, is_eval_step
from plugtune.jobs.evidence import stopped_records
from plugtune.jobs.plugins import LOG_READ_S, Drain, as_plugins, deploy_all, record_deployed, record_waiting
from plugtune.jobs.report import JOB_WARNINGS
from plugtune.jobs.revision import record_attempt
from plugtune.jobs.submitted import load as load_submitted
from plugtune.jobs.submitted import name_origins
from plugtune.settings import Settings
from plugtune.spec.rows import dataset_lines, read_dataset
from plugtune.spec.validation import ValidatedJob
from plugtune.store import Store, StoreWriter
from plugtune.trainer.evaluation import Evaluator
from plugtune.trainer.health import EvalPoint, eval_point, eval_warnings
from plugtune.trainer.poison import RowSource
from plugtune.trainer.tracking import CallSpans, Trackers
from plugtune.types import ErrorRecord, LogLine, MetricPoint

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED, EXIT_CANCELLED = 0, 1, 3
LIVE_TAIL_S = LOG_READ_S  # how often plugin logs reach the store while a step runs


class Sigterm(Exception):
    """SIGTERM reached the attempt: a cancel when the store holds the job's cancel request (the
    control plane records it before it signals), otherwise a stop from outside (``Terminated``)."""


class Terminated(PlatformError):
    """Raised for a SIGTERM that no cancel request explains: something outside plugtune stopped the
    attempt (an operator's kill, a container or host shutting down), so it is retried like any
    platform failure."""

    def __init__(self, pid: int) -> None:
        super().__init__(
            f"the attempt process (pid {pid}) got SIGTERM, but no one cancelled the job (a cancel is "
            "recorded in the store before the attempt is signalled): something outside plugtune "
            "stopped it, such as a kill by hand, a container stop or a host shutting down",
            cause="attempt terminated",
        )


def job_dir(settings: Settings, job_id: int) -> Path:
    """The job's folder (checkpoints, final/, TensorBoard), owner-only from its creation."""
    return private_dir(settings.home / "jobs" / str(job_id))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not args[0].isdigit():
        print("usage: python -m plugtune.jobs.attempt JOB_ID", file=sys.stderr)
        return 2
    logging.basicConfig(level=os.environ.get("PLUGTUNE_LOG_LEVEL", "WARNING"))
    job_id = int(args[0])
    settings = Settings.from_env()
    store = Store.open(settings.database_url)
    job = store.get_job(job_id)
    if job is None:
        print(f"job {job_id} is not in the store at {store.url}", file=sys.stderr)
        return 2
    checkpoint = store.latest_checkpoint(job_id)
    signal.signal(signal.SIGTERM, _on_sigterm)
    # A server or run started in the background (`cmd &` in a script, nohup) hands its children
    # SIGINT ignored: an interrupt from outside must still end the attempt, as an unknown error.
    # Both before the attempt's pid is in the store, where others can see it and signal it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    number = store.start_attempt(job_id, os.getpid(), checkpoint.step if checkpoint else 0)
    try:
        record_attempt(store, job_id, number, job.spec)  # the code it runs: the console's steps by code
        asyncio.run(run_attempt(store, settings, job_id, job.spec))
    except BaseException as exc:  # noqa: BLE001 - every failure is classified once, here
        if isinstance(exc, (Sigterm, asyncio.CancelledError)):
            if store.cancel_request(job_id) is not None:
                store.end_attempt(job_id, number, "cancelled")
                return EXIT_CANCELLED
            exc = Terminated(os.getpid())
        store.end_attempt(job_id, number, "failed", _classified(exc))
        return EXIT_FAILED
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    store.end_attempt(job_id, number, "succeeded")
    return EXIT_OK


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Sigterm()


def _classified(exc: BaseException) -> ErrorRecord:
    if isinstance(exc, JobStop):
        return classify(exc.error, evidence={"decision": exc.reason})
    return classify(exc)


async def run_attempt(store: Store, settings: Settings, job_id: int, spec: dict[str, Any]) -> None:
    job = load_submitted(store, job_id, spec, job_dir(settings, job_id) / "submitted")
    if job.spec.trainer != "plugtune":  # an engine's trainer, with the job's plugins in the runtime
        _train_with_engine(store, settings, job_id, job)  # sync: SIGTERM still raises Sigterm in it
        return
    # From here SIGTERM cancels this task instead, at its next await: the step in progress is
    # stopped in order and keeps its trajectories.
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    if task is not None:
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        await _run_plugtune(store, settings, job_id, job, spec)
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        signal.signal(signal.SIGTERM, _on_sigterm)


async def _run_plugtune(
    store: Store, settings: Settings, job_id: int, job: ValidatedJob, spec: dict[str, Any]
) -> None:
    from plugtune.runtime import Quota, runtime_for

    rows = read_dataset(job.train_path)
    quota = Quota(
        max_functions=settings.max_functions,
        max_instances=settings.max_instances,
        total_memory_mb=settings.total_memory_mb,
    )
    backend = job.spec.plugins.runtime_backend
    record_waiting(store, job_id, job)
    async with runtime_for(backend, settings.ray_address, quota, settings.home / "runtime") as rt:
        functions = await deploy_all(rt, job)
        record_deployed(store, job_id, functions)
        name_origins(store, job_id, job, spec)
        drain = Drain(functions)
        failed: JobStop | None = None
        try:
            await _train(store, settings, job_id, job, rows, drain)
        except JobStop as stop:
            failed = stop
            raise
        finally:
            for jf in functions:
                jf.fn.flush_metrics()
            logs, points = drain.take()
            store.write_batch(job_id, logs=logs, metrics=points)
            # Ended after their last points are written, so their metrics window holds them.
            for jf in functions:  # the others ended with the attempt, without a fault of their own
                if failed is not None and jf.spec.name == failed.error.plugin:
                    store.set_plugin_status(job_id, jf.spec.name, "failed", failure_reason=str(failed.error))
                else:
                    store.set_plugin_status(job_id, jf.spec.name, "completed")


#: The entry-point group of the engines that train a job whose ``trainer:`` is not plugtune's own:
#: each is ``name = "module:train_job"`` in its package's metadata (plugtune's pyproject.toml
#: declares ``trl``), so the core finds an engine without importing the layer above it.
ENGINE_GROUP = "plugtune.trainers"


def engine_trainer(name: str) -> Any:
    """The ``train_job(store, job_id, job, out)`` of the engine named ``name``; RuntimeError naming
    the install to run when no installed package declares it."""
    from importlib.metadata import entry_points

    found = list(entry_points(group=ENGINE_GROUP, name=name))
    if not found:
        raise RuntimeError(
            f"trainer: {name}: no installed package declares this trainer (entry point group "
            f"{ENGINE_GROUP!r}); install plugtune with its extras (pip install -e '.[trl]') and try again"
        )
    return found[0].load()


def _train_with_engine(store: Store, settings: Settings, job_id: int, job: ValidatedJob) -> None:
    engine_trainer(job.spec.trainer)(store, job_id, job, job_dir(settings, job_id))


async def _train(
    store: Store,
    settings: Settings,
    job_id: int,
    job: ValidatedJob,
    rows: list[dict[str, Any]],
    drain: Drain,
) -> None:
    from plugtune.gateway import JobSampling, PolicyGateway
    from plugtune.trainer.grpo import GRPOTrainer
    from plugtune.trainer.memory import settle_for_training
    from plugtune.trainer.model import load_model, placement

    spec = job.spec
    config = spec.hyperparameters
    device, dtype = placement(config.device, config.dtype, file=str(job.job_file))
    loaded = load_model(job.model_dir, device=device, dtype=dtype)
    log.info("the model runs on %s in %s", device, str(dtype).removeprefix("torch."))
    spans = CallSpans(spec.tracking.otlp.endpoint if spec.tracking.otlp else None, str(job_id))
    caller = PolicyCaller(spec.failure_policy, spans)
    functions = drain.functions
    hashes = {jf.spec.name: jf.fn.code_hash for jf in functions}
    out = job_dir(settings, job_id)
    # Every reply is sampled with the job's settings, the ones the trainer scores tokens at.
    sampling = JobSampling(config.temperature, config.top_p, config.max_new_tokens)
    with PolicyGateway(loaded.model, loaded.tokenizer, sampling=sampling) as gateway:
        trainer = GRPOTrainer(
            loaded.model,
            loaded.tokenizer,
            gateway,
            as_plugins(functions, job),
            rows,
            config,
            caller=caller,
            job_id=str(job_id),
            signal=spec.signal.thresholds(),
            group_rule=spec.failure_policy.group.rule(),
            row_source=RowSource(str(job.train_path), dataset_lines(job.train_path)),
        )
        checkpoint = store.latest_checkpoint(job_id)
        if checkpoint is not None:
            trainer.load_checkpoint(Path(checkpoint.path))
        # What an earlier attempt wrote past the resume point is run again: forget it, so no step
        # is drawn twice (a retry without a checkpoint restarts before step 0's evaluation).
        store.delete_after_step(job_id, checkpoint.step if checkpoint is not None else -1)
        store.update_job(job_id, steps_total=config.steps, steps_done=trainer.step_count)
        # This process now exists to train: keep freed memory for the next step, and take what
        # start-up left alive out of the garbage collector's full passes.
        log.info("trainer memory: %s", settle_for_training())
        with StoreWriter(store, job_id) as writer, spans, job_trackers(out, spec, job_id) as trackers:
            tail = asyncio.create_task(_drain_every(drain, writer, LIVE_TAIL_S))
            try:
                loop = _Loop(store, job_id, trainer, caller, drain, writer, hashes, out, gateway, spec)
                loop.trackers = trackers
                if job.validation_path is not None:  # held-out rows, through the same plugins and gateway
                    plugins = as_plugins(functions, job)
                    loop.evaluator = build_evaluator(job, gateway, plugins, caller, str(job_id))
                await loop.run()
            finally:
                tail.cancel()
        trainer.save_final(out / "final")


def job_trackers(out: Path, spec: Any, job_id: int) -> Trackers:
    """TensorBoard event files under the job's folder, and an offline W&B run when asked for (the
    embedded trainer's and a ``trainer: trl`` job's)."""
    wandb = spec.tracking.wandb
    config = {"model": spec.model, **spec.hyperparameters.model_dump()}
    return Trackers(out, f"{spec.name}-{job_id}", wandb.project if wandb else None, config)


async def _drain_every(drain: Drain, writer: StoreWriter, period_s: float) -> None:
    """Hand plugin logs and metrics to the store while a step runs, for the console's live tail."""
    while True:
        await asyncio.sleep(period_s)
        logs, points = drain.take()
        writer.add_logs(logs)
        writer.add_metrics(points)


@dataclass
class _Loop:
    """What the step loop writes through: the trainer, the failure policy's caller, the store."""

    store: Store
    job_id: int
    trainer: Any
    caller: PolicyCaller
    drain: Drain
    writer: StoreWriter
    hashes: dict[str, str]
    out: Path
    gateway: Any
    spec: Any
    warned: set[str] = dataclasses.field(default_factory=set)  # warning keys shown this attempt
    trackers: Trackers | None = None  # TensorBoard (and W&B) get every step's metrics
    evaluator: Evaluator | None = None  # of data.validation, when the job has one
    evals: list[EvalPoint] = dataclasses.field(default_factory=list)  # this attempt's last evaluations
    # (step, reward/mean, response_length) of the steps trained since the first of them
    train_points: list[tuple[int, float, float]] = dataclasses.field(default_factory=list)

    async def run(self) -> None:
        """Train the remaining steps, writing each step's records before the next starts; when the
        attempt stops, every trajectory of the steps it stopped is written too, with why. Meanwhile
        which dependencies the job waits for (down ones) is written as it changes (OutageWatch)."""
        watch = OutageWatch(self.caller, self.writer, lambda: self.trainer.step_count + 1, JOB_WARNINGS)
        watching = asyncio.get_running_loop().create_task(watch.run())
        try:
            await self._run()
        finally:
            watching.cancel()
            watch.update(final=True)

    async def _run(self) -> None:
        try:
            if self.evaluator is not None and self.trainer.step_count == 0 and is_eval_step(0, self.spec):
                await self._evaluate(self.evaluator, 0)  # the baseline: the initial model
            await self._steps()
        except BaseException as exc:
            await self.trainer.cancel_pending()  # the next step's rollouts, if started ahead
            stopped = stopped_records(self.trainer.take_stopped(), self._why_stopped(exc))
            self.writer.add_trajectories([dataclasses.replace(r, code_hash=self.hashes) for r in stopped])
            self.writer.flush()
            raise
        finally:  # the next step's rollouts may already be running: they end with the attempt
            await self.trainer.cancel_pending()

    async def _steps(self) -> None:
        trainer, caller, writer, config = self.trainer, self.caller, self.writer, self.spec.hyperparameters
        while trainer.step_count < config.steps:
            try:
                result = await trainer.step()
            except JobStop:  # run() writes the step's trajectories
                step = trainer.step_count + 1
                writer.add_metrics(caller.take_counts(step).metric_points(step))
                raise
            counts = caller.take_counts(result.step)
            writer.add_metrics(counts.metric_points(result.step))
            logs, points = self.drain.take()
            writer.add_trajectories([dataclasses.replace(r, code_hash=self.hashes) for r in result.records])
            writer.add_metrics(_training_points(result.step, result.metrics))
            m = result.metrics
            self.train_points.append(
                (result.step, m.get("reward/mean", math.nan), m.get("response_length", 0.0))
            )
            if self.trackers is not None:
                self.trackers.log(result.step, {**result.metrics, **counts.plugin_metrics.flat()})
            writer.add_metrics(points)
            writer.add_logs(logs)
            writer.add_logs(self._new_warnings(result.warnings))
            if self.evaluator is not None and is_eval_step(result.step, self.spec):
                writer.flush()
                await self._evaluate(self.evaluator, result.step)  # before the checkpoint: a resume redoes it
            if result.step % config.save_every_n_steps == 0 or result.step == config.steps:
                path = trainer.save_checkpoint(self.out / "checkpoints" / f"step-{result.step:06d}")
                writer.flush()  # the checkpoint's trajectories are durable before it is recorded
                self.store.add_checkpoint(self.job_id, result.step, str(path))
            writer.flush()
            self.store.update_job(self.job_id, steps_done=result.step)
            _check_breaker(counts, self.spec.circuit_breaker, int(result.metrics.get("data/poison_calls", 0)))

    async def _evaluate(self, evaluator: Evaluator, step: int) -> None:
        """Evaluate the weights after ``step`` on the validation rows; write eval records and metrics."""
        writer = self.writer
        try:
            result = await evaluator.run(step, self.trainer.step_count)
        except BaseException as exc:  # every trajectory of the stopped evaluation is kept
            stopped = stopped_records(evaluator.take_stopped(), self._why_stopped(exc))
            writer.add_trajectories([dataclasses.replace(r, code_hash=self.hashes) for r in stopped])
            if isinstance(exc, JobStop):
                writer.add_metrics(self.caller.take_counts(step).metric_points(step, prefix="eval/"))
            writer.flush()
            raise
        counts = self.caller.take_counts(step)
        writer.add_trajectories([dataclasses.replace(r, code_hash=self.hashes) for r in result.records])
        writer.add_metrics(_training_points(step, result.metrics))
        if self.trackers is not None:
            self.trackers.log(step, {**result.metrics, **counts.plugin_metrics.flat("eval/")})
        writer.add_metrics(counts.metric_points(step, prefix="eval/"))
        logs, points = self.drain.take()
        writer.add_logs(logs)
        writer.add_metrics(points)
        writer.add_logs(self._new_warnings(self._eval_warnings(step, result.records)))
        writer.flush()
        _check_breaker(counts, self.spec.circuit_breaker)

    def _eval_warnings(self, step: int, records: list[Any]) -> list[Any]:
        """Eval pass@1 falling over the attempt's last evaluations while the train reward did not
        (``eval_divergence``), or while the replies grew (``length_hacking``)."""
        thresholds = self.spec.signal.thresholds()
        self.evals = [*self.evals, eval_point(step, records, self.spec.eval.pass_threshold)]
        self.evals = self.evals[-(thresholds.eval_falls + 1) :]
        self.train_points = [t for t in self.train_points if t[0] > self.evals[0].step]
        return eval_warnings(self.evals, self.train_points, thresholds)

    def _why_stopped(self, exc: BaseException) -> BaseException:
        """SIGTERM (the task cancelled) is the user's cancel only when the store holds the request;
        the stopped trajectories of any other SIGTERM name the platform error the attempt ends with."""
        if isinstance(exc, asyncio.CancelledError) and self.store.cancel_request(self.job_id) is None:
            return Terminated(os.getpid())
        return exc

    def _new_warnings(self, warnings: list[Any]) -> list[LogLine]:
        """The step's warnings of a kind not yet shown this attempt (the metrics show the rest)."""
        fresh = [w for w in warnings if w.key not in self.warned]
        self.warned.update(w.key for w in fresh)
        for w in fresh:
            log.warning("job %d: %s", self.job_id, w.message)
        return [LogLine(time.time(), "WARNING", JOB_WARNINGS, w.message, source="trainer") for w in fresh]


def _training_points(step: int, metrics: dict[str, float]) -> list[MetricPoint]:
    """The step's metrics as points; a NaN statistic (e.g. no reward scored at all) is left out."""
    now = time.time()
    return [
        MetricPoint(time=now, plugin="", name=k, value=float(v), step=step)
        for k, v in metrics.items()
        if math.isfinite(v)
    ]


def _check_breaker(counts: StepCounts, config: Any, poison_calls: int = 0) -> None:
    error = counts.breaker_error(config, poison_calls)
    if error is not None:
        raise JobStop(error, "circuit breaker")


if __name__ == "__main__":
    os.umask(OWNER_ONLY_UMASK)  # what the trainer and its libraries write is the home owner's alone
    sys.exit(main())
