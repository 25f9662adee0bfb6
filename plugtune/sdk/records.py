"""What a plugin is given: the dataset ``Sample`` and, for graders, the ``Trajectory``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Sampling:
    """Sampling settings the job asks rollouts to use with the policy."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 64


@dataclass(frozen=True)
class Sample:
    """One dataset row: ``messages`` (last role user or tool), ``tools`` and free-form ``extra``."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    index: int = 0
    sampling: Sampling = field(default_factory=Sampling)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sample:
        sampling = Sampling(**data.get("sampling", {}))
        return cls(
            messages=list(data["messages"]),
            tools=list(data.get("tools") or []),
            extra=dict(data.get("extra") or {}),
            index=int(data.get("index", 0)),
            sampling=sampling,
        )


@dataclass(frozen=True)
class Trajectory:
    """What a grader scores: the conversation the rollout produced, in OpenAI message format."""

    trajectory_id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def completion(self) -> str:
        """Text of the last assistant message ('' when there is none)."""
        for message in reversed(self.messages):
            if message.get("role") == "assistant":
                return str(message.get("content") or "")
        return ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        return cls(
            trajectory_id=str(data["trajectory_id"]),
            messages=list(data["messages"]),
            tools=list(data.get("tools") or []),
            metrics=dict(data.get("metrics") or {}),
            extra=dict(data.get("extra") or {}),
        )
