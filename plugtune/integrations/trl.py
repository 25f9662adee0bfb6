"""plugtune's plugins under TRL's ``GRPOTrainer`` (``pip install -e '.[trl]'``, TRL 1.16).

    from plugtune.integrations import trl as pt

    run = pt.open_run("job.yaml")                 # deploys the plugins, records a job in the store
    trainer = GRPOTrainer(
        model=model, args=config, train_dataset=run.dataset(), processing_class=tokenizer,
        reward_funcs=run.reward_funcs(),           # one per grader, in plugtune's runtime
        rollout_func=run.rollout_func(),           # optional: the job's @rollout, per completion
        callbacks=[run.callback()],                # TRL's logs -> the console; ends the job
    )
    trainer.train()

``pt.reward_funcs(job_or_graders)`` and ``pt.rollout_func(job)`` are the one-line forms (each
opens its own run). A grader's ``None`` (or a call the failure policy drops) reaches TRL as
``None``, its "unscorable"; a call the policy fails the job with raises the classified
``PluginCallError`` out of ``trainer.train()`` and the job ends ``failed`` with it.

With ``rollout_func`` the rollout's ``policy`` calls are answered by plugtune's policy gateway:
decoding from the trainer's own model object (the weights TRL updates), or with
``use_vllm=True`` (``vllm_mode="server"``) by TRL's own ``VLLMClient``, whose server TRL keeps in
sync with the trained weights (``plugtune.integrations.trl_vllm``). Either way TRL trains on the
gateway's token records: ``prompt_ids``, ``completion_ids`` (model and tool tokens), the sampling
``logprobs`` and ``env_mask`` (1 = sampled by the policy). The reward path works with any TRL
generation.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from plugtune.errors import PluginCallError
from plugtune.integrations.recording import EngineRun
from plugtune.jobs.plugins import JobFunction
from plugtune.sdk import Context, PluginSpec, Sample, Sampling
from plugtune.spec.rows import read_dataset
from plugtune.spec.validation import ValidatedJob, validate_job
from plugtune.trainer.draft import GroupRule, TrajectoryDraft, groups_dropped_by_rule, settle_group
from plugtune.types import CallOutcome, TokenTrace

log = logging.getLogger(__name__)

ROW = "plugtune_row"  # the dataset column naming the job's row
TRAJECTORY = "plugtune_trajectory_id"  # what rollout_func hands the reward functions
_TRL_KEYS = {"trainer_state", "log_extra", "log_metric", "environments", TRAJECTORY, ROW}
#: TRL's log keys -> the console's curve names
_METRICS = {
    "reward": "reward/mean",
    "reward_std": "reward/std",
    "loss": "loss",
    "kl": "kl",
    "grad_norm": "grad_norm",
    "learning_rate": "learning_rate",
    "completions/mean_length": "response_length/mean",
    "step_time": "time/step_s",
}

RewardFunc = Callable[..., list[float | None]]


class TRLRun:
    """A TRL run of a plugtune job: the reward functions, the rollout function, the callback."""

    def __init__(self, run: EngineRun, rows: list[dict[str, Any]], group_size: int) -> None:
        self.run = run
        self.rows = rows
        self.group_size = group_size
        self._by_prompt = {_key(r["messages"]): i for i, r in enumerate(rows)}
        self._episodes: dict[str, TrajectoryDraft] = {}  # rolled out, kept until their rewards are in
        self._samples: dict[int, Sample] = {}  # the job's rows as samples, built once each
        self._graded: tuple[int, dict[str, list[float | None]]] | None = None
        self._gateway: Any = None
        self._vllm: Any = None  # the VLLMEngine behind the gateway (use_vllm=True)
        self._callback: Any = None

    # --- what TRL is given -----------------------------------------------------------------

    def dataset(self) -> Any:
        """The job's training rows as a ``datasets.Dataset``: ``prompt`` and ``plugtune_row``."""
        from datasets import Dataset

        return Dataset.from_list([{"prompt": r["messages"], ROW: i} for i, r in enumerate(self.rows)])

    def reward_weights(self) -> list[float]:
        """job.yaml's grader weights, in :meth:`reward_funcs` order (for ``GRPOConfig.reward_weights``)."""
        return [jf.spec.weight for jf in self._graders()]

    def reward_funcs(self) -> list[RewardFunc]:
        """One TRL reward function per grader and group grader, named by it; the first call of a
        batch grades it with every grader at once, the others read that result."""
        return [self._reward_func(i, jf.spec.name) for i, jf in enumerate(self._graders())]

    def rollout_func(self) -> Callable[[list[Any], Any], dict[str, Any]]:
        """TRL's ``rollout_func(prompts, trainer)``: the job's rollout once per prompt in the runtime."""
        if self.run.rollout is None:
            raise ValueError("this run has no rollout plugin: open it from a job.yaml")
        return self._rollouts

    def callback(self) -> Any:
        """A ``TrainerCallback``: TRL's logged metrics go to the store; the train's end ends the job."""
        if self._callback is None:
            self._callback = _callback_class()(self)
        return self._callback

    def close(self, error: BaseException | None = None) -> None:
        if self._gateway is not None:
            self._gateway.stop()
            self._gateway = None
        if self._vllm is not None:
            self._vllm.close()
            self._vllm = None
        self.run.close(error)

    # --- rewards ---------------------------------------------------------------------------

    def _graders(self) -> list[JobFunction]:
        return [*self.run.graders, *self.run.group_graders]

    def _reward_func(self, index: int, name: str) -> RewardFunc:
        def reward(
            prompts: list[Any], completions: list[Any], completion_ids: list[list[int]], **kwargs: Any
        ) -> list[float | None]:
            if index == 0 or self._graded is None or self._graded[0] != id(completion_ids):
                self._graded = (id(completion_ids), self._grade(prompts, completions, completion_ids, kwargs))
            return self._graded[1][name]

        reward.__name__ = name
        return reward

    def _grade(
        self, prompts: list[Any], completions: list[Any], ids: list[list[int]], kwargs: dict[str, Any]
    ) -> dict[str, list[float | None]]:
        step = _step(kwargs)
        self.run.expect_steps(int(getattr(kwargs.get("trainer_state"), "max_steps", 0) or 0))
        slots = prompt_groups([_prompt_key(p, kwargs, i) for i, p in enumerate(prompts)], self.group_size)
        episodes = [
            self._episode_for(step, i, slots[i], prompts, completions, kwargs) for i in range(len(prompts))
        ]
        try:
            self._grade_single(step, episodes)
            self._grade_groups(step, episodes)
        except PluginCallError:
            if self.run.stopped is not None:  # the failure policy ended the job
                self.close()
            raise
        rule = self.run.job.spec.failure_policy.group.rule() if self.run.job is not None else GroupRule()
        dropped = {gid for gid, group in _groups(episodes).items() if settle_group(group, rule)}
        weights = {jf.spec.name: jf.spec.weight for jf in self._graders()}
        records = []
        for e, completion_ids in zip(episodes, ids, strict=True):
            if e.trace is None:  # no rollout here: TRL's completion, all of it sampled
                e.trace = _completion_trace(completion_ids)
            records.append(
                e.record(step=step, policy_version=step - 1, weights=weights, code_hash=self.run.hashes)
            )
        self.run.add_trajectories(records)
        self.run.add_metrics(step, {"groups/dropped_by_rule": float(groups_dropped_by_rule(records))})
        self.run.add_signal(step, records, weights)  # the reward-signal checks, from the records
        try:
            self.run.flush(step, durable=False)  # the store's thread writes it within a second
        except PluginCallError:  # the circuit breaker tripped: the run ends with its error
            self.close()
            raise
        # TRL is handed None for a grade that did not stand, and for every trajectory of a dropped
        # group (a plugin discarded it, or failure_policy.group): all None, it gives no gradient
        return {
            name: [None if e.group_id in dropped else e.components.get(name) for e in episodes]
            for name in weights
        }

    def _episode_for(
        self,
        step: int,
        i: int,
        slot: tuple[int, int],
        prompts: list[Any],
        completions: list[Any],
        kwargs: dict[str, Any],
    ) -> TrajectoryDraft:
        if TRAJECTORY in kwargs:
            found = self._episodes.pop(kwargs[TRAJECTORY][i], None)
            if found is not None:
                return found
        group, k = slot
        sample = self._sample(prompts[i], kwargs, i)
        reply = completions[i] if isinstance(completions[i], list) else [_assistant(completions[i])]
        return _draft(sample, f"s{step}-p{group}", k, [*sample.messages, *reply])

    def _sample(self, prompt: Any, kwargs: dict[str, Any], i: int) -> Sample:
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
        index = kwargs[ROW][i] if ROW in kwargs else self._by_prompt.get(_key(messages))
        if index is not None and index < len(self.rows):
            index = int(index)
            if index not in self._samples:
                self._samples[index] = _sample_of(self.rows[index], index, self.run)
            return self._samples[index]
        extra = {k: v[i] for k, v in kwargs.items() if k not in _TRL_KEYS and isinstance(v, list)}
        return Sample(messages=list(messages), extra=extra, index=i)

    def _grade_single(self, step: int, episodes: list[TrajectoryDraft]) -> None:
        calls: list[tuple[TrajectoryDraft, JobFunction]] = []
        args: list[tuple[JobFunction, Context, tuple[Any, ...]]] = []
        for e in episodes:
            if not e.ok:
                continue
            trajectory = e.trajectory()
            for jf in self.run.graders:
                calls.append((e, jf))
                args.append((jf, _ctx(step, e, str(self.run.job_id), jf.spec.name), (e.sample, trajectory)))
        for (e, jf), future in zip(calls, self.run.submit_all(args), strict=True):
            self._grades(future, [e], jf.spec.name)

    def _grade_groups(self, step: int, episodes: list[TrajectoryDraft]) -> None:
        groups = _groups(episodes)
        for jf in self.run.group_graders:
            for group in groups.values():
                members = [e for e in group if e.ok]
                if not members:
                    continue
                first = members[0]
                ctx = Context(step=step, sample_id=first.sample.index, rollout_index=-1)
                future = self.run.submit(jf, ctx, first.sample, [e.trajectory() for e in members])
                self._grades(future, members, jf.spec.name, group=True)

    def _grades(
        self,
        future: concurrent.futures.Future[CallOutcome],
        members: list[TrajectoryDraft],
        name: str,
        group: bool = False,
    ) -> None:
        """The grader's verdict on its trajectories (one, or a group grader's group). Their
        components are what TRL is handed: None for a call that was dropped or did not succeed."""
        try:
            outcome = future.result()
        except PluginCallError as exc:
            if self.run.stopped is not None:
                raise
            for e in members:
                e.call_failed(exc)
                e.components[name] = None
            return
        values = _group_values(outcome.value, len(members)) if group else [outcome.value]
        for e, value in zip(members, values, strict=True):
            e.graded(name, outcome, value)
            e.components.setdefault(name, None)

    # --- rollouts --------------------------------------------------------------------------

    def _rollouts(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        generations = getattr(getattr(trainer, "args", None), "num_generations", None)
        if isinstance(generations, int) and generations != self.group_size:
            raise ValueError(
                f"TRL's num_generations is {generations} but the job's group_size is {self.group_size}: "
                "a group would mix prompts. Set GRPOConfig(num_generations=...) to the job's "
                "hyperparameters.group_size (or open_run(..., group_size=...) to TRL's)"
            )
        if self.callback() not in trainer.callback_handler.callbacks:
            trainer.add_callback(self.callback())  # TRL's metrics and the run's end reach the store
        gateway = self._gateway_for(trainer)
        step = trainer.state.global_step + 1
        gateway.set_policy_version(trainer.state.global_step)
        rollout = self.run.rollout
        assert rollout is not None
        started = []
        slots = prompt_groups([_key(p) for p in prompts], self.group_size)
        for i, prompt in enumerate(prompts):
            group, k = slots[i]
            sample = self._sample(prompt, {}, i)
            episode = _draft(sample, f"s{step}-p{group}", k, list(sample.messages))
            fresh = _FreshPolicy(rollout, gateway, episode.trajectory_id)
            started.append((episode, self.run.submit(fresh, _ctx(step, episode), sample)))  # type: ignore[arg-type]
        out: dict[str, list[Any]] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask")}
        out[TRAJECTORY] = []
        pad = trainer.processing_class.eos_token_id
        for episode, future in started:
            self._finish_rollout(episode, future, gateway)
            trace = episode.trace
            ok = episode.ok and trace is not None and bool(trace.response_ids)
            if trace is not None and ok:
                out["prompt_ids"].append(list(trace.prompt_ids))
                out["completion_ids"].append(list(trace.response_ids))
                out["logprobs"].append(list(trace.response_logprobs))
                out["env_mask"].append(list(trace.response_mask))
            else:  # nothing to learn from: one masked token keeps TRL's batch shape
                if episode.ok:
                    episode.fail()
                out["prompt_ids"].append(list(trace.prompt_ids) if trace and trace.prompt_ids else [pad])
                out["completion_ids"].append([pad])
                out["logprobs"].append([0.0])
                out["env_mask"].append([0])
            out[TRAJECTORY].append(episode.trajectory_id)
            self._episodes[episode.trajectory_id] = episode
        return out

    def _finish_rollout(
        self, episode: TrajectoryDraft, future: concurrent.futures.Future[CallOutcome], gateway: Any
    ) -> None:
        try:
            outcome = future.result()
        except PluginCallError as exc:
            _take(gateway, episode.trajectory_id)  # a failed rollout's tokens are not trained on
            if self.run.stopped is not None:
                self.close()
                raise
            episode.rollout_failed(exc)
            return
        episode.trace = _take(gateway, episode.trajectory_id)
        episode.rolled_out(outcome, self.run.rollout.spec.name if self.run.rollout else "rollout")

    def _gateway_for(self, trainer: Any) -> Any:
        if self._gateway is None:
            from plugtune.gateway import JobSampling, PolicyGateway

            args = trainer.args
            sampling = JobSampling(args.temperature, args.top_p, args.max_completion_length)
            if args.use_vllm:
                self._gateway = self._vllm_gateway(trainer, sampling)
            else:
                self._gateway = PolicyGateway(trainer.model, trainer.processing_class, sampling=sampling)
            self._gateway.start()
        return self._gateway

    def _vllm_gateway(self, trainer: Any, sampling: Any) -> Any:
        from plugtune.integrations.token_gateway import TokenGateway
        from plugtune.integrations.trl_vllm import VLLMEngine, vllm_client_of

        self._vllm = VLLMEngine(vllm_client_of(trainer))
        context = int(getattr(trainer.model.config, "max_position_embeddings", 0) or 4096)
        return TokenGateway(
            trainer.processing_class,
            self._vllm.generate,
            self._vllm.loop,
            max_context=context,
            sampling=sampling,
        )


class _FreshPolicy:
    """The rollout with a fresh gateway record per attempt (a retry's tokens start over)."""

    def __init__(self, fn: JobFunction, gateway: Any, trajectory_id: str) -> None:
        self.fn, self.gateway, self.trajectory_id = fn, gateway, trajectory_id

    @property
    def spec(self) -> PluginSpec:
        return self.fn.spec

    async def invoke(self, ctx: Context, *args: Any) -> CallOutcome:
        return await self.fn.invoke(ctx, self.gateway.open(self.trajectory_id), *args)


def _callback_class() -> type:
    from transformers import TrainerCallback

    class PlugtuneCallback(TrainerCallback):
        """TRL's logs as the job's training metrics; the end of ``train()`` ends the job."""

        def __init__(self, owner: TRLRun) -> None:
            self.owner = owner

        def on_log(
            self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any
        ) -> None:
            metrics = {_METRICS.get(k, f"trl/{k}"): v for k, v in (logs or {}).items()}
            self.owner.run.add_metrics(state.global_step, metrics)

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            if self.owner.run.cancel_requested():  # cancelled in the console: stop after this step
                job_id = self.owner.run.job_id
                log.warning("job %d was cancelled: TRL stops after step %d", job_id, state.global_step)
                control.should_training_stop = True

        def on_train_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            self.owner.close()

    return PlugtuneCallback


def _checkpoints_class() -> type:
    from transformers import TrainerCallback

    class CheckpointRecorder(TrainerCallback):
        """Each checkpoint TRL saved, recorded in the store once its step's records are durable."""

        def __init__(self, owner: TRLRun) -> None:
            self.owner = owner

        def on_save(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            path = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            self.owner.run.flush()
            self.owner.run.store.add_checkpoint(self.owner.run.job_id, state.global_step, str(path))

    return CheckpointRecorder


# --- opening a run ---------------------------------------------------------------------------


def open_run(
    job_or_graders: ValidatedJob | str | Path | Sequence[str | Callable[..., Any]],
    *,
    group_size: int | None = None,
    store: Any = None,
    job_id: int | None = None,
) -> TRLRun:
    """Deploy a job's plugins (a job.yaml, a validated job) or only graders (``file.py:function``
    entries or decorated functions) and record the TRL run as a plugtune job.

    ``group_size``: TRL's ``num_generations`` (default: the job's ``group_size``, else 1)."""
    if isinstance(job_or_graders, (str, Path)) and str(job_or_graders).endswith((".yaml", ".yml")):
        job: ValidatedJob | None = validate_job(job_or_graders)
    elif isinstance(job_or_graders, ValidatedJob):
        job = job_or_graders
    else:
        job = None
    if job is not None:
        run = EngineRun.open(job, engine="trl", store=store, job_id=job_id)
        rows = read_dataset(job.train_path)
        size = group_size or job.spec.hyperparameters.group_size
    else:
        items = [job_or_graders] if isinstance(job_or_graders, (str, Path)) else list(job_or_graders)  # type: ignore[arg-type]
        run = EngineRun.open(engine="trl", graders=[_entry(g) for g in items], store=store, job_id=job_id)
        rows, size = [], group_size or 1
    return TRLRun(run, rows, size)


def reward_funcs(
    job_or_graders: TRLRun | ValidatedJob | str | Path | Sequence[str | Callable[..., Any]],
    *,
    group_size: int | None = None,
) -> list[RewardFunc]:
    """TRL reward functions backed by the job's graders (or the given ones) in plugtune's runtime."""
    run = (
        job_or_graders
        if isinstance(job_or_graders, TRLRun)
        else open_run(job_or_graders, group_size=group_size)
    )
    return run.reward_funcs()


def rollout_func(job: TRLRun | ValidatedJob | str | Path) -> Callable[[list[Any], Any], dict[str, Any]]:
    """TRL's ``rollout_func`` running the job's ``@rollout`` per completion in plugtune's runtime."""
    return (job if isinstance(job, TRLRun) else open_run(job)).rollout_func()


def _entry(grader: str | Path | Callable[..., Any]) -> str:
    if isinstance(grader, (str, Path)):
        return str(grader)
    import inspect

    source = inspect.getsourcefile(grader)
    if source is None:
        raise ValueError(f"{grader!r} has no source file; pass its 'file.py:function' entry instead")
    return f"{Path(source).resolve()}:{grader.__name__}"


# --- small pieces ----------------------------------------------------------------------------


def prompt_groups(keys: list[str], group_size: int) -> list[tuple[int, int]]:
    """Each completion's (group, index in group): a group is a run of completions of one prompt,
    at most ``group_size`` long, so a group never mixes prompts whatever TRL's ``num_generations``."""
    slots: list[tuple[int, int]] = []
    group, k = -1, group_size
    for i, key in enumerate(keys):
        if k >= group_size or key != keys[i - 1]:
            group, k = group + 1, 0
        slots.append((group, k))
        k += 1
    return slots


def _key(messages: Any) -> str:
    return json.dumps(messages, sort_keys=True, default=str)


def _prompt_key(prompt: Any, kwargs: dict[str, Any], i: int) -> str:
    row = kwargs[ROW][i] if ROW in kwargs else None
    return f"{row}\0{_key(prompt)}"


def _step(kwargs: dict[str, Any]) -> int:
    state = kwargs.get("trainer_state")
    return int(getattr(state, "global_step", 0)) + 1


def _draft(sample: Sample, group_id: str, k: int, messages: list[dict[str, Any]]) -> TrajectoryDraft:
    return TrajectoryDraft(f"{group_id}-r{k}", sample, group_id=group_id, rollout_index=k, messages=messages)


def _ctx(step: int, e: TrajectoryDraft, job_id: str = "", plugin: str = "") -> Context:
    return Context(
        job_id=job_id,
        step=step,
        sample_id=e.sample.index,
        rollout_index=e.rollout_index,
        trajectory_id=e.trajectory_id,
        plugin=plugin,
    )


def _assistant(text: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": str(text)}


def _sample_of(row: dict[str, Any], index: int, run: EngineRun) -> Sample:
    sample = Sample.from_dict({**row, "index": index})
    if run.job is None:
        return sample
    c = run.job.spec.hyperparameters
    return Sample(
        sample.messages,
        sample.tools,
        sample.extra,
        index,
        Sampling(temperature=c.temperature, top_p=c.top_p, max_tokens=c.max_new_tokens),
    )


def _take(gateway: Any, trajectory_id: str) -> TokenTrace | None:
    try:
        return gateway.take(trajectory_id)
    except KeyError:
        return None


def _groups(episodes: list[TrajectoryDraft]) -> dict[str, list[TrajectoryDraft]]:
    groups: dict[str, list[TrajectoryDraft]] = {}
    for e in episodes:
        groups.setdefault(e.group_id, []).append(e)
    return groups


def _completion_trace(ids: list[int]) -> TokenTrace:
    return TokenTrace(
        prompt_ids=[], response_ids=list(ids), response_mask=[1] * len(ids), response_logprobs=[], messages=[]
    )


def _group_values(value: Any, size: int) -> list[Any]:
    """A group grader's value for each of its ``size`` trajectories (None where it gave none)."""
    values = value if isinstance(value, list) else []
    return [values[n] if n < len(values) else None for n in range(size)]


# --- `trainer: trl` under `plugtune run` ------------------------------------------------------


def grpo_config(job: ValidatedJob, output_dir: Path, reward_weights: list[float]) -> Any:
    """TRL's ``GRPOConfig`` with job.yaml's hyperparameters (names mapped one to one)."""
    import torch
    from trl import GRPOConfig

    c = job.spec.hyperparameters
    return GRPOConfig(
        output_dir=str(output_dir),
        per_device_train_batch_size=c.batch_size * c.group_size,
        num_generations=c.group_size,
        max_completion_length=c.max_new_tokens,
        learning_rate=c.learning_rate,
        max_steps=c.steps,
        beta=c.kl_coef,
        temperature=c.temperature,
        top_p=c.top_p,
        epsilon=c.clip_ratio,
        max_grad_norm=c.grad_clip,
        weight_decay=c.weight_decay,
        seed=c.seed,
        loss_type="dapo",  # token-level, as plugtune's trainer
        lr_scheduler_type="constant",
        use_cpu=not torch.cuda.is_available(),
        bf16=False,
        logging_steps=1,
        report_to="none",
        save_strategy="steps",  # checkpoints a retry resumes from (TRL's resume_from_checkpoint)
        save_steps=c.save_every_n_steps,
        disable_tqdm=True,
        reward_weights=reward_weights,
    )


def train_job(store: Any, job_id: int, job: ValidatedJob, out: Path) -> None:
    """One attempt of a ``trainer: trl`` job: TRL's GRPOTrainer on the job's model and data, the
    job's rollout and graders in plugtune's runtime; the trained model lands in ``out/final``.

    TRL saves a checkpoint (model, optimizer, scheduler, RNG, trainer state) every
    ``save_every_n_steps`` under ``out/trl/checkpoint-N`` and each is recorded in the store, so a
    retried attempt resumes from the newest one (``resume_from_checkpoint``) and the steps after
    it are forgotten and run again, as for a native job. TRL's metrics and the plugins'
    ``ctx.metric`` aggregates go to the job's TensorBoard files (and W&B run) as a native job's do.
    The attempt process (``plugtune.jobs.attempt``) owns the job's status and classifies errors."""
    import os

    from plugtune.jobs.attempt import job_trackers
    from plugtune.trainer.model import load_model

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL
    checkpoint = store.latest_checkpoint(job_id)
    resume = checkpoint.path if checkpoint is not None and Path(checkpoint.path).is_dir() else None
    store.delete_after_step(job_id, checkpoint.step if resume and checkpoint else -1)
    lm = load_model(job.model_dir)
    with job_trackers(out, job.spec, job_id) as trackers:
        _train(store, job_id, job, out, lm, resume, trackers)


def _train(
    store: Any, job_id: int, job: ValidatedJob, out: Path, lm: Any, resume: str | None, trackers: Any
) -> None:
    """TRL's training of the job, its metrics also written to ``trackers``."""
    from trl import GRPOTrainer

    run = open_run(job, store=store, job_id=job_id)
    run.run.trackers = trackers
    try:
        trainer = GRPOTrainer(
            model=lm.model,
            reward_funcs=list[Any](run.reward_funcs()),
            args=grpo_config(job, out / "trl", run.reward_weights()),
            train_dataset=run.dataset(),
            processing_class=lm.tokenizer,
            rollout_func=run.rollout_func(),
            callbacks=[run.callback(), _checkpoints_class()(run)],
        )
        trainer.train(resume_from_checkpoint=resume)
        trainer.save_model(str(out / "final"))
    except BaseException as exc:
        run.close(exc)
        raise
    run.close()
