"""What a plugin returns: statuses, results, and the ``Retry`` / ``Discard`` short forms."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Status(str, enum.Enum):
    """Outcome a plugin reports for its call.

    success: the result stands (returning ``None`` means success too).
    failure: something went wrong; retried ``max_attempts`` times, then the job fails.
    retry: try again; after ``max_attempts`` the sample is dropped.
    discard: drop the whole prompt group.
    """

    SUCCESS = "success"
    FAILURE = "failure"
    RETRY = "retry"
    DISCARD = "discard"


@dataclass(frozen=True)
class RolloutResult:
    """Returned by a rollout. ``messages`` overrides the conversation the gateway recorded."""

    status: Status = Status.SUCCESS
    reason: str = ""
    messages: list[dict[str, Any]] | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GraderResult:
    """Returned by a grader that needs a status; a plain float (or ``None``) is the usual form."""

    reward: float | None = None
    status: Status = Status.SUCCESS
    reason: str = ""


class Retry(Exception):  # the name is the SDK's public word
    """Raise to ask for this call to be retried; after ``max_attempts`` the sample is dropped."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason


class Discard(Exception):
    """Raise to drop this prompt's whole group from the batch."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
