"""``LocalVLLMServer``: the part of vLLM's HTTP server that TRL's ``VLLMClient`` speaks, over
plugtune's CPU ``GenerationEngine``.

TRL 1.16's ``VLLMClient`` (``trl.generation.vllm_client``) talks to ``vllm serve`` started as
``trl vllm-serve`` does: ``GET /health``, ``GET /v1/models``, ``POST /v1/completions`` with token-id
prompts, ``return_token_ids`` and ``return_tokens_as_token_ids``, and the development endpoints
(``/get_world_size``, ``/server_info``, ``/reset_prefix_cache``, the NCCL weight transfer). This
server answers the generation part with real decoding on one machine, so a TRL run with
``use_vllm=True`` (server mode) and plugtune's ``rollout_func`` can be tried and tested without a
GPU. It has no weight-transfer engine: ``/server_info`` says so (``weight_transfer_config: null``),
as a real server started without ``--weight-transfer-config`` does, and TRL's
``init_communicator`` then refuses with its own message; the weight-update endpoints answer 501.
Decoding from the trainer's own model object, it needs no weight sync.

    server = LocalVLLMServer(model, tokenizer)      # the model TRL trains, or any causal LM
    server.start()                                  # server.base_url: http://127.0.0.1:PORT
    client = VLLMClient(base_url=server.base_url)   # TRL's real client
    server.stop()
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from plugtune.errors import PlatformError
from plugtune.gateway.engine import Generation, GenerationEngine, SamplingParams
from plugtune.gateway.serving import ThreadedServer

#: Sampling settings the engine does not implement, with the value that means "off".
UNSUPPORTED = {"top_k": (0, -1, None), "min_p": (0.0, None), "repetition_penalty": (1.0, None)}
WEIGHT_TRANSFER = (
    "/init_weight_transfer_engine",
    "/start_weight_update",
    "/update_weights",
    "/finish_weight_update",
)


class LocalVLLMServer:
    """vLLM's completions API (the subset TRL's ``VLLMClient`` uses) on ``127.0.0.1``."""

    def __init__(
        self, model: Any, tokenizer: Any, *, model_name: str = "plugtune-local", host: str = "127.0.0.1"
    ) -> None:
        self.model_name, self.host, self.port = model_name, host, 0
        self.tokenizer = tokenizer
        self.requests = 0  # completion choices generated
        self.weights_version = 0
        eos = {int(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None else set()
        self.engine = GenerationEngine(
            model,
            eos_token_ids=eos,
            decode=lambda ids: str(tokenizer.decode(ids)),
            weights_lock=threading.Lock(),
            policy_version=lambda: self.weights_version,
            pad_token_id=int(tokenizer.pad_token_id or 0),
        )
        self._http = ThreadedServer("plugtune-local-vllm", "the local vLLM server")

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> None:
        """Serve on a background thread; returns once the server accepts connections."""
        if self._http.running:
            return
        self.engine.start()
        try:
            self.port = self._http.start(self._app(), self.host, 0, timeout_s=timeout_s)
        except PlatformError:
            self.engine.stop()
            raise

    def stop(self, timeout_s: float = 10.0) -> None:
        self._http.stop(timeout_s)
        self.engine.stop()

    def _app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/health")
        async def health() -> dict[str, str]:
            return {}

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": self.model_name, "object": "model"}]}

        @app.get("/get_world_size")
        async def world_size() -> dict[str, int]:
            return {"world_size": 1}

        @app.get("/server_info")
        async def server_info() -> dict[str, Any]:
            config = {"model_config": {"logprobs_mode": "processed_logprobs"}, "weight_transfer_config": None}
            return {"vllm_config": config}

        @app.post("/reset_prefix_cache")
        async def reset_prefix_cache() -> dict[str, bool]:
            return {"success": True}

        for path in WEIGHT_TRANSFER:
            app.add_api_route(path, _no_weight_transfer, methods=["POST"])

        @app.post("/v1/completions")
        async def completions(request: Request) -> JSONResponse:
            body = await request.json()
            try:
                prompts, params, n = self._parse(body)
            except ValueError as exc:
                return JSONResponse({"error": {"message": str(exc), "type": "BadRequestError"}}, 400)
            futures = [self.engine.submit(p, params) for p in prompts for _ in range(n)]
            generations = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
            self.requests += len(generations)
            want_logprobs = body.get("logprobs") is not None
            choices = [self._choice(i, prompts[i // n], g, want_logprobs) for i, g in enumerate(generations)]
            return JSONResponse(
                {
                    "id": f"cmpl-{uuid.uuid4().hex}",
                    "object": "text_completion",
                    "created": int(time.time()),
                    "model": self.model_name,
                    "choices": choices,
                }
            )

        return app

    def _parse(self, body: dict[str, Any]) -> tuple[list[list[int]], SamplingParams, int]:
        for name, off in UNSUPPORTED.items():
            if body.get(name) not in off:
                raise ValueError(f"{name}={body[name]!r} is not supported by plugtune's local vLLM server")
        prompt = body.get("prompt")
        if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], int)):
            prompt = [prompt]
        if not isinstance(prompt, list) or not prompt:
            raise ValueError("'prompt' must be a string, a list of token ids, or a list of either")
        prompts = [
            list(self.tokenizer(p, add_special_tokens=False)["input_ids"]) if isinstance(p, str) else list(p)
            for p in prompt
        ]
        stop = body.get("stop") or ()
        params = SamplingParams(
            max_tokens=int(body.get("max_tokens") or 16),
            temperature=float(body.get("temperature", 1.0)),
            top_p=float(body.get("top_p", 1.0)),
            stop=(stop,) if isinstance(stop, str) else tuple(stop),
            seed=body.get("seed"),
        )
        return prompts, params, int(body.get("n") or 1)

    def _choice(self, index: int, prompt_ids: list[int], g: Generation, logprobs: bool) -> dict[str, Any]:
        tokens = [f"token_id:{t}" for t in g.token_ids]
        return {
            "index": index,
            "text": str(self.tokenizer.decode(g.token_ids, skip_special_tokens=True)),
            "prompt_token_ids": list(prompt_ids),
            "token_ids": list(g.token_ids),
            "finish_reason": g.finish_reason,
            "logprobs": {
                "tokens": tokens,
                "token_logprobs": list(g.logprobs),
                "top_logprobs": [{t: lp} for t, lp in zip(tokens, g.logprobs, strict=True)],
            }
            if logprobs
            else None,
        }


async def _no_weight_transfer() -> JSONResponse:
    message = (
        "plugtune's local vLLM server has no weight-transfer engine: it decodes from the model object it "
        "was given (TRL's NCCL weight sync needs `vllm serve --weight-transfer-config` on a GPU)"
    )
    return JSONResponse({"error": {"message": message, "type": "NotImplementedError"}}, 501)
