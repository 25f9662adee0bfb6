"""One chat completion: extend the trajectory's record, generate, parse tool calls, answer."""

from __future__ import annotations

import asyncio
import functools
import json
from dataclasses import dataclass
from typing import Any

from plugtune.gateway.chat import ChatRenderer, text_of
from plugtune.gateway.engine import Generation, GenerationEngine
from plugtune.gateway.protocol import ApiError, ChatCompletionRequest, chat_completion
from plugtune.gateway.sampling import JobSampling, sampling_params
from plugtune.gateway.toolcalls import ParsedReply, parse_reply
from plugtune.gateway.trace import TraceBuilder

#: Above this many characters per token of context a request's tokens are counted before rendering.
COUNT_ABOVE_CHARS_PER_TOKEN = 4
COUNT_CHUNK_CHARS = 64 << 10
CUT_SLACK = 8


@dataclass
class CompletionService:
    """What a completion needs: the template, the engine, the context size and the job's sampling
    settings (None: each request samples as it asks); a trajectory opened with its own settings
    (``TraceBuilder.sampling``, e.g. greedy evaluation) samples with those."""

    renderer: ChatRenderer
    engine: GenerationEngine
    model_name: str
    max_context: int
    sampling: JobSampling | None = None

    async def complete(
        self, builder: TraceBuilder, request: ChatCompletionRequest, version: int
    ) -> dict[str, Any]:
        if request.model != self.model_name:
            raise ApiError(
                404,
                f"The model `{request.model}` does not exist; this gateway serves `{self.model_name}`.",
                param="model",
                code="model_not_found",
            )
        sampling = builder.sampling or self.sampling
        sampling_params(request, sampling, self.max_context)  # refused before the record changes
        messages = [m.model_dump(exclude_none=True) for m in request.messages]
        self._refuse_overlong(messages, request.tools)
        prompt_ids = self._prepare(builder, messages, request.tools, version)
        params = sampling_params(request, sampling, self.max_context - len(prompt_ids))
        generation = await asyncio.wrap_future(self.engine.submit(prompt_ids, params))
        text = self._text(generation)
        parsed = (
            parse_reply(text)
            if request.wants_tool_calls() and generation.finish_reason == "stop"
            else ParsedReply(text, [])
        )
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content, "refusal": None}
        finish_reason = generation.finish_reason
        if parsed.tool_calls:
            message["tool_calls"] = [call.to_openai() for call in parsed.tool_calls]
            finish_reason = "tool_calls"
        with builder.lock:
            builder.record_reply(generation, {k: v for k, v in message.items() if v is not None})
            builder.finish_reason = finish_reason
        return chat_completion(
            self.model_name,
            message,
            finish_reason,
            prompt_tokens=len(prompt_ids),
            completion_tokens=len(generation.token_ids),
            logprobs=self._logprobs(generation) if request.logprobs else None,
            policy_version=generation.policy_version,
        )

    def _prepare(
        self,
        builder: TraceBuilder,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        version: int,
    ) -> list[int]:
        """Plan the record's change, refuse prompts that leave no room to answer, apply it."""
        try:
            plan = builder.plan(self.renderer, messages, tools)
        except ValueError as exc:
            raise ApiError(400, str(exc), param="messages") from exc
        if plan.length >= self.max_context:
            raise ApiError(
                400,
                f"This model's maximum context length is {self.max_context} tokens. However, your "
                f"messages resulted in {plan.length} tokens. Please reduce the length of the messages.",
                param="messages",
                code="context_length_exceeded",
            )
        with builder.lock:
            return builder.apply(plan, messages, tools, version)

    def _refuse_overlong(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> None:
        """Messages and tools too long for the context whatever they tokenize to: refused before
        rendering and tokenizing the whole (10 MB of text or a 9 MB tools list takes the template and
        the tokenizer most of a minute and gigabytes, on the gateway's one thread)."""
        texts = [text for m in messages for text in _message_texts(m)]
        tools_text = json.dumps(tools, ensure_ascii=False, default=str) if tools else ""
        chars, tools_chars = sum(len(t) for t in texts), len(tools_text)
        param = "tools" if tools_chars > chars else "messages"
        # A token covers at most the longest vocabulary entry's characters (a few more through
        # Unicode normalization: hence the margin), so fewer tokens than this cannot hold them.
        most_chars = self.max_context * 4 * self._longest_token_chars
        if chars + tools_chars >= most_chars:
            raise _overlong(
                self.max_context,
                f"messages hold {chars} characters and your tools {tools_chars}, more than "
                f"{self.max_context} tokens can hold ({most_chars} characters at most for this tokenizer)",
                param,
            )
        if chars + tools_chars > COUNT_ABOVE_CHARS_PER_TOKEN * self.max_context:
            # Long enough to be costly: count tokens piece by piece, only until past the context.
            fewest = self._fewest_tokens([*texts, tools_text])
            if fewest >= self.max_context:
                raise _overlong(
                    self.max_context,
                    f"messages and tools hold at least {fewest} tokens (counted before rendering)",
                    param,
                )

    def _fewest_tokens(self, texts: list[str]) -> int:
        """Tokens ``texts`` hold at least, counted in chunks (a cut token counts as at most
        ``CUT_SLACK`` extra), stopping once past the context."""
        tokenizer, total = self.renderer.tokenizer, 0
        for text in texts:
            for at in range(0, len(text), COUNT_CHUNK_CHARS):
                piece = text[at : at + COUNT_CHUNK_CHARS]
                total += max(0, len(tokenizer(piece, add_special_tokens=False)["input_ids"]) - CUT_SLACK)
                if total >= self.max_context:
                    return total
        return total

    @functools.cached_property
    def _longest_token_chars(self) -> int:
        vocab = self.renderer.tokenizer.get_vocab()
        return max((len(piece) for piece in vocab), default=1) or 1

    def _text(self, generation: Generation) -> str:
        ids = generation.token_ids[:-1] if generation.ended_with_eos else generation.token_ids
        text = self.renderer.decode(ids)
        return text[: generation.stop_text_at] if generation.stop_text_at is not None else text

    def _logprobs(self, generation: Generation) -> list[dict[str, Any]]:
        tops = generation.top_logprobs or [[] for _ in generation.token_ids]
        out = []
        for token_id, logprob, top in zip(generation.token_ids, generation.logprobs, tops, strict=True):
            entry = self._token_logprob(token_id, logprob)
            entry["top_logprobs"] = [self._token_logprob(i, lp) for i, lp in top]
            out.append(entry)
        return out

    def _token_logprob(self, token_id: int, logprob: float) -> dict[str, Any]:
        token = self.renderer.decode([token_id])
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}


def _message_texts(message: dict[str, Any]) -> list[str]:
    """The texts of a message the chat template renders: its content, name and tool calls."""
    texts = [text_of(message.get("content")), str(message.get("name") or "")]
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = function.get("arguments", "")
        texts.append(str(function.get("name", "")))
        texts.append(arguments if isinstance(arguments, str) else json.dumps(arguments, default=str))
    return texts


def _overlong(max_context: int, found: str, param: str) -> ApiError:
    return ApiError(
        400,
        f"This model's maximum context length is {max_context} tokens. However, your {found}. "
        "Please reduce the length of the messages or tools.",
        param=param,
        code="context_length_exceeded",
    )
