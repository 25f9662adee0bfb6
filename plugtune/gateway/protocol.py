"""The OpenAI wire format the gateway speaks: the request model, replies and error bodies."""

from __future__ import annotations

import random
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: Larger than any context a policy has; a larger ``max_tokens`` is a 400 naming the field.
MAX_TOKENS = 1 << 20


class ApiError(Exception):
    """An error the gateway answers with an OpenAI-shaped body."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCallIn(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str | None = None
    type: str = "function"
    function: FunctionCall


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None


class ChatCompletionRequest(BaseModel):
    """``POST /v1/chat/completions``; fields the gateway does not use are accepted and ignored.

    Sampling fields are checked against the job's settings in ``plugtune.gateway.sampling``.
    """

    model_config = ConfigDict(extra="allow")
    model: str
    messages: list[Message] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), le=2**64 - 1)  # what torch can seed
    n: int | None = Field(default=None, ge=1)  # more than one is refused with a pointer to group_size
    stream: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None

    @field_validator("stop")
    @classmethod
    def _at_most_four(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > 4:
            raise ValueError("at most 4 stop sequences")
        return value

    @field_validator("stream")
    @classmethod
    def _no_streaming(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError("streaming is not supported by the policy gateway; leave stream unset")
        return value

    @field_validator("tools")
    @classmethod
    def _function_tools(cls, value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for tool in value or []:
            function = tool.get("function")
            if tool.get("type", "function") != "function" or not isinstance(function, dict):
                raise ValueError("each tool must be {'type': 'function', 'function': {'name': ...}}")
            if not isinstance(function.get("name"), str):
                raise ValueError("each tool's function needs a string 'name'")
        return value

    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def wants_tool_calls(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"


#: Reply ids need to be unique, not secret: one seeding from the OS, then no system call per reply
#: (each one hands the interpreter lock to another thread of the trainer's busy process).
_IDS = random.Random()


def chat_completion(
    model: str,
    message: dict[str, Any],
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
    logprobs: list[dict[str, Any]] | None,
    policy_version: int,
) -> dict[str, Any]:
    """A ``chat.completion`` object, field for field as OpenAI returns it."""
    return {
        "id": f"chatcmpl-{_IDS.getrandbits(96):024x}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": f"policy-v{policy_version}",
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": {"content": logprobs, "refusal": None} if logprobs is not None else None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def model_list(model: str, created: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"id": model, "object": "model", "created": created, "owned_by": "plugtune"}],
    }
