"""``PolicyGateway``: the model being trained, served over HTTP to rollouts, in process."""

from __future__ import annotations

import collections
import copy
import logging
import secrets
import threading
from typing import Any

from plugtune.errors import PlatformError
from plugtune.gateway.app import build_app
from plugtune.gateway.chat import ChatRenderer
from plugtune.gateway.completions import CompletionService
from plugtune.gateway.engine import AUTO_THREADS, GenerationEngine
from plugtune.gateway.sampling import JobSampling
from plugtune.gateway.serving import ThreadedServer
from plugtune.gateway.trace import TraceBuilder
from plugtune.sdk import Policy
from plugtune.types import TokenTrace

logger = logging.getLogger(__name__)

ENDED_KEYS_KEPT = 1 << 16  # keys of ended trajectories remembered, to say why they no longer work


class PolicyGateway:
    """An OpenAI-compatible server for ``model`` that records each trajectory's exact tokens.

    The HTTP server runs on its own event loop in a background thread and generation in another,
    so a trainer in the main thread keeps working. The engine decodes from the very ``model``
    object the trainer updates; the trainer holds ``weights_lock`` while it changes the weights
    and then calls ``set_policy_version``. Generation runs under ``torch.inference_mode`` in whatever
    train/eval mode the model is in (the gateway never switches it: that would race the trainer),
    on ``generation_threads`` torch intra-op threads of its own (None: torch's default; 0, the
    default: one for a model of at most 64 MiB of weights; for a larger one, this thread's torch
    count to prefill and, per batch, that count or one to decode, whichever measures faster).

    With ``sampling`` (the job's temperature, top_p and max_new_tokens) every reply is sampled
    with those settings: a request that omits one gets the job's, one that contradicts it is a
    400 (``plugtune.gateway.sampling``). Without it each request samples as it asks.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        model_name: str = "policy",
        host: str = "127.0.0.1",
        port: int = 0,
        max_batch_size: int = 64,
        max_context: int | None = None,
        generation_threads: int | None = AUTO_THREADS,
        sampling: JobSampling | None = None,
    ) -> None:
        self.model_name = model_name
        self.host, self.port = host, port
        self.weights_lock = threading.Lock()
        self._version = 0
        # A copy: the trainer may change its tokenizer's padding while the gateway encodes.
        tokenizer = copy.deepcopy(tokenizer)
        self._renderer = ChatRenderer(tokenizer)
        self.engine = GenerationEngine(
            model,
            eos_token_ids=_eos_ids(model, tokenizer),
            decode=self._renderer.decode,
            weights_lock=self.weights_lock,
            policy_version=lambda: self._version,
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
            max_batch_size=max_batch_size,
            open_callers=lambda: len(self._traces),
            threads=generation_threads,
        )
        context = max_context or getattr(model.config, "max_position_embeddings", None) or 4096
        self._service = CompletionService(self._renderer, self.engine, model_name, int(context), sampling)
        self._keys: dict[str, str] = {}  # key -> its trajectory
        self._key_of: dict[str, str] = {}  # trajectory -> its one live key
        self._ended: collections.OrderedDict[str, tuple[str, str]] = collections.OrderedDict()
        self._traces: dict[str, TraceBuilder] = {}
        self._registry = threading.Lock()
        self._http = ThreadedServer("plugtune-gateway", "the policy gateway")

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def policy_version(self) -> int:
        return self._version

    def set_policy_version(self, version: int) -> None:
        """Tag tokens generated from now on with ``version`` (call after updating the weights)."""
        self._version = int(version)

    def start(self, timeout_s: float = 30.0) -> None:
        """Start the engine and the HTTP server; returns once the server accepts connections."""
        if self._http.running:
            return
        app = build_app(self._service, self._resolve, lambda: self._version)
        self.engine.start()
        try:
            # No proxy-header middleware (rollouts call it directly) and no Server/Date headers:
            # less work per request on the gateway's one thread.
            self.port = self._http.start(
                app,
                self.host,
                self.port,
                timeout_s=timeout_s,
                proxy_headers=False,
                server_header=False,
                date_header=False,
            )
        except PlatformError:
            self.engine.stop()
            raise
        logger.info("policy gateway serving %s at %s", self.model_name, self.base_url)

    def stop(self, timeout_s: float = 10.0) -> None:
        self._http.stop(timeout_s)
        self.engine.stop(timeout_s)

    def __enter__(self) -> PolicyGateway:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def open(self, trajectory_id: str, sampling: JobSampling | None = None) -> Policy:
        """A fresh key (and empty record) for one trajectory; opening an id again starts it over.

        ``sampling`` replaces the gateway's settings for this trajectory's replies (evaluation)."""
        key = "pt-" + secrets.token_urlsafe(24)
        with self._registry:
            self._end_keys(trajectory_id, "was started over (a retry) with a new key")
            self._keys[key] = trajectory_id
            self._key_of[trajectory_id] = key
            self._traces[trajectory_id] = TraceBuilder(trajectory_id, sampling=sampling)
        return Policy(base_url=self.base_url, api_key=key, model=self.model_name)

    def take(self, trajectory_id: str) -> TokenTrace:
        """The trajectory's token record; its key stops working. KeyError for an unknown id."""
        with self._registry:
            builder = self._traces.pop(trajectory_id)
            self._end_keys(trajectory_id, "has ended")
        with builder.lock:
            return builder.snapshot()

    def _end_keys(self, trajectory_id: str, why: str) -> None:
        """The trajectory's keys stop working (call holding ``_registry``)."""
        old = self._key_of.pop(trajectory_id, None)
        if old is not None:
            del self._keys[old]
            self._ended[old] = (trajectory_id, why)
        while len(self._ended) > ENDED_KEYS_KEPT:
            self._ended.popitem(last=False)

    def _resolve(self, key: str) -> TraceBuilder | str | None:
        """The key's own trajectory, or why the key does not work (each key is one trajectory's)."""
        with self._registry:
            trajectory_id = self._keys.get(key)
            builder = self._traces.get(trajectory_id) if trajectory_id is not None else None
            if builder is not None:
                return builder
            ended = self._ended.get(key)
        if ended is None:
            return None
        return (
            f"this API key belonged to trajectory {ended[0]}, which {ended[1]}: a key works only while "
            "its own trajectory's rollout runs. Use the policy (and a client made from it) that each "
            "call is given, not one kept from an earlier call or used by a task that outlives it."
        )


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif isinstance(configured, (list, tuple)):
        ids.update(int(i) for i in configured)
    if not ids:
        raise ValueError(
            "the tokenizer has no eos_token and the model no eos_token_id: generation could not stop"
        )
    return ids
