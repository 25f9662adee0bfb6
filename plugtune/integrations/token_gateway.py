"""``TokenGateway``: the policy gateway in front of an engine's token-in/token-out generation.

A rollout plugin calls the policy over OpenAI-compatible HTTP; an engine (verl's
``server_manager.generate``, a vLLM client, ...) takes prompt token ids and returns sampled token
ids and their log-probs. This gateway joins the two with the policy gateway's own pieces (chat
template, per-trajectory token record, tool-call parsing, HTTP surface), so a trajectory's record
holds exactly the tokens the engine sampled and the template tokens between them, never
re-tokenized text.

    gw = TokenGateway(tokenizer, generate, loop)   # generate(prompt_ids, params) -> TokenReply
    gw.start()
    policy = gw.open(trajectory_id)                # sdk Policy for the rollout
    trace = gw.take(trajectory_id)                 # TokenTrace
    gw.stop()

``generate`` is a coroutine function run on ``loop`` (the engine's own event loop: its clients
and locks belong to it). Nothing here imports an engine.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import logging
import secrets
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

from plugtune.gateway.app import build_app
from plugtune.gateway.chat import ChatRenderer
from plugtune.gateway.completions import CompletionService
from plugtune.gateway.engine import Generation, GenerationEngine, SamplingParams
from plugtune.gateway.sampling import JobSampling
from plugtune.gateway.serving import ThreadedServer
from plugtune.gateway.trace import TraceBuilder
from plugtune.sdk import Policy
from plugtune.types import TokenTrace

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TokenReply:
    """What an engine sampled for one request (its end-of-sequence token included, if any)."""

    token_ids: list[int]
    logprobs: list[float] | None = None  # per token; None when the engine gave none
    version: int | None = None  # the weights version the engine sampled with (None: the gateway's)


#: The engine's generation: prompt ids and how to sample -> the sampled tokens.
Generate = Callable[[list[int], SamplingParams], Awaitable[TokenReply]]


class _EngineAdapter:
    """What ``CompletionService`` needs of an engine (``submit``), over an external ``generate``."""

    def __init__(
        self,
        generate: Generate,
        loop: asyncio.AbstractEventLoop,
        eos_ids: set[int],
        decode: Callable[[list[int]], str],
        version: Callable[[], int],
    ) -> None:
        self._generate, self._loop, self._eos = generate, loop, eos_ids
        self._decode, self._version = decode, version

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> concurrent.futures.Future[Generation]:
        return asyncio.run_coroutine_threadsafe(self._run(prompt_ids, params), self._loop)

    async def _run(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        version = self._version()
        reply = await self._generate(list(prompt_ids), params)
        version = version if reply.version is None else int(reply.version)
        tokens = [int(t) for t in reply.token_ids][: params.max_tokens]
        logprobs = [float(x) for x in (reply.logprobs or [])][: len(tokens)]
        if len(logprobs) != len(tokens):  # no log-probs from the engine: the record says 0.0
            logprobs = [0.0] * len(tokens)
        return self._generation(tokens, logprobs, params, version)

    def _generation(
        self, tokens: list[int], logprobs: list[float], params: SamplingParams, version: int
    ) -> Generation:
        for i, token in enumerate(tokens):
            if token in self._eos:
                return _done(tokens[: i + 1], logprobs[: i + 1], "stop", True, None, version)
        cut = _stop_cut(tokens, params.stop, self._decode)
        if cut is not None:
            n, at = cut
            return _done(tokens[:n], logprobs[:n], "stop", False, at, version)
        reason = "length" if len(tokens) >= params.max_tokens else "stop"
        return _done(tokens, logprobs, reason, False, None, version)


def _stop_cut(
    tokens: list[int], stops: tuple[str, ...], decode: Callable[[list[int]], str]
) -> tuple[int, int] | None:
    """The fewest tokens whose text holds a stop string, and where it starts (None: no stop)."""
    stops = tuple(s for s in stops if s)
    if not stops or not any(s in decode(tokens) for s in stops):
        return None
    for n in range(1, len(tokens) + 1):
        text = decode(tokens[:n])
        hits = [text.find(s) for s in stops if s in text]
        if hits:
            return n, min(hits)
    return None


def _done(
    tokens: list[int], logprobs: list[float], reason: str, eos: bool, at: int | None, version: int
) -> Generation:
    return Generation(
        token_ids=tokens,
        logprobs=logprobs,
        top_logprobs=[],
        finish_reason=reason,
        ended_with_eos=eos,
        stop_text_at=at,
        policy_version=version,
        batch_size=1,
    )


class TokenGateway:
    """An OpenAI-compatible server whose replies an external engine samples; records tokens."""

    def __init__(
        self,
        tokenizer: Any,
        generate: Generate,
        loop: asyncio.AbstractEventLoop,
        *,
        model_name: str = "policy",
        max_context: int = 4096,
        host: str = "127.0.0.1",
        policy_version: int = 0,
        sampling: JobSampling | None = None,
    ) -> None:
        self.model_name, self.host, self.port = model_name, host, 0
        self._version = policy_version
        renderer = ChatRenderer(copy.deepcopy(tokenizer))
        eos = {int(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None else set()
        adapter = _EngineAdapter(generate, loop, eos, renderer.decode, lambda: self._version)
        # CompletionService only calls ``submit`` on its engine.
        engine = cast(GenerationEngine, adapter)
        self._service = CompletionService(renderer, engine, model_name, max_context, sampling)
        self._keys: dict[str, str] = {}
        self._traces: dict[str, TraceBuilder] = {}
        self._registry = threading.Lock()
        self._http = ThreadedServer("plugtune-token-gateway", "the policy gateway")

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def set_policy_version(self, version: int) -> None:
        self._version = int(version)

    def start(self, timeout_s: float = 30.0) -> None:
        """Serve HTTP on a background thread; returns once the server accepts connections."""
        if self._http.running:
            return
        app = build_app(self._service, self._resolve, lambda: self._version)
        self.port = self._http.start(app, self.host, 0, timeout_s=timeout_s)
        logger.info("token gateway serving %s at %s", self.model_name, self.base_url)

    def stop(self, timeout_s: float = 10.0) -> None:
        self._http.stop(timeout_s)

    def open(self, trajectory_id: str) -> Policy:
        """A fresh key (and empty record) for one trajectory; opening an id again starts it over."""
        key = "pt-" + secrets.token_urlsafe(24)
        with self._registry:
            for old in [k for k, t in self._keys.items() if t == trajectory_id]:
                del self._keys[old]
            self._keys[key] = trajectory_id
            self._traces[trajectory_id] = TraceBuilder(trajectory_id)
        return Policy(base_url=self.base_url, api_key=key, model=self.model_name)

    def take(self, trajectory_id: str) -> TokenTrace:
        """The trajectory's token record; its key stops working. KeyError for an unknown id."""
        with self._registry:
            builder = self._traces.pop(trajectory_id)
            for old in [k for k, t in self._keys.items() if t == trajectory_id]:
                del self._keys[old]
        with builder.lock:
            return builder.snapshot()

    def _resolve(self, key: str) -> TraceBuilder | None:
        with self._registry:
            trajectory_id = self._keys.get(key)
            return self._traces.get(trajectory_id) if trajectory_id is not None else None
