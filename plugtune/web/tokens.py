"""A trajectory's response as tokens: the console's Tokens view and its API (issue 27, item 4).

Each response token's text (decoded one token at a time by the job's own tokenizer), whether the
policy sampled it or a tool / the chat template put it there (the loss mask), its log-prob from the
sampler (the gateway) and from the trainer (the weights it trained, before the step) and their gap,
the spans history rewrites cut from the record, and where a reply was cut at its token limit.

``GET /api/jobs/{id}/trajectories/{trajectory_id}/tokens``; the page's view is ``static/tokens.js``.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from plugtune.spec.models import resolve_model
from plugtune.store import Store
from plugtune.store.records import DamagedRecordError, Job
from plugtune.types import TrajectoryRecord
from plugtune.web import service
from plugtune.web.params import JobId, RecordId

log = logging.getLogger(__name__)
router = APIRouter()

#: Where the colour scale of |trainer - sampler| changes step (nats): below the first, numerical
#: noise (plugtune's float32 noise is 1e-3, bfloat16's 2e-2); the view's classes gap-0 .. gap-5.
GAP_SCALE = (1e-3, 2e-2, 0.1, 0.5, 1.0)
LARGEST = 20  # tokens the view lists by gap, largest first


class TokenGapOut(BaseModel):
    index: int = Field(description="the token's position in the response")
    text: str
    sampler: float
    trainer: float
    gap: float = Field(description="|trainer - sampler|")


class DroppedSpanOut(BaseModel):
    at: int = Field(description="the response position the cut tokens stood at")
    tokens: int
    policy_tokens: int = Field(description="of them, sampled by the policy: they never reached training")
    rewrite: int = Field(description="which history rewrite of the trajectory cut them (1, 2, ...)")


class TokenViewOut(BaseModel):
    """One trajectory's response, token by token (lists are per response token, in order)."""

    trajectory_id: str
    count: int = Field(description="response tokens")
    ids: list[int]
    texts: list[str] = Field(description="each token decoded alone by the job's tokenizer (untrusted text)")
    tokenizer: str = Field(description="where the texts come from, or why they are only ids")
    mask: list[int] = Field(description="1 = sampled by the policy (trained on), 0 = tool / template")
    sampler_logprobs: list[float | None] = Field(description="the gateway's log-prob; null off the mask")
    trainer_logprobs: list[float | None] | None = Field(
        description="the trainer's log-prob at the weights it trained; null off the mask; null "
        "throughout when no trainer scored it (not trained, or recorded before plugtune kept them)"
    )
    gaps: list[float | None] = Field(description="|trainer - sampler| per policy token")
    mean_gap: float | None = Field(description="the mean gap over policy tokens (as logprob_gap)")
    largest_gaps: list[TokenGapOut] = Field(description=f"the {LARGEST} largest gaps, largest first")
    gap_scale: list[float] = Field(description="the colour scale's steps (nats)")
    policy_tokens: int
    environment_tokens: int
    dropped_spans: list[DroppedSpanOut] = Field(description="tokens history rewrites cut from the record")
    stop_reason: str
    truncated_at: int | None = Field(
        description="where the last reply was cut at its token limit (after the last token), or null"
    )
    max_new_tokens: int | None = Field(description="the job's hyperparameters.max_new_tokens")


def _store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


@router.get(
    "/api/jobs/{job_id}/trajectories/{trajectory_id}/tokens", response_model=TokenViewOut, tags=["api"]
)
def tokens_api(request: Request, job_id: JobId, trajectory_id: RecordId) -> TokenViewOut:
    """The trajectory's response as tokens: text, loss mask, sampler and trainer log-probs and
    their gap, the largest gaps, spans history rewrites cut, and the truncation point."""
    store = _store(request)
    job = service.require_job(store, job_id)
    record = store.get_trajectory(job_id, trajectory_id)
    if record is None:
        raise service.Missing(f"job {job_id} has no trajectory {trajectory_id!r}")
    return token_view(record, job)


def inconsistency(record: TrajectoryRecord) -> str | None:
    """What makes a stored record's per-token lists disagree (None when they agree): one mask value
    per response token, and the sampler's and the trainer's log-probs one per token or none."""
    count = len(record.response_ids)
    found = []
    if len(record.response_mask) != count:
        found.append(f"{len(record.response_mask)} loss-mask values")
    for what, values in (("sampler", record.response_logprobs), ("trainer", record.trainer_logprobs)):
        if values and len(values) != count:
            found.append(f"{len(values)} {what} log-probs")
    for span in record.dropped_spans:
        if not (0 <= span.at <= count and 0 <= span.policy_tokens <= span.tokens and span.rewrite >= 1):
            found.append(
                f"a cut span at {span.at} of {span.tokens} tokens ({span.policy_tokens} policy-sampled, "
                f"rewrite {span.rewrite})"
            )
            break
    if not found:
        return None
    return (
        f"trajectory {record.trajectory_id!r} cannot be shown as tokens: its stored record has "
        f"{count} response tokens but {', '.join(found)}; the record was damaged or written by "
        "something other than plugtune"
    )


def token_view(record: TrajectoryRecord, job: Job) -> TokenViewOut:
    problem = inconsistency(record)
    if problem is not None:
        raise DamagedRecordError(problem)
    ids, mask = list(record.response_ids), [1 if m else 0 for m in record.response_mask]
    texts, said = decode_each(job, ids)
    sampler = [_finite(v) if m else None for v, m in zip(record.response_logprobs, mask, strict=False)]
    sampler += [None] * (len(ids) - len(sampler))
    scored = len(record.trainer_logprobs) == len(ids) and bool(ids)
    trainer = [_finite(v) if m else None for v, m in zip(record.trainer_logprobs, mask, strict=False)]
    gaps = [
        abs(t - s) if s is not None and t is not None else None
        for s, t in zip(sampler, trainer, strict=False)
    ]
    gaps += [None] * (len(ids) - len(gaps))
    found = [(g, i) for i, g in enumerate(gaps) if g is not None]
    largest = sorted(found, key=lambda x: (-x[0], x[1]))[:LARGEST]
    max_new = (job.spec.get("hyperparameters") or {}).get("max_new_tokens")
    return TokenViewOut(
        trajectory_id=record.trajectory_id,
        count=len(ids),
        ids=ids,
        texts=texts,
        tokenizer=said,
        mask=mask,
        sampler_logprobs=sampler,
        trainer_logprobs=(trainer if scored else None),
        gaps=gaps,
        mean_gap=sum(g for g, _ in found) / len(found) if found else None,
        largest_gaps=[
            TokenGapOut(index=i, text=texts[i], sampler=sampler[i] or 0.0, trainer=trainer[i] or 0.0, gap=g)
            for g, i in largest
        ],
        gap_scale=list(GAP_SCALE),
        policy_tokens=sum(mask),
        environment_tokens=len(mask) - sum(mask),
        dropped_spans=[DroppedSpanOut(**vars(d)) for d in record.dropped_spans],
        stop_reason=record.stop_reason,
        truncated_at=len(ids) if record.stop_reason == "length" else None,
        max_new_tokens=max_new if isinstance(max_new, int) else None,
    )


def decode_each(job: Job, ids: Sequence[int]) -> tuple[list[str], str]:
    """Each token's text by the job's tokenizer, and what it was; ids in brackets when there is none."""
    where = model_dir(job)
    if where is None:
        return [f"[{i}]" for i in ids], "token ids only: the job names no model folder"
    try:
        texts = _tokenizer(str(where)).batch_decode([[i] for i in ids], clean_up_tokenization_spaces=False)
    except (OSError, ValueError, KeyError, ImportError, TypeError, OverflowError, IndexError) as exc:
        log.info("no token texts for the token view from %s: %s", where, exc)
        why = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        return [f"[{i}]" for i in ids], f"token ids only: the tokenizer in {where} failed ({why})"
    return [str(t) for t in texts], f"decoded one token at a time by the tokenizer in {where}"


def model_dir(job: Job) -> Path | None:
    spec = job.spec
    model, job_file = spec.get("model"), spec.get("job_file")
    if not isinstance(model, str) or not model:
        return None
    base = spec.get("base_dir") or (str(Path(job_file).parent) if isinstance(job_file, str) else ".")
    try:
        return resolve_model(model, Path(base))
    except ValueError:
        return None


@functools.lru_cache(maxsize=4)
def _tokenizer(where: str) -> Any:
    """The tokenizer in ``where``, loaded once per folder (a failure is not kept: it is tried again)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(where, local_files_only=True)


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None
