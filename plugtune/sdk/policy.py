"""``Policy``: how a rollout reaches the model being trained (the policy gateway)."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any


class PolicyError(RuntimeError):
    """Raised by ``Policy.chat`` when the gateway answers with an error."""


@dataclass(frozen=True)
class Policy:
    """An OpenAI-compatible endpoint with a per-trajectory key; tokens are recorded server-side.

    Use ``openai()`` / ``async_openai()`` for the official client, or ``chat()`` / ``achat()``,
    which need no extra package.
    """

    base_url: str
    api_key: str
    model: str = "policy"
    timeout_s: float = 600.0

    def openai(self) -> Any:
        """A sync ``openai.OpenAI`` client bound to this trajectory."""
        import openai

        return openai.OpenAI(
            base_url=self.base_url, api_key=self.api_key, timeout=self.timeout_s, max_retries=0
        )

    def async_openai(self) -> Any:
        """An ``openai.AsyncOpenAI`` client bound to this trajectory."""
        import openai

        return openai.AsyncOpenAI(
            base_url=self.base_url, api_key=self.api_key, timeout=self.timeout_s, max_retries=0
        )

    def chat(self, messages: list[dict[str, Any]], **params: Any) -> dict[str, Any]:
        """POST /chat/completions and return the JSON reply (stdlib only, blocking)."""
        body = json.dumps({"model": self.model, "messages": messages, **params}).encode()
        request = urllib.request.Request(
            self.base_url.rstrip("/") + "/chat/completions",
            data=body,
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.api_key}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return dict(json.loads(response.read()))
        except urllib.error.HTTPError as exc:
            raise PolicyError(
                f"policy gateway answered {exc.code}: {exc.read().decode(errors='replace')}"
            ) from exc

    async def achat(self, messages: list[dict[str, Any]], **params: Any) -> dict[str, Any]:
        """``chat`` for ``async def`` rollouts: runs the request off the event loop."""
        return await asyncio.to_thread(self.chat, messages, **params)

    @staticmethod
    def content(reply: dict[str, Any]) -> str:
        """The assistant text of a ``chat`` reply."""
        return str(reply["choices"][0]["message"].get("content") or "")
