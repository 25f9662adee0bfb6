"""Evaluation of a job's ``data.validation``: wired for the attempt loop, and alone (``plugtune eval``).

The evaluator calls the job's own deployed plugins through the job's failure policy, and asks
the job's policy gateway through two views of it: one decoding greedily (temperature 0, for
pass@1), one sampling with the job's settings (for pass@k). Training requests keep the job's
enforced settings; a rollout that contradicts the eval settings gets a 400 that says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plugtune.errors import InvalidValueError, Problem
from plugtune.settings import Settings
from plugtune.spec.models import BUILTIN_MODEL_PREFIX, JobSpec, resolve_model
from plugtune.spec.rows import read_dataset
from plugtune.spec.validation import ValidatedJob
from plugtune.trainer.evaluation import EvalResult, EvalSettings, Evaluator
from plugtune.trainer.groups import Plugins
from plugtune.trainer.protocols import Caller


def eval_settings(spec: JobSpec) -> EvalSettings:
    h = spec.hyperparameters
    return EvalSettings(
        k=spec.eval.k,
        samples=spec.eval.sample_count(),
        pass_threshold=spec.eval.pass_threshold,
        temperature=h.temperature,
        top_p=h.top_p,
        max_new_tokens=h.max_new_tokens,
    )


def is_eval_step(step: int, spec: JobSpec) -> bool:
    """Whether the weights after ``step`` are evaluated: the initial model (step 0, the curves'
    starting point), every eval_every_n_steps, and the last."""
    h = spec.hyperparameters
    return step % h.eval_every_n_steps == 0 or step == h.steps


def build_evaluator(
    job: ValidatedJob, gateway: Any, plugins: Plugins, caller: Caller, job_id: str
) -> Evaluator:
    """An evaluator of ``job``'s validation rows through ``gateway`` (a ``PolicyGateway``)."""
    from plugtune.gateway import JobSampling
    from plugtune.gateway.sampling import SamplingView

    if job.validation_path is None:
        raise InvalidValueError(
            [Problem(str(job.job_file), "no validation rows to evaluate", field="data.validation")]
        )
    settings = eval_settings(job.spec)
    greedy = JobSampling(0.0, 1.0, settings.max_new_tokens, purpose="greedy evaluation (eval/pass@1)")
    sampled = JobSampling(
        settings.temperature,
        settings.top_p,
        settings.max_new_tokens,
        purpose="sampled evaluation (eval/pass@k)",
    )
    return Evaluator(
        SamplingView(gateway, greedy),
        SamplingView(gateway, sampled),
        plugins,
        read_dataset(job.validation_path),
        settings,
        caller=caller,
        job_id=job_id,
        rows_at_once=job.spec.hyperparameters.batch_size,
    )


@dataclass(frozen=True)
class ModelEval:
    """What ``plugtune eval`` measured: the model, the rows it was evaluated on and the result."""

    model: Path
    rows_file: Path
    settings: EvalSettings
    result: EvalResult


async def evaluate_model(model: str, job: ValidatedJob, settings: Settings) -> ModelEval:
    """Evaluate the model (or checkpoint) folder ``model`` on ``job``'s validation rows.

    The plugins run in the job's runtime backend as in a job; nothing is written to the store.
    """
    from plugtune.gateway import JobSampling, PolicyGateway
    from plugtune.jobs.caller import PolicyCaller
    from plugtune.jobs.plugins import as_plugins, deploy_all
    from plugtune.runtime import Quota, runtime_for
    from plugtune.trainer.model import load_model

    if job.validation_path is None:
        raise InvalidValueError(
            [
                Problem(
                    str(job.job_file),
                    "`plugtune eval` evaluates the job's held-out rows: add data.validation (a .jsonl "
                    "file like data.train) to job.yaml",
                    field="data.validation",
                )
            ]
        )
    where = resolve_model(model, Path.cwd()) if model.startswith(BUILTIN_MODEL_PREFIX) else Path(model)
    loaded = load_model(where, field="CHECKPOINT_OR_MODEL", file="plugtune eval")
    h = job.spec.hyperparameters
    quota = Quota(
        max_functions=settings.max_functions,
        max_instances=settings.max_instances,
        total_memory_mb=settings.total_memory_mb,
    )
    backend = job.spec.plugins.runtime_backend
    async with runtime_for(backend, settings.ray_address, quota, settings.home / "runtime") as rt:
        functions = await deploy_all(rt, job)
        sampling = JobSampling(h.temperature, h.top_p, h.max_new_tokens)
        with PolicyGateway(loaded.model, loaded.tokenizer, sampling=sampling) as gateway:
            evaluator = build_evaluator(
                job, gateway, as_plugins(functions, job), PolicyCaller(job.spec.failure_policy), ""
            )
            result = await evaluator.run(step=0, policy_version=0)
    return ModelEval(where.resolve(), job.validation_path, evaluator.settings, result)
