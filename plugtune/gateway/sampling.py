"""What a request samples with: the job's settings, which a rollout may omit but not contradict.

The trainer scores every sampled token at the job's ``temperature`` and trusts the log-prob the
gateway recorded for it, so a reply drawn at another temperature or nucleus trains off-policy
without any error. A gateway given the job's settings (``JobSampling``) fills in what a request
omits and answers a request that contradicts them with a 400 naming the field, both values and
what to do. A smaller ``max_tokens`` than the job's is allowed (a shorter turn is still on-policy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from plugtune.gateway.engine import SamplingParams
from plugtune.gateway.protocol import ApiError, ChatCompletionRequest

#: Most alternatives ``top_logprobs`` may ask for per token (OpenAI's limit).
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class JobSampling:
    """The job's ``hyperparameters`` that every reply is sampled with.

    ``purpose`` names settings that are not the training ones (e.g. ``"greedy evaluation
    (eval/pass@1)"``): a request that contradicts them is told so rather than about off-policy
    training. A temperature of 0 decodes greedily.
    """

    temperature: float
    top_p: float
    max_new_tokens: int
    purpose: str = ""


@dataclass(frozen=True)
class SamplingView:
    """A policy server whose trajectories are sampled with other settings than the gateway's own.

    ``gateway`` is a ``PolicyGateway`` (its ``open`` takes ``sampling=``); weights, versions and
    records are the gateway's. The jobs layer evaluates through such views (greedy, sampled)
    while training requests keep the job's settings.
    """

    gateway: Any
    sampling: JobSampling

    @property
    def weights_lock(self) -> Any:
        return self.gateway.weights_lock

    def open(self, trajectory_id: str) -> Any:
        return self.gateway.open(trajectory_id, sampling=self.sampling)

    def take(self, trajectory_id: str) -> Any:
        return self.gateway.take(trajectory_id)

    def set_policy_version(self, version: int) -> None:
        self.gateway.set_policy_version(version)


def sampling_params(request: ChatCompletionRequest, job: JobSampling | None, room: int) -> SamplingParams:
    """The request's sampling under the job's settings (any settings when ``job`` is None).

    ``room`` is how many tokens the context leaves after the prompt. Raises ApiError (400) for a
    request the gateway cannot honour.
    """
    _refuse_unsupported(request)
    temperature, top_p = request.temperature, request.top_p
    max_field = "max_completion_tokens" if request.max_completion_tokens is not None else "max_tokens"
    wanted = request.max_completion_tokens or request.max_tokens
    if job is not None:
        temperature = _same(request.temperature, job.temperature, "temperature", job.purpose)
        top_p = _same(request.top_p, job.top_p, "top_p", job.purpose)
        if wanted is not None and wanted > job.max_new_tokens:
            raise ApiError(
                400,
                f"{max_field}={wanted} is above the job's hyperparameters.max_new_tokens="
                f"{job.max_new_tokens}: a policy reply has at most that many tokens. Omit {max_field} "
                "(the gateway applies the job's), ask for fewer, or raise max_new_tokens in job.yaml.",
                param=max_field,
                code="sampling_conflict",
            )
        wanted = wanted or job.max_new_tokens
    return SamplingParams(
        max_tokens=min(wanted or room, room),
        temperature=1.0 if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p,
        stop=request.stop_list(),
        seed=request.seed,
        top_logprobs=request.top_logprobs or 0,
    )


def _same(asked: float | None, job: float, field: str, purpose: str) -> float:
    if asked is None or math.isclose(asked, job, rel_tol=1e-6, abs_tol=1e-9):
        return job
    if purpose:
        raise ApiError(
            400,
            f"{field}={asked:g} conflicts with {purpose}, which samples with {field}={job:g}. Omit "
            f"{field} (the gateway applies it) or pass sample.sampling.{field}, which carries it.",
            param=field,
            code="sampling_conflict",
        )
    raise ApiError(
        400,
        f"{field}={asked:g} conflicts with the job's hyperparameters.{field}={job:g}: the "
        f"trainer scores every sampled token at the job's settings, so a reply sampled with another "
        f"{field} trains off-policy. Omit {field} (the gateway applies the job's), pass "
        f"sample.sampling.{field}, or change {field} in job.yaml.",
        param=field,
        code="sampling_conflict",
    )


def _refuse_unsupported(request: ChatCompletionRequest) -> None:
    """Requests the gateway would otherwise answer differently from what they ask."""
    if request.n is not None and request.n > 1:
        raise ApiError(
            400,
            f"n={request.n}: a rollout gets one completion per call. For several completions of one "
            "prompt set hyperparameters.group_size in job.yaml: the trainer runs the rollout "
            "group_size times per prompt and compares their rewards.",
            param="n",
        )
    if request.top_logprobs and not request.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(request, name)
        if value:
            raise ApiError(
                400,
                f"{name}={value:g}: the policy gateway samples from the policy's own distribution "
                f"(the trainer's log-probs assume it); leave {name} unset or 0.",
                param=name,
            )
    if request.logit_bias:
        raise ApiError(
            400,
            "logit_bias: the policy gateway samples from the policy's own distribution (the "
            "trainer's log-probs assume it); leave logit_bias unset.",
            param="logit_bias",
        )
