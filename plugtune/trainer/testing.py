"""In-process fakes for tests and local runs: plugins called directly, a policy that samples in process.

``InProcessFunction`` calls a decorated Python function and returns a CallOutcome (exceptions
become PluginCallError(500), ``Retry`` / ``Discard`` become statuses). ``InProcessPolicyServer``
samples with ``model.generate`` and records a TokenTrace; its ``Policy`` answers ``chat`` /
``achat`` without HTTP. ``tiny_model_dir`` writes a random tiny chat model.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import threading
import time
import traceback
import zlib
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from plugtune.errors import Cause, PluginCallError
from plugtune.sdk import (
    Context,
    Discard,
    GraderResult,
    Kind,
    PluginSpec,
    Policy,
    Retry,
    RolloutResult,
    spec_of,
)
from plugtune.types import CallOutcome, TokenSegment, TokenTrace


class InProcessFunction:
    """A plugin run in this process: the function is called directly (sync ones in a thread)."""

    def __init__(self, fn: Callable[..., Any], concurrency: int | None = None) -> None:
        spec = spec_of(fn)
        if spec is None:
            raise TypeError(
                f"{getattr(fn, '__name__', fn)!r} is not decorated with @rollout/@grader/@group_grader"
            )
        self.fn = fn
        self._spec = spec
        self.calls = 0
        # by default as many sync calls at once as the runtime would run: every instance at max_concurrency
        workers = concurrency or spec.runtime.max_concurrency * spec.runtime.max_instances
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"plugin-{spec.name}")

    @property
    def spec(self) -> PluginSpec:
        return self._spec

    async def invoke(self, ctx: Context, *args: Any) -> CallOutcome:
        self.calls += 1
        started = time.perf_counter()
        ctx = dataclasses.replace(ctx, plugin=self.spec.name, metrics={})
        try:
            if inspect.iscoroutinefunction(self.fn):
                value = await self.fn(ctx, *args)
            else:
                call = functools.partial(self.fn, ctx, *args)
                value = await asyncio.get_running_loop().run_in_executor(self._pool, call)
        except Retry as exc:
            return CallOutcome(status="retry", value=None, reason=exc.reason, metrics=ctx.metrics)
        except Discard as exc:
            return CallOutcome(status="discard", value=None, reason=exc.reason, metrics=ctx.metrics)
        except Exception as exc:
            raise PluginCallError(
                Cause.ERROR_500,
                f"{type(exc).__name__}: {exc}",
                plugin=self.spec.name,
                trajectory_id=ctx.trajectory_id,
                traceback=traceback.format_exc(),
            ) from exc
        status, value, reason = self._normalise(value)
        latency = (time.perf_counter() - started) * 1000
        return CallOutcome(status=status, value=value, reason=reason, metrics=ctx.metrics, latency_ms=latency)

    def _normalise(self, value: Any) -> tuple[str, Any, str]:
        if isinstance(value, GraderResult):
            return value.status.value, value.reward, value.reason
        if isinstance(value, RolloutResult):
            fields = dataclasses.asdict(value)
            return value.status.value, fields, value.reason
        if self.spec.kind is Kind.ROLLOUT and value is not None:
            raise TypeError(f"rollout {self.spec.name} returned {type(value).__name__}, not RolloutResult")
        return "success", value, ""


@dataclass
class _Record:
    prompt_ids: list[int]
    response_ids: list[int]
    mask: list[int]
    logprobs: list[float]
    messages: list[dict[str, Any]]
    segments: list[TokenSegment]
    finish_reason: str = ""


@dataclass(frozen=True)
class InProcessPolicy(Policy):
    """A Policy whose ``chat`` / ``achat`` call an InProcessPolicyServer directly (no HTTP)."""

    server: Any = None

    def chat(self, messages: list[dict[str, Any]], **params: Any) -> dict[str, Any]:
        return dict(self.server.chat(self.api_key, messages, **params))

    async def achat(self, messages: list[dict[str, Any]], **params: Any) -> dict[str, Any]:
        return await asyncio.to_thread(self.chat, messages, **params)  # generate blocks


#: ``generate`` samples from torch's process-wide generator: two servers (say, a trainer's next
#: step started ahead beside another trainer's) must not reseed it under each other.
_GLOBAL_RNG = threading.Lock()


class InProcessPolicyServer:
    """Samples from ``model`` with ``generate`` (one request at a time) and records token traces.

    Log-probs are those of the sampling distribution at the request's temperature (before
    top-p), as the trainer recomputes them. A multi-turn call must extend the recorded
    conversation; the new prompt tokens are appended with mask 0.
    """

    def __init__(self, model: Any, tokenizer: Any, seed: int = 0) -> None:
        self.model, self.tokenizer, self.seed = model, tokenizer, seed
        self._calls: dict[str, int] = {}
        self.weights_lock = threading.RLock()
        self.version = 0
        self._records: dict[str, _Record] = {}
        self._open: set[str] = set()

    def open(self, trajectory_id: str) -> Policy:
        self._open.add(trajectory_id)
        self._records.pop(trajectory_id, None)  # opening again starts the record over
        return InProcessPolicy(base_url="inprocess://policy", api_key=trajectory_id, server=self)

    def take(self, trajectory_id: str) -> TokenTrace:
        self._open.discard(trajectory_id)
        self._calls.pop(trajectory_id, None)
        r = self._records.pop(trajectory_id)
        return TokenTrace(
            prompt_ids=r.prompt_ids,
            response_ids=r.response_ids,
            response_mask=r.mask,
            response_logprobs=r.logprobs,
            messages=r.messages,
            segments=r.segments,
            finish_reason=r.finish_reason,
        )

    def set_policy_version(self, version: int) -> None:
        self.version = version

    def chat(
        self,
        key: str,
        messages: list[dict[str, Any]],
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_tokens: int = 64,
        **_: Any,
    ) -> dict[str, Any]:
        if key not in self._open:
            raise KeyError(f"unknown trajectory key {key!r}")
        prompt = chat_prompt_ids(self.tokenizer, messages)
        self._calls[key] = self._calls.get(key, 0) + 1
        call_seed = zlib.crc32(f"{self.seed}:{key}:{self._calls[key]}".encode())
        # a seed per trajectory and call: samples do not depend on the order threads get here
        with self.weights_lock, _GLOBAL_RNG, torch.no_grad(), torch.random.fork_rng():
            torch.manual_seed(call_seed)
            out = self.model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                do_sample=True,
                temperature=temperature,
                top_p=top_p,
                top_k=0,
                max_new_tokens=max_tokens,
                output_logits=True,
                return_dict_in_generate=True,
                pad_token_id=self.tokenizer.pad_token_id,
                eos_token_id=self.tokenizer.eos_token_id,
            )
        new_ids = out.sequences[0, len(prompt) :].tolist()
        logits = torch.stack(out.logits, dim=1)[0].float() / temperature
        logprobs = torch.log_softmax(logits, -1).gather(-1, torch.tensor(new_ids).unsqueeze(-1)).squeeze(-1)
        eos = self.tokenizer.eos_token_id
        finish = "stop" if new_ids and new_ids[-1] == eos else "length"
        text = self.tokenizer.decode([t for t in new_ids if t != eos], skip_special_tokens=True)
        self._append(
            key, prompt, new_ids, logprobs.tolist(), [*messages, {"role": "assistant", "content": text}]
        )
        self._records[key].finish_reason = finish
        return {
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
            ],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(new_ids)},
        }

    def _append(
        self,
        key: str,
        prompt: list[int],
        new_ids: list[int],
        logprobs: list[float],
        messages: list[dict[str, Any]],
    ) -> None:
        r = self._records.get(key)
        if r is None:
            r = self._records[key] = _Record(prompt, [], [], [], [], [])
        else:
            seen = r.prompt_ids + r.response_ids
            if prompt[: len(seen)] != seen:
                raise ValueError("the in-process policy only records conversations that extend the last call")
            extra = prompt[len(seen) :]
            r.response_ids += extra
            r.mask += [0] * len(extra)
            r.logprobs += [0.0] * len(extra)
        start = len(r.response_ids)
        r.response_ids += new_ids
        r.mask += [1] * len(new_ids)
        r.logprobs += logprobs
        r.messages = messages
        r.segments.append(TokenSegment(start, len(r.response_ids), "policy", self.version))


def chat_prompt_ids(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    """Token ids of ``messages`` under the tokenizer's chat template, ready for the assistant turn."""
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = encoded["input_ids"] if isinstance(encoded, Mapping) else encoded
    return [int(t) for t in ids]


CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_model_dir(path: Path, seed: int = 0, hidden_size: int = 32, layers: int = 2) -> Path:
    """Write a random tiny Llama chat model with a character-level tokenizer to ``path``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|endoftext|>"))
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(specials)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token="<|endoftext|>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        pad_token_id=0,
        eos_token_id=vocab["<|im_end|>"],
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path
