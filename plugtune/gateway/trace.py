"""One trajectory's token record, kept across its calls to the gateway (never re-tokenized).

Each call either extends the record — its messages are the recorded ones plus new tool / user
messages, so only the new template tokens are encoded and appended with mask 0, and the policy
continues from the exact tokens it produced — or rewrites history: then the record keeps the
longest token prefix it shares with the freshly rendered prompt, appends the rest as a new
environment segment, and counts a rewrite and the policy tokens it cut from the record (they
never reach the trainer).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass, field, replace
from typing import Any

from plugtune.gateway.chat import ChatRenderer, is_extension, normalize_message
from plugtune.gateway.engine import Generation
from plugtune.gateway.sampling import JobSampling
from plugtune.types import DroppedSpan, TokenSegment, TokenTrace

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CallPlan:
    """How a call changes the record before generating: keep a prefix, then append tokens."""

    keep: int  # tokens of the record (prompt + response) kept
    new_prompt: list[int] | None  # replaces the prompt (and empties the response) when set
    environment_ids: list[int]  # appended to the response with mask 0
    is_rewrite: bool

    @property
    def length(self) -> int:
        return len(self.new_prompt) if self.new_prompt is not None else self.keep + len(self.environment_ids)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@dataclass
class TraceBuilder:
    """The mutable record behind a ``TokenTrace``; calls of one trajectory are serialised."""

    trajectory_id: str
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    segments: list[TokenSegment] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)  # OpenAI format, as sent and answered
    tools: list[dict[str, Any]] | None = None
    rewrites: int = 0
    dropped_policy_tokens: int = 0
    dropped_spans: list[DroppedSpan] = field(default_factory=list)
    finish_reason: str = ""
    ended_with_eos: bool = False
    has_reply: bool = False  # the record ends with a policy reply (the last call did not fail)
    sampling: JobSampling | None = None  # this trajectory's own settings (None: the gateway's)
    lock: threading.Lock = field(default_factory=threading.Lock)
    call_lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one HTTP call at a time

    def full_ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def plan(
        self, renderer: ChatRenderer, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> CallPlan:
        """What this call's messages do to the record (nothing is changed yet)."""
        current = [normalize_message(m) for m in messages]
        text = renderer.render(current, tools, add_generation_prompt=True)
        if not self.prompt_ids:
            return CallPlan(0, renderer.encode(text), [], is_rewrite=False)
        recorded = [normalize_message(m) for m in self.messages]
        if self.has_reply and (tools or None) == (self.tools or None) and is_extension(recorded, current):
            previous = renderer.render(recorded, tools, add_generation_prompt=False)
            if text.startswith(previous):
                suffix = renderer.bridge(previous, self.ended_with_eos) + text[len(previous) :]
                return CallPlan(len(self.full_ids()), None, renderer.encode(suffix), is_rewrite=False)
        fresh = renderer.encode(text)
        keep = common_prefix(fresh, self.full_ids())
        if keep == len(self.full_ids()):  # the tokens still extend the record (e.g. a retried call)
            return CallPlan(keep, None, fresh[keep:], is_rewrite=False)
        if keep < len(self.prompt_ids):
            return CallPlan(0, fresh, [], is_rewrite=True)
        return CallPlan(keep, None, fresh[keep:], is_rewrite=True)

    def apply(
        self, plan: CallPlan, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, version: int
    ) -> list[int]:
        """Change the record as planned; returns the token ids the policy continues from."""
        span: DroppedSpan | None = None
        if plan.is_rewrite:
            self.rewrites += 1
            cut = 0 if plan.new_prompt is not None else plan.keep - len(self.prompt_ids)
            dropped = sum(self.response_mask[cut:])
            self.dropped_policy_tokens += dropped
            if len(self.response_ids) > cut:
                span = DroppedSpan(cut, len(self.response_ids) - cut, dropped, self.rewrites)
            logger.warning(
                "trajectory %s rewrote its history (rewrite %d): the record starts a new segment "
                "after %d shared tokens; %d policy tokens of the old history are dropped",
                self.trajectory_id,
                self.rewrites,
                0 if plan.new_prompt is not None else plan.keep,
                dropped,
            )
        if plan.new_prompt is not None:
            self.prompt_ids = list(plan.new_prompt)
            self._truncate_response(0)
        else:
            self._truncate_response(plan.keep - len(self.prompt_ids))
            self._append(plan.environment_ids, [0.0] * len(plan.environment_ids), "environment", version)
        if span is not None:  # after the truncation, which moves the older spans back to ``cut``
            self.dropped_spans.append(span)
        self.messages = list(messages)
        self.tools = tools
        self.has_reply = False
        return self.full_ids()

    def record_reply(self, generation: Generation, reply: dict[str, Any]) -> None:
        """Append the sampled tokens (mask 1) and the reply message."""
        self._append(generation.token_ids, generation.logprobs, "policy", generation.policy_version)
        self.messages = [*self.messages, reply]
        self.finish_reason = generation.finish_reason
        self.ended_with_eos = generation.ended_with_eos
        self.has_reply = True

    def snapshot(self) -> TokenTrace:
        return TokenTrace(
            prompt_ids=list(self.prompt_ids),
            response_ids=list(self.response_ids),
            response_mask=list(self.response_mask),
            response_logprobs=list(self.response_logprobs),
            messages=list(self.messages),
            segments=list(self.segments),
            rewrites=self.rewrites,
            dropped_policy_tokens=self.dropped_policy_tokens,
            finish_reason=self.finish_reason,
            dropped_spans=list(self.dropped_spans),
        )

    def _append(self, ids: list[int], logprobs: list[float], source: str, version: int) -> None:
        if not ids:
            return
        start = len(self.response_ids)
        self.response_ids.extend(ids)
        self.response_mask.extend([1 if source == "policy" else 0] * len(ids))
        self.response_logprobs.extend(logprobs if source == "policy" else [0.0] * len(ids))
        self.segments.append(TokenSegment(start, len(self.response_ids), source, version))

    def _truncate_response(self, n: int) -> None:
        del self.response_ids[n:], self.response_mask[n:], self.response_logprobs[n:]
        self.segments = [
            TokenSegment(s.start, min(s.end, n), s.source, s.policy_version)
            for s in self.segments
            if s.start < n
        ]
        self.dropped_spans = [replace(d, at=min(d.at, n)) for d in self.dropped_spans]
