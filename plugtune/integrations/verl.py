"""plugtune as verl's plugin layer: an agent loop and a reward function backed by the runtime.

verl (``pip install -e '.[verl]'``) keeps its launcher, Ray workers, FSDP/Megatron and
vLLM/SGLang; plugtune runs the job's ``@rollout`` and ``@grader`` plugins, isolated and limited,
classifies their failures and records the run as a job that ``plugtune serve`` shows.

Agent loop (``actor_rollout_ref.rollout.agent.agent_loop_config_path=agent_loops.yaml``)::

    - name: plugtune
      _target_: plugtune.integrations.verl.PlugtuneAgentLoop
      job: /abs/path/job.yaml

and ``agent_name: plugtune`` in the dataset (or ``rollout.agent.default_agent_loop=plugtune``).
Each trajectory runs the rollout plugin in the runtime; its OpenAI-style policy calls are answered
by verl's ``server_manager.generate`` (token in, token out) and the ``AgentLoopOutput`` is built
from the recorded tokens. When the job lists graders they grade it there and then
(``reward_score``); a trajectory that failed or could not be scored is masked out
(``response_mask`` all 0: no gradient) with ``reward_score`` 0.0.

Reward function (``reward.custom_reward_function``): ``path=pkg://plugtune.integrations.verl``,
``name=compute_score`` (verl's per-sample form) or ``name=compute_score_batch`` (the ``batch``
reward manager's form), ``reward_kwargs.job=/abs/path/job.yaml``.

``PLUGTUNE_JOB`` may name the job.yaml instead.

One verl run is one plugtune job: verl's agent-loop and reward workers are separate Ray processes,
and each one's ``EngineRun`` joins the job of the run's key (``run_key()``: ``run=`` in the agent
loop config or ``reward_kwargs``, else ``$PLUGTUNE_RUN``, else the Ray session and job every worker
of one verl run shares); the first to start creates it, the last to close ends it. The job follows
the run's live processes (each is a member of the run key, by pid): the one that created it may
exit first, ``plugtune serve`` leaves it running while a member lives and fails it ("engine run
stopped") once every member is gone without leaving (killed); the job's ``steps_done`` is the
furthest any member reported. Outside Ray and without a key, each process records a job of its
own. ``close_runs()`` (or the process's exit) leaves the run.

Steps: an agent loop takes the trajectory's step from verl's worker (its batch's
``meta_info["global_steps"]``); the reward function from what verl's agent loop passes on in
``extra_info`` (plugtune's ``plugtune_step``, or the weights version verl's server sampled with + 1).

``failure_policy.group`` is applied in the agent loop: a trajectory waits for the rest of its prompt
group (verl's ``uid``, ``rollout.n`` trajectories) and the group is judged as plugtune's trainer
judges it (a dropped group's trajectories are masked out and recorded ``discard`` saying why; the
step's ``groups/dropped_by_rule`` counts them). The reward function sees one response at a time, so
it refuses a group rule. Each training step's reward-signal checks run on its recorded trajectories.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)
from verl.workers.rollout.replica import TokenOutput

from plugtune.errors import InvalidValueError, Problem
from plugtune.gateway.engine import GenerationEngine, SamplingParams
from plugtune.integrations.recording import EngineRun
from plugtune.integrations.token_gateway import TokenGateway, TokenReply
from plugtune.integrations.verl_trajectory import TrajectoryRunner, plain, sample_of
from plugtune.spec.models import GroupPolicy
from plugtune.spec.validation import ValidatedJob, validate_job
from plugtune.types import TrajectoryRecord

log = logging.getLogger(__name__)

JOB_ENV = "PLUGTUNE_JOB"
RUN_ENV = "PLUGTUNE_RUN"

# verl builds a new agent loop object per trajectory and loads the reward function by path, so
# the run they share lives here: one per process and job.yaml.
_runs: dict[tuple[Path, str], _VerlRun] = {}
_runs_lock = threading.Lock()


class _VerlRun:
    """One job's EngineRun in this process, and the gateway per verl server manager."""

    def __init__(self, run: EngineRun) -> None:
        self.run = run
        self.runner = TrajectoryRunner(run)
        self._gateways: dict[int, TokenGateway] = {}
        self._lock = threading.Lock()

    def gateway_for(self, server_manager: Any, tokenizer: Any, max_context: int) -> TokenGateway:
        """The policy gateway in front of ``server_manager`` (started on first use)."""
        with self._lock:
            gateway = self._gateways.get(id(server_manager))
            if gateway is None:
                generate = _verl_generate(server_manager)
                loop = asyncio.get_running_loop()  # verl's loop: its clients belong to it
                # -1 until verl's server says which weights it sampled with (its global_steps)
                gateway = TokenGateway(tokenizer, generate, loop, max_context=max_context, policy_version=-1)
                gateway.start()
                self._gateways[id(server_manager)] = gateway
            return gateway

    def close(self) -> None:
        atexit.unregister(self.close)
        for gateway in self._gateways.values():
            gateway.stop()
        try:
            self.runner.finish()
        finally:
            self.run.close()


def run_for(job: str | os.PathLike[str] | None, run: str | None = None, *, scoring: bool = False) -> _VerlRun:
    """This process's run of ``job`` (else ``$PLUGTUNE_JOB``), opened on first use, in the job
    of the verl run ``run_key(run)`` names; ``scoring``: for verl's reward function, which refuses
    a group rule (before any job is recorded)."""
    path = _job_path(job)
    key = run_key(run)
    with _runs_lock:
        found = _runs.get((path, key))
        if found is not None and scoring:
            _refuse_group_rule(found.run.job)
        if found is None:
            validated = validate_job(path, check_model=False)  # the model is verl's
            if scoring:
                _refuse_group_rule(validated)
            if validated.group_graders:
                ref = validated.group_graders[0]
                message = (
                    f"group graders ({ref.entry}) need a whole group, which verl's agent loop and "
                    "reward function never see together: move the scoring into a @grader"
                )
                raise InvalidValueError([Problem(str(path), message, ref.line, "plugins.group_graders")])
            found = _VerlRun(EngineRun.open(validated, engine="verl", run_key=key))
            atexit.register(found.close)  # before the EngineRun's own: the last step's checks first
            _runs[(path, key)] = found
        return found


def run_key(given: str | None = None) -> str:
    """The key of the verl run this process works for: ``given`` (``run=`` in the agent loop
    config or ``reward_kwargs``), else ``$PLUGTUNE_RUN``, else the Ray session and job of this
    worker (every worker of one verl run shares them), else '' (a job of this process's own)."""
    key = given or os.environ.get(RUN_ENV, "")
    if key:
        return str(key)
    ray = sys.modules.get("ray")  # verl's workers run in Ray; without it imported, no Ray here
    if ray is not None and ray.is_initialized():
        context = ray.get_runtime_context()
        return f"ray:{context.get_session_name()}:{context.get_job_id()}"
    return ""


def _refuse_group_rule(job: ValidatedJob | None) -> None:
    """verl's reward function scores one response at a time: it cannot judge a group."""
    if job is None or job.spec.failure_policy.group == GroupPolicy():
        return
    message = (
        "a group rule needs a whole group, which verl's reward function never sees (one response a "
        "call): grade in plugtune's agent loop (it applies failure_policy.group), or leave "
        "failure_policy.group out (a failed trajectory is dropped alone)"
    )
    line = job.line_of(("failure_policy", "group"))
    raise InvalidValueError([Problem(str(job.job_file), message, line, "failure_policy.group")])


def close_runs() -> None:
    """End every run this process opened (each job is then succeeded, or failed with its error)."""
    with _runs_lock:
        runs = list(_runs.values())
        _runs.clear()
    for run in runs:
        run.close()


def _job_path(job: str | os.PathLike[str] | None) -> Path:
    given = str(job) if job else os.environ.get(JOB_ENV, "")
    if not given:
        raise ValueError(
            "plugtune's verl integration needs the job.yaml with the plugins: set `job:` in the agent "
            "loop config, reward.custom_reward_function.reward_kwargs.job=/path/job.yaml, or "
            f"${JOB_ENV}=/path/job.yaml"
        )
    path = Path(given).expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"the plugtune job file {path} does not exist (from {given!r})")
    return path


def _verl_step() -> tuple[int | None, bool]:
    """The training step and the validate flag of the trajectory verl's ``AgentLoopWorker`` is
    running (its batch's ``meta_info["global_steps"]`` and ``["validate"]``). verl hands them to its
    trace context only, not to ``run()``, so they are read from the worker's ``_run_agent_loop``
    frame (verl 0.9); ``(None, False)`` where that frame is not found."""
    frame = sys._getframe(1)
    for _ in range(6):  # run() -> _run_agent_loop(), within a few frames
        frame = frame.f_back  # type: ignore[assignment]
        if frame is None:
            break
        info = frame.f_locals.get("trajectory") if frame.f_code.co_name == "_run_agent_loop" else None
        if isinstance(info, Mapping) and isinstance(info.get("step"), (int, float)):
            step = int(info["step"])
            return (step if step >= 0 else None), bool(info.get("validate", False))
    return None, False


def _verl_generate(server_manager: Any) -> Any:
    async def generate(prompt_ids: list[int], params: SamplingParams) -> TokenReply:
        sampling: dict[str, Any] = {
            "temperature": params.temperature,
            "top_p": params.top_p,
            "max_tokens": params.max_tokens,
            "logprobs": True,
        }
        if params.stop:
            sampling["stop"] = list(params.stop)
        if params.seed is not None:
            sampling["seed"] = params.seed
        output = await server_manager.generate(
            request_id=uuid4().hex, prompt_ids=prompt_ids, sampling_params=sampling
        )
        steps = (output.extra_fields or {}).get("global_steps")  # the weights' step, as verl's servers say
        version = int(steps) if isinstance(steps, (int, float)) else None
        logprobs = list(output.log_probs) if output.log_probs else None
        return TokenReply(list(output.token_ids), logprobs, version)

    return generate


@register("plugtune")
class PlugtuneAgentLoop(AgentLoopBase):
    """verl agent loop that runs the job's ``@rollout`` plugin in plugtune's runtime."""

    def __init__(self, *args: Any, job: str | None = None, run: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.job, self.run_name = job, run
        self.tokenizer: Any = self.tokenizer  # a transformers tokenizer (verl annotates the class)
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.response_length = int(self.rollout_config.response_length)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        verl_run = run_for(self.job, self.run_name)
        max_context = self.prompt_length + self.response_length
        gateway = verl_run.gateway_for(self.server_manager, self.tokenizer, max_context)
        sample = sample_of(kwargs, sampling_params, self.response_length)
        step, validate = _verl_step()
        verl_run.runner.max_new_tokens = self.response_length
        verl_run.run.set_steps(self._total_steps())
        started = time.perf_counter()
        phase = "eval" if validate else "train"
        group = self._group_of(kwargs, step, sample.index, validate)
        record = await verl_run.runner.roll(gateway, sample, step=step, phase=phase, group=group)
        elapsed = time.perf_counter() - started
        if verl_run.run.stopped is not None:  # failure_policy fail_job: the run ends with this error
            verl_run.run.flush()
            raise verl_run.run.stopped
        return self._output(record, verl_run.runner.grades, elapsed)

    def _total_steps(self) -> int:
        """verl's training steps (its trainer writes the total it computed into the actor's optim
        config, which its workers get; else ``trainer.total_training_steps``); 0 when unknown."""
        for total in (
            self.config.actor_rollout_ref.actor.get("optim", {}).get("total_training_steps"),
            self.config.trainer.get("total_training_steps"),
        ):
            if isinstance(total, int) and total > 0:
                return total
        return 0

    def _group_of(self, row: dict[str, Any], step: int | None, index: int, validate: bool) -> tuple[str, int]:
        """The trajectory's prompt group: verl's ``uid`` of the prompt (else its step and row) and
        its size (``rollout.n``, ``val_kwargs.n`` when validating)."""
        n = self.rollout_config.val_kwargs.n if validate else self.rollout_config.n
        uid = plain(row.get("uid"))
        key = str(uid) if uid is not None else f"{'eval' if validate else 'train'}-s{step}-p{index}"
        return key, max(int(n or 1), 1)

    def _output(self, record: TrajectoryRecord, grades: bool, elapsed: float) -> AgentLoopOutput:
        prompt_ids = list(record.prompt_ids) or self._prompt_of(record)
        prompt_ids = self._cap_text_prompt_length(prompt_ids)
        response_ids = list(record.response_ids)[: self.response_length]
        mask = list(record.response_mask)[: len(response_ids)]
        logprobs = list(record.response_logprobs)[: len(response_ids)]
        usable = record.status == "success" and (record.reward is not None or not grades)
        if not response_ids:  # verl needs one response token; this one trains nothing
            response_ids, mask, logprobs = [int(self.tokenizer.eos_token_id)], [0], [0.0]
        if not usable:
            mask = [0] * len(response_ids)
        reward = (record.reward if usable else 0.0) if grades else None
        turns = sum(1 for m in record.messages if m.get("role") in ("user", "assistant", "tool"))
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids,
            response_mask=mask,
            response_logprobs=logprobs,
            reward_score=reward,
            num_turns=turns,
            metrics=AgentLoopMetrics(generate_sequences=elapsed),
            extra_fields={
                "turn_scores": [],
                "tool_rewards": [],
                "plugtune_trajectory_id": record.trajectory_id,
                "plugtune_status": record.status,
                "plugtune_step": record.step,  # for verl's reward function, which is not told it
                # the weights versions it was sampled with, as verl's own loops report them
                "min_global_steps": record.policy_version if record.step else None,
                "max_global_steps": record.step - 1 if record.step else None,
            },
        )

    def _prompt_of(self, record: TrajectoryRecord) -> list[int]:
        """The prompt of a rollout that never called the policy (it trains nothing)."""
        messages = [m for m in record.messages if m.get("role") != "assistant"] or record.messages
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, Mapping) else ids)


def compute_score(
    data_source: Any,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    *,
    job: str | None = None,
    **kwargs: Any,
) -> dict[str, float]:
    """verl's ``custom_reward_function`` (per sample): the job's graders score ``solution_str``.

    Returns ``{"score": reward, "plugtune_scored": 1.0}``; a response no grader could score (every
    grader said ``None``, or its call failed and the policy dropped the sample) scores 0.0 with
    ``plugtune_scored`` 0.0, as verl needs a number. Under ``fail_job`` a failed call raises the
    classified ``PluginCallError``."""
    verl_run = run_for(job, kwargs.get("run"), scoring=True)
    record = verl_run.runner.grade_text(data_source, solution_str, ground_truth, plain(extra_info or {}))
    if verl_run.run.stopped is not None:
        raise verl_run.run.stopped
    if record.reward is None or record.status != "success":
        return {"score": 0.0, "plugtune_scored": 0.0}
    return {"score": float(record.reward), "plugtune_scored": 1.0}


def compute_score_batch(
    data_sources: Any,
    solution_strs: list[str],
    ground_truths: list[Any],
    extra_infos: list[dict[str, Any]] | None = None,
    *,
    job: str | None = None,
    **kwargs: Any,
) -> list[dict[str, float]]:
    """The ``batch`` reward manager's form: every response graded concurrently in the runtime."""
    verl_run = run_for(job, kwargs.get("run"), scoring=True)
    infos = list(extra_infos) if extra_infos is not None else [{} for _ in solution_strs]
    rows = zip(list(data_sources), solution_strs, ground_truths, infos, strict=True)
    records = verl_run.runner.grade_texts([(ds, text, gt, plain(info or {})) for ds, text, gt, info in rows])
    if verl_run.run.stopped is not None:
        raise verl_run.run.stopped
    return [
        {"score": float(r.reward), "plugtune_scored": 1.0}
        if r.reward is not None and r.status == "success"
        else {"score": 0.0, "plugtune_scored": 0.0}
        for r in records
    ]


class LocalServerManager:
    """verl's server interface (``await generate(request_id, prompt_ids=, sampling_params=)`` ->
    ``TokenOutput``) over plugtune's CPU ``GenerationEngine``: a verl agent loop runs on one
    machine without vLLM (tests, a dry run of a rollout before a cluster job). Like verl's servers
    it reports the weights version it sampled with as ``extra_fields["global_steps"]`` (the
    engine's ``policy_version``)."""

    def __init__(self, engine: GenerationEngine) -> None:
        self.engine = engine
        self.requests = 0

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kwargs: Any
    ) -> TokenOutput:
        self.requests += 1
        params = SamplingParams(
            max_tokens=int(sampling_params.get("max_tokens") or sampling_params.get("max_new_tokens") or 64),
            temperature=float(sampling_params.get("temperature", 1.0)),
            top_p=float(sampling_params.get("top_p", 1.0)),
            stop=tuple(sampling_params.get("stop") or ()),
            seed=sampling_params.get("seed"),
        )
        generation = await asyncio.wrap_future(self.engine.submit(list(prompt_ids), params))
        logprobs = generation.logprobs if sampling_params.get("logprobs") else None
        return TokenOutput(
            token_ids=generation.token_ids,
            log_probs=logprobs,
            stop_reason="completed",
            extra_fields={"global_steps": generation.policy_version},
        )


__all__ = [
    "LocalServerManager",
    "PlugtuneAgentLoop",
    "close_runs",
    "compute_score",
    "compute_score_batch",
    "run_for",
    "run_key",
]
