"""``GRPOTrainer``: one GRPO step reads top to bottom.

rollouts (concurrently, through the plugins) → graders → final reward → group advantages →
clipped policy-gradient loss (+ KL) → guarded optimizer step → metrics. Every step returns
its TrajectoryRecords so the jobs layer can store them.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import resource
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn

import torch
from transformers import PreTrainedModel

from plugtune.errors import LossNanError
from plugtune.sdk import Sample, Sampling
from plugtune.trainer import checkpoint, lora, objective
from plugtune.trainer.batch import TrainBatch, is_trainable, micro_batches, untrained_reason
from plugtune.trainer.config import TrainerConfig
from plugtune.trainer.data import DataCursor
from plugtune.trainer.draft import GroupRule, groups_dropped_by_rule
from plugtune.trainer.groups import GroupRunner, Plugins, gather_or_cancel
from plugtune.trainer.health import (
    SignalMonitor,
    SignalThresholds,
    StepSignal,
    StepWarning,
    exploding_warnings,
    logprob_noise,
    signal_metrics,
    step_warnings,
)
from plugtune.trainer.objective import LossParts
from plugtune.trainer.poison import RowSource, observe
from plugtune.trainer.protocols import Caller, PolicyServer, call_once
from plugtune.trainer.rewards import group_advantages, summary
from plugtune.trainer.spin import SpinQuieter
from plugtune.trainer.tasks import TaskHealth, task_of, warning_key
from plugtune.types import TrajectoryRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Rollouts:
    """One step's groups, running: started ahead (during the previous step's training) or not."""

    step: int
    task: asyncio.Future[list[list[TrajectoryRecord]]]
    started: float
    cursor_before: DataCursor  # the data cursor before this step's prompts were drawn
    finished: list[TrajectoryRecord] = field(default_factory=list)  # of the groups that ended


@dataclass(frozen=True)
class StepResult:
    step: int  # 1-based number of the step just applied
    metrics: dict[str, float]
    records: list[TrajectoryRecord]
    warnings: list[StepWarning] = field(default_factory=list)  # what went silently wrong


class GRPOTrainer:
    """Trains ``model`` in place with GRPO on ``rows`` (dataset dicts: messages / tools / extra).

    With ``config.lora`` a peft LoRA adapter is injected into ``model`` in place (the same object
    the policy server decodes from) and only the adapter trains; checkpoints then hold the
    adapter, and ``save_final`` writes the merged model and the adapter.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: Any,
        server: PolicyServer,
        plugins: Plugins,
        rows: Sequence[dict[str, Any]],
        config: TrainerConfig,
        *,
        caller: Caller = call_once,
        job_id: str = "",
        signal: SignalThresholds | None = None,
        group_rule: GroupRule | None = None,
        row_source: RowSource | None = None,
    ) -> None:
        self.model, self.tokenizer, self.server, self.config = model, tokenizer, server, config
        self.rows = rows
        self.tasks = [task_of(row) for row in rows]  # each row's task: its plugin set (multi-task jobs)
        self.row_source = row_source or RowSource()  # the file and lines poison-row warnings name
        self.job_id = job_id
        self.runner = GroupRunner(
            server=server, plugins=plugins, caller=caller, job_id=job_id, group_rule=group_rule or GroupRule()
        )
        self.cursor = DataCursor(len(rows), config.seed)
        checkpoint.seed_everything(config.seed)  # the adapter's initialisation too
        self.reference = _frozen_copy(model) if config.kl_coef > 0 else None  # the base, without adapter
        self.adapted = lora.attach(model, config.lora) if config.lora is not None else None
        if config.gradient_checkpointing:  # recomputed in backward (objective.backward turns it on)
            objective.checkpoint_activations(model)
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=config.learning_rate,
            weight_decay=config.weight_decay,
            fused=True,
        )
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.spin = SpinQuieter()
        self.overlap = config.overlap_rollouts
        self._training = ThreadPoolExecutor(max_workers=1, thread_name_prefix="plugtune-training")
        self._next: _Rollouts | None = None  # the next step's rollouts, started while this one trained
        self._last_end: float | None = None
        self.step_count = 0
        self.monitor = SignalMonitor(signal, config.steps)  # job.yaml's signal: thresholds, the last steps
        self.task_health = TaskHealth(signal, config.steps) if plugins.tasks else None  # per task, too
        checkpoint.seed_everything(config.seed)
        server.set_policy_version(self.step_count)

    async def step(self) -> StepResult:
        """Run one GRPO step; raises LossNanError (and applies nothing) on a non-finite loss or grad.

        With ``overlap_rollouts`` the next step's rollouts start as soon as this step's training
        holds the weights lock (its samples drawn, its plugins called, its requests sent), and their
        generation waits for the updated weights: every token is still sampled from the newest
        policy, and the step after this one finds part of its plugin work done.
        """
        called = time.perf_counter()
        step = self.step_count + 1
        rollouts, self._next = self._next, None
        if rollouts is not None and rollouts.step != step:  # not this step's (cannot happen today)
            rollouts.task.cancel()
            rollouts = None
        prefetched = rollouts is not None
        if rollouts is None:
            rollouts = self._start_rollouts(step)
        try:
            groups = [_with_advantages(g) for g in await rollouts.task]
        except BaseException:
            self.runner.stopped += rollouts.finished
            raise
        sampled: _Sampled | None = None
        if self.config.dynamic_sampling:
            groups, sampled = await self._refill(step, groups)
        poison = observe(self.cursor, step, groups, self.config.poison_after, self.row_source, self.job_id)
        rolled = time.perf_counter()
        graded = [r for group in groups for r in group]  # as graded: the health checks read these
        records = [r for group in groups for r in _filtered(group)] if sampled else graded

        batches = micro_batches(records, self.pad_id, self.vocab_size)
        parts: LossParts | None = None
        grad_norm = 0.0
        try:
            if batches:
                parts, grad_norm = await self._train(batches, step, records)
            else:
                self.server.set_policy_version(step)
        except BaseException:  # not applied (a non-finite loss, a stop): its trajectories are kept
            self.runner.stopped += records
            raise
        self.step_count = step
        if parts is not None:  # each trained trajectory keeps the trainer's log-probs of its tokens
            records = objective.with_trainer_logprobs(records, parts.trainer_logprobs)

        weights = self.runner.plugins.task_weights()
        signal = self.monitor.measure(step, graded, {k: v for w in weights.values() for k, v in w.items()})
        metrics = _metrics(graded, parts, grad_norm, signal)
        by_task: tuple[dict[str, float], list[StepWarning]] = ({}, [])
        if self.task_health is not None:  # a multi-task job: each task's reward and health on its own
            by_task = self.task_health.observe(step, graded, self.tasks, weights, self.config.max_new_tokens)
            metrics.update(by_task[0])
        if sampled is not None:  # the rewards as graded; what the step left out counts as discarded
            metrics["trajectories/discarded"] = float(sum(r.status == "discard" for r in records))
            metrics.update(sampled.metrics())
        metrics.update(poison.metrics)
        metrics["weights/max_abs"] = _largest_trained_weight(self.model)
        metrics["memory/peak_mib"] = step_memory_mib(next(self.model.parameters()).device)
        ended = time.perf_counter()
        began = self._last_end if prefetched and self._last_end is not None else called
        self._last_end = ended
        metrics.update(
            {
                "time/plugins_s": rolled - called,
                "time/overlapped_s": called - rollouts.started if prefetched else 0.0,
                "time/train_s": ended - rolled,
                "time/step_s": ended - began,
            }
        )
        noise = logprob_noise(next(self.model.parameters()).dtype)
        warnings = [
            *step_warnings(step, metrics, noise, self.config.top_p, records),
            *exploding_warnings(step, metrics, self.config.learning_rate),
            *self.monitor.warnings(signal, self.config.max_new_tokens),
            *by_task[1],
        ]
        if sampled is not None:  # no step trains on a group without gradient: say when one fell short
            warnings = [w for w in warnings if warning_key(w.key) != "no_gradient"]
            warnings += sampled.warnings(step, self.config)
        warnings += poison.warnings
        return StepResult(step=step, metrics=metrics, records=records, warnings=warnings)

    @property
    def signals(self) -> deque[StepSignal]:
        """The last steps' reward signal (as many as the longest check looks back over)."""
        return self.monitor.signals

    async def train(self, checkpoint_dir: Path | None = None) -> AsyncIterator[StepResult]:
        """Run the remaining steps, writing a checkpoint every ``save_every_n_steps``."""
        try:
            while self.step_count < self.config.steps:
                result = await self.step()
                if checkpoint_dir is not None and result.step % self.config.save_every_n_steps == 0:
                    self.save_checkpoint(checkpoint_dir / checkpoint.step_dir_name(result.step))
                yield result
        finally:
            await self.cancel_pending()

    async def cancel_pending(self) -> None:
        """Cancel the next step's rollouts if they were started ahead (their trajectories close,
        and are kept in :meth:`take_stopped`)."""
        rollouts, self._next = self._next, None
        if rollouts is not None:
            rollouts.task.cancel()
            await asyncio.gather(rollouts.task, return_exceptions=True)
            self.runner.stopped += rollouts.finished

    def take_stopped(self) -> list[TrajectoryRecord]:
        """The trajectories of steps that were stopped (failed, cancelled, not applied) since the
        last call: every one of them, finished or not (unfinished ones ``failed``, stop reason
        ``groups.STOPPED``)."""
        stopped, self.runner.stopped = self.runner.stopped, []
        return stopped

    def _start_rollouts(self, step: int) -> _Rollouts:
        """Draw ``step``'s prompts and start their groups (``group_size`` rollouts each, then graders)."""
        cursor_before = copy.copy(self.cursor)  # a checkpoint of the step before resumes from here
        samples = [self._sample(i, row) for i, row in self.cursor.batch(self.rows, self.config.batch_size)]
        finished: list[TrajectoryRecord] = []
        task = asyncio.ensure_future(self._run_groups(step, samples, 0, finished))
        return _Rollouts(step, task, time.perf_counter(), cursor_before, finished)

    async def _run_groups(
        self, step: int, samples: list[Sample], start: int, finished: list[TrajectoryRecord]
    ) -> list[list[TrajectoryRecord]]:
        """``samples``' groups at once, at places ``start``.. of the step's batch; each group's
        records join ``finished`` as it ends (kept should a sibling group stop the step)."""

        async def run_group(place: int, sample: Sample) -> list[TrajectoryRecord]:
            task = self.tasks[sample.index]
            records = await self.runner.run(step, sample, self.config.group_size, step - 1, place, task)
            finished.extend(records)
            return records

        return await gather_or_cancel([run_group(start + i, s) for i, s in enumerate(samples)])

    async def _refill(
        self, step: int, groups: list[list[TrajectoryRecord]]
    ) -> tuple[list[list[TrajectoryRecord]], _Sampled]:
        """Dynamic sampling: while fewer than ``batch_size`` of the step's groups give a gradient and
        ``max_extra_batches`` allows, draw as many new prompts as are missing (the data cursor moves
        on: they are used up) and roll them out; the groups in rollout order (graded, advantages
        set) and the counts. Should a refill stop, every trajectory of the step so far is kept in
        :meth:`take_stopped`."""
        c = self.config
        kept = sum(map(_has_gradient, groups))
        rounds = extra_groups = 0
        while kept < c.batch_size and rounds < c.max_extra_batches:
            rounds += 1
            wanted = c.batch_size - kept
            samples = [self._sample(i, row) for i, row in self.cursor.batch(self.rows, wanted)]
            finished: list[TrajectoryRecord] = []
            try:
                more = await self._run_groups(step, samples, len(groups), finished)
            except BaseException:
                self.runner.stopped += [r for g in groups for r in g] + finished
                raise
            more = [_with_advantages(g) for g in more]
            groups += more
            extra_groups += len(more)
            kept += sum(map(_has_gradient, more))
        filtered = sum(not _has_gradient(g) for g in groups)
        return groups, _Sampled(filtered, extra_groups, extra_groups * c.group_size, kept, rounds)

    async def _train(
        self, batches: list[TrainBatch], step: int, records: list[TrajectoryRecord]
    ) -> tuple[LossParts, float]:
        """Backward and optimizer step under the weights lock.

        Without ``overlap_rollouts`` (or on the last step) it runs right here: nothing else has to
        happen meanwhile. With it, it runs on the training thread so that the event loop stays
        free: once the lock is held, the next step's rollouts start, and their first request to
        the policy waits for this step's weights. (Only then: a second thread doing torch work
        forms a second OpenMP team, and more OpenMP threads than cores make libgomp throttle the
        spin-wait of every team, which costs the backward ~8% here.)
        """
        if not (self.overlap and step < self.config.steps):
            return self._train_locked(batches, step, records, on_locked=lambda: None)
        loop = asyncio.get_running_loop()
        locked = asyncio.Event()
        threads = torch.get_num_threads()  # the caller's setting, for the training thread too

        def train() -> tuple[LossParts, float]:
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
            return self._train_locked(batches, step, records, lambda: loop.call_soon_threadsafe(locked.set))

        job = loop.run_in_executor(self._training, train)
        try:
            waiter = asyncio.ensure_future(locked.wait())
            either: list[asyncio.Future[Any]] = [waiter, job]
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if locked.is_set() and not job.done():
                self._next = self._start_rollouts(step + 1)
            return await job
        except BaseException:
            await self.cancel_pending()  # the step they follow is not applied
            raise

    def _train_locked(
        self,
        batches: list[TrainBatch],
        step: int,
        records: list[TrajectoryRecord],
        on_locked: Callable[[], object],
    ) -> tuple[LossParts, float]:
        with self.server.weights_lock:
            on_locked()
            self.spin.release()  # the backward's threads spin-wait between regions as usual
            with lora.adapter_dropout(self.model) if self.adapted is not None else contextlib.nullcontext():
                parts = self._backward(batches, step, records)
            grad_norm = self._apply(step, records, batches)
            self.server.set_policy_version(step)
            self.spin.quiet()  # ... but not through the next rollouts
        return parts, grad_norm

    def save_checkpoint(self, path: Path) -> Path:
        """Write the state after the last applied step; rollouts started ahead are not in it (a
        resumed run draws the same prompts again)."""
        cursor = self._next.cursor_before if self._next is not None else self.cursor
        return checkpoint.save(
            path, self.model, self.tokenizer, self.optimizer, cursor, self.step_count, adapter=self.adapted
        )

    def load_checkpoint(self, path: Path) -> None:
        """Restore weights, optimizer, data cursor, RNG states and step from ``path``."""
        if self._next is not None:
            raise RuntimeError("load_checkpoint before stepping (or after cancel_pending())")
        with self.server.weights_lock:
            self.step_count = checkpoint.load(
                path, self.model, self.optimizer, self.cursor, adapter=self.adapted
            )
        self.server.set_policy_version(self.step_count)

    def save_final(self, path: Path) -> Path:
        """The trained model as a Hugging Face directory (config, safetensors, tokenizer); with
        LoRA, base + adapter merged there and the adapter alone in ``path/adapter``."""
        if self.adapted is None:
            return checkpoint.save_model(path, self.model, self.tokenizer)
        lora.save_merged(self.adapted, self.tokenizer, path)
        lora.save_adapter(self.adapted, path / lora.ADAPTER_DIR)
        return path

    def _sample(self, index: int, row: dict[str, Any]) -> Sample:
        c = self.config
        sampling = Sampling(temperature=c.temperature, top_p=c.top_p, max_tokens=c.max_new_tokens)
        return replace(Sample.from_dict(row), index=index, sampling=sampling)

    def _backward(self, batches: list[TrainBatch], step: int, records: list[TrajectoryRecord]) -> LossParts:
        self.optimizer.zero_grad(set_to_none=True)
        try:
            return objective.backward(
                self.model,
                self.reference,
                batches,
                temperature=self.config.temperature,
                clip_ratio=self.config.clip_ratio,
                kl_coef=self.config.kl_coef,
            )
        except objective.NonFiniteLoss as exc:
            self._raise_nan(str(exc), step, records, batches)

    def _apply(self, step: int, records: list[TrajectoryRecord], batches: list[TrainBatch]) -> float:
        """Clip the accumulated gradient and step the optimizer, only when the gradient is finite."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.config.grad_clip)
        if not torch.isfinite(grad_norm):
            self._raise_nan(f"the gradient norm is {grad_norm.item()}", step, records, batches)
        self.optimizer.step()  # the caller holds the weights lock
        self.optimizer.zero_grad(set_to_none=True)
        return float(grad_norm.item())

    def _raise_nan(
        self, what: str, step: int, records: list[TrajectoryRecord], batches: list[TrainBatch]
    ) -> NoReturn:
        trajectory_ids = [t for b in batches for t in b.trajectory_ids]
        rewards = summary([r.reward for r in records])
        advantages = summary([r.advantage for r in records])
        stats = {f"reward/{k}": v for k, v in rewards.items()}
        stats.update({f"advantage/{k}": v for k, v in advantages.items()})
        self.optimizer.zero_grad(set_to_none=True)
        raise LossNanError(
            f"step {step}: {what}; the optimizer step was not applied. Reward mean {rewards['mean']:.4g} "
            f"(min {rewards['min']:.4g}, max {rewards['max']:.4g}), advantage min {advantages['min']:.4g} "
            f"max {advantages['max']:.4g}, over {len(trajectory_ids)} trajectories",
            step=step,
            stats=stats,
            trajectory_ids=trajectory_ids,
        )


#: How a trajectory that dynamic sampling left out of its step says so: its ``discard_reason`` starts so.
DROPPED_BY_SAMPLING = "its group was dropped by dynamic sampling"


@dataclass(frozen=True)
class _Sampled:
    """What dynamic sampling did in one step."""

    filtered: int  # groups left out: no gradient (zero reward variance, or nothing scored)
    extra_groups: int  # groups of the prompts drawn to refill the batch
    extra_rollouts: int  # their trajectories
    kept: int  # groups that train
    rounds: int  # extra batches drawn

    def metrics(self) -> dict[str, float]:
        return {
            "dynamic_sampling/filtered_groups": float(self.filtered),
            "dynamic_sampling/extra_groups": float(self.extra_groups),
            "dynamic_sampling/extra_rollouts": float(self.extra_rollouts),
            "dynamic_sampling/kept_groups": float(self.kept),
        }

    def warnings(self, step: int, config: TrainerConfig) -> list[StepWarning]:
        """``dynamic_sampling_short`` when the extra batches ran out before the batch was full."""
        if self.kept >= config.batch_size:
            return []
        return [
            StepWarning(
                "dynamic_sampling_short",
                f"step {step}: dynamic sampling found {self.kept} of batch_size {config.batch_size} "
                f"groups with a reward difference after {self.rounds} extra batches "
                f"(hyperparameters.max_extra_batches {config.max_extra_batches}, {self.extra_rollouts} "
                f"extra rollouts; {self.filtered} groups left out), so the step trained on "
                f"{self.kept}. Most prompts get the same reward for every reply: give partial credit, "
                "pick prompts the model solves sometimes, raise group_size or max_extra_batches; see "
                "the metrics dynamic_sampling/kept_groups and groups/zero_variance_share.",
            )
        ]


def _has_gradient(group: list[TrajectoryRecord]) -> bool:
    """The group gives a policy gradient: a scored trajectory's advantage is not 0."""
    return any(r.advantage for r in group)


def _filtered(group: list[TrajectoryRecord]) -> list[TrajectoryRecord]:
    """The group as dynamic sampling leaves it: one without a gradient is dropped, its successful
    trajectories recorded as discard with the reason (as a discard, without their grade: the
    reason says what it was); failed ones stay failed."""
    if _has_gradient(group):
        return group
    scored = sorted({r.reward for r in group if r.status == "success" and r.reward is not None})
    why = (
        f"every scored trajectory had reward {scored[0]:.6g} (zero variance)"
        if scored
        else "no trajectory was scored"
    )
    reason = f"{DROPPED_BY_SAMPLING}: {why}"
    return [
        replace(r, status="discard", reward=None, reward_components={}, advantage=None, discard_reason=reason)
        if r.status == "success"
        else r
        for r in group
    ]


def _with_advantages(group: list[TrajectoryRecord]) -> list[TrajectoryRecord]:
    """The group's records with GRPO advantages (None for failed, unscorable and discarded ones),
    each saying why when it gives no policy-gradient signal."""
    rewards = [r.reward if r.status == "success" else None for r in group]
    out = [replace(r, advantage=a) for r, a in zip(group, group_advantages(rewards), strict=True)]
    return [replace(r, discard_reason=untrained_reason(r)) for r in out]


def _metrics(
    records: list[TrajectoryRecord], parts: LossParts | None, grad_norm: float, signal: StepSignal
) -> dict[str, float]:
    rewards = summary([r.reward for r in records])
    # trained: the trajectories with a policy gradient (an advantage of 0 only pulls toward the reference)
    trained = sum(is_trainable(r) and r.advantage != 0.0 for r in records)
    out: dict[str, float] = {
        "reward/mean": rewards["mean"],
        "reward/std": rewards["std"],
        "reward/scored": rewards["count"],
        "trajectories/total": float(len(records)),
        "trajectories/trained": float(trained),
        "trajectories/failed": float(sum(r.status == "failed" for r in records)),
        "trajectories/discarded": float(sum(r.status == "discard" for r in records)),
        "groups/dropped_by_rule": float(groups_dropped_by_rule(records)),
        "groups/zero_variance_share": signal.zero_variance_share,
        "response/truncated_share": signal.truncated_share,
        "grad_norm": grad_norm,
        "tokens/policy": float(sum(sum(r.response_mask) for r in records)),
        "tokens/dropped_policy": float(
            sum(r.metrics.get("history/dropped_policy_tokens", 0.0) for r in records)
        ),
        "history/rewrites": float(sum(r.metrics.get("history/rewrites", 0.0) for r in records)),
        "response_length": summary([float(len(r.response_ids)) for r in records])["mean"] if records else 0.0,
    }
    for name in sorted({n for r in records for n in r.reward_components}):
        out[f"reward/{name}"] = summary([r.reward_components.get(name) for r in records])["mean"]
    out.update(signal_metrics(signal))
    for cause, count in Counter(e.cause for r in records for e in r.errors).items():
        out[f"plugin/errors/{cause}"] = float(count)
    if parts is not None:
        out.update(
            {
                "loss": parts.loss,
                "loss/pg": parts.pg_loss,
                "kl": parts.kl,
                "entropy": parts.entropy,
                "clip_fraction": parts.clip_fraction,
                "logprob_gap": parts.logprob_gap,
            }
        )
    return out


def step_memory_mib(device: torch.device) -> float:
    """The memory this step needed, in MiB: on a GPU the most allocated since the last step (then
    reset), on the CPU the process's peak resident memory so far (the kernel keeps no per-step peak)."""
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        return peak / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _largest_trained_weight(model: PreTrainedModel) -> float:
    """The largest magnitude among the weights the optimizer trains (LoRA: the adapters')."""
    with torch.no_grad():
        peaks = [p.detach().abs().max() for p in model.parameters() if p.requires_grad and p.numel()]
        return float(torch.stack(peaks).max().item()) if peaks else 0.0


def _frozen_copy(model: PreTrainedModel) -> PreTrainedModel:
    reference = copy.deepcopy(model)
    reference.eval()
    for p in reference.parameters():
        p.requires_grad_(False)
    return reference
