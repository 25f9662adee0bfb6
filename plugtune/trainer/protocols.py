"""What the trainer needs from the layers beside it, as Protocols (it imports neither).

``jobs`` wires in the policy gateway (a :class:`PolicyServer`) and the function runtime's
deployed functions (:class:`PluginFunction`); ``plugtune.trainer.testing`` has in-process ones.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from plugtune.sdk import Context, PluginSpec, Policy
from plugtune.types import CallOutcome, TokenTrace


class PolicyServer(Protocol):
    """Serves the model being trained to rollouts and records each trajectory's exact tokens."""

    @property
    def weights_lock(self) -> AbstractContextManager[Any]:
        """Held while the weights change, so no generation sees half an update."""
        ...

    def open(self, trajectory_id: str) -> Policy:
        """A per-trajectory endpoint for one rollout; opening an id again starts its record over."""
        ...

    def take(self, trajectory_id: str) -> TokenTrace:
        """The token record of a finished trajectory (and forget it)."""
        ...

    def set_policy_version(self, version: int) -> None:
        """Tag tokens generated from now on with ``version``."""
        ...


class PluginFunction(Protocol):
    """A deployed rollout / grader / group grader."""

    @property
    def spec(self) -> PluginSpec: ...

    async def invoke(self, ctx: Context, *args: Any) -> CallOutcome:
        """Call the plugin; raises ``PluginCallError`` when the call failed."""
        ...


#: How the trainer calls a plugin: ``await caller(fn, ctx, *args)``. The jobs layer supplies one
#: with its retry policy; it may raise to stop the job.
Caller = Callable[..., Awaitable[CallOutcome]]


async def call_once(fn: PluginFunction, ctx: Context, *args: Any) -> CallOutcome:
    """The default caller: one attempt, failures propagate as ``PluginCallError``."""
    return await fn.invoke(ctx, *args)
