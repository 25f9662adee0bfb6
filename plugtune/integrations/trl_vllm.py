"""TRL's vLLM client answering the rollout's policy calls (``rollout_func`` with ``use_vllm=True``).

In TRL's server mode (``GRPOConfig(use_vllm=True, vllm_mode="server")``) the trainer holds a
``VLLMClient`` (``trainer.vllm_generation.vllm_client``) and syncs its weights to the server before
each step's ``rollout_func`` call. Here that client is the policy gateway's engine: each policy
call of a rollout becomes one ``VLLMClient.generate`` of the rendered prompt's token ids, and the
gateway records the token ids and log-probs the server sampled (never re-tokenized). A process
that TRL gave no client (not the main process) opens its own to the same server, for generation
only. Colocate mode (vLLM inside the trainer's process) is not supported on this path.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
from typing import Any

from plugtune.gateway.engine import SamplingParams
from plugtune.integrations.token_gateway import TokenReply

#: Policy calls in flight to the server at once (TRL's own client pools as many connections).
MAX_IN_FLIGHT = 64


def vllm_client_of(trainer: Any) -> Any:
    """The trainer's ``VLLMClient`` (server mode); a clear error for colocate mode."""
    args = trainer.args
    if args.vllm_mode != "server":
        raise ValueError(
            f"plugtune's rollout_func with use_vllm=True needs vllm_mode='server' (got {args.vllm_mode!r}): "
            "start a server with `trl vllm-serve --model ...` and point vllm_server_base_url at it, "
            "or set use_vllm=False to generate from the trainer's model"
        )
    generation = getattr(trainer, "vllm_generation", None)
    client = getattr(generation, "vllm_client", None)
    if client is not None:
        return client
    from trl.generation.vllm_client import VLLMClient

    url = args.vllm_server_base_url or f"http://{args.vllm_server_host}:{args.vllm_server_port}"
    return VLLMClient(base_url=url, connection_timeout=args.vllm_server_timeout)


class VLLMEngine:
    """``TokenGateway``'s engine over a ``VLLMClient``: the blocking client calls run in a thread
    pool, driven from an event loop of this engine's own."""

    def __init__(self, client: Any, max_in_flight: int = MAX_IN_FLIGHT) -> None:
        self.client = client
        self.loop = asyncio.new_event_loop()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_in_flight, thread_name_prefix="plugtune-vllm")
        self._thread = threading.Thread(target=self.loop.run_forever, name="plugtune-vllm-loop", daemon=True)
        self._thread.start()

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> TokenReply:
        extra: dict[str, Any] = {}
        if params.stop:
            extra["stop"] = list(params.stop)
        if params.seed is not None:
            extra["seed"] = params.seed
        call = functools.partial(
            self.client.generate,
            [list(prompt_ids)],
            n=1,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_tokens,
            logprobs=0,
            generation_kwargs=extra or None,
        )
        result = await asyncio.get_running_loop().run_in_executor(self._pool, call)
        token_ids = [int(t) for t in result["completion_ids"][0]]
        return TokenReply(token_ids, sampled_logprobs(result, token_ids))

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self._pool.shutdown(wait=False, cancel_futures=True)


def sampled_logprobs(result: dict[str, Any], token_ids: list[int]) -> list[float] | None:
    """Each sampled token's log-prob from ``VLLMClient.generate``'s per-token lists (best first, the
    sampled token among them); None when the server sent none or any is missing."""
    logprobs, ids = result.get("logprobs"), result.get("logprob_token_ids")
    if not logprobs or not ids:
        return None
    out: list[float] = []
    for token, values, candidates in zip(token_ids, logprobs[0], ids[0], strict=False):
        value = values[candidates.index(token)] if token in candidates else None
        if value is None:
            return None
        out.append(float(value))
    return out if len(out) == len(token_ids) else None
