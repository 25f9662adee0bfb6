"""Ray's exceptions, translated once into the runtime's neutral facts (never a raw Ray traceback).

A call's Ray failure becomes a :class:`Failed` fact (``DIED``, ``OOM_KILLED``, ``NOT_CREATED``);
an instance that could not start becomes a :class:`DeployFailed`; a cluster that no longer answers
becomes a ``PlatformError`` (``internal error``: the platform owns it and the job is retried).
"""

from __future__ import annotations

import re
from typing import Any

from plugtune.errors import PlatformError
from plugtune.runtime.backend import DeployFailed, Failed, Happened
from plugtune.runtime.ray.cluster import first_line


def call_failed(exc: BaseException, instance_id: str, node: str, latency_ms: float) -> Failed:
    """The fact for a call whose actor failed under it."""
    import ray.exceptions as rex

    where = f"instance {instance_id} on Ray node {node[:12]}"
    if isinstance(exc, rex.OutOfMemoryError):
        text = f"{where} was killed by Ray's memory monitor (the node ran out of memory)"
        return Failed(Happened.OOM_KILLED, text, instance_id=instance_id, latency_ms=latency_ms)
    if isinstance(exc, rex.RuntimeEnvSetupError):
        text = f"Ray could not set up the plugin's runtime_env on node {node[:12]}: {setup_reason(exc)}"
        return Failed(Happened.NOT_CREATED, text, instance_id=instance_id, latency_ms=latency_ms)
    if isinstance(exc, rex.ActorUnavailableError):
        text = f"{where} became unreachable during the call (its node may be lost): {_reason(exc)}"
    elif isinstance(exc, rex.RayActorError):
        text = f"{where} ended during the call: {_reason(exc)}"
    else:
        text = f"{where} failed in Ray during the call: {type(exc).__name__}: {_reason(exc)}"
    return Failed(Happened.DIED, text, instance_id=instance_id, latency_ms=latency_ms)


def start_failed(exc: BaseException) -> DeployFailed | PlatformError:
    """The reason an actor could not be created or did not become ready (a PlatformError when
    plugtune's own code on the node raised: that is an internal error, not the plugin's)."""
    import ray.exceptions as rex

    if isinstance(exc, rex.RayTaskError):
        inner = exc.cause if isinstance(exc.cause, BaseException) else exc
        return PlatformError(
            f"plugtune's instance host failed on a Ray node: {type(inner).__name__}: {first_line(inner)}",
            cause="ray host error",
        )
    if isinstance(exc, rex.RuntimeEnvSetupError):
        return DeployFailed(f"Ray could not set up the plugin's runtime_env on a node: {setup_reason(exc)}")
    if isinstance(exc, rex.RayActorError):
        return DeployFailed(f"the instance's Ray actor ended while starting: {_reason(exc)}")
    return DeployFailed(f"Ray could not start the instance: {type(exc).__name__}: {_reason(exc)}")


def host_failed(text: str) -> PlatformError:
    """plugtune's own code in the actor raised while running a call: an internal error."""
    return PlatformError(f"plugtune's instance host failed on a Ray node: {text}", cause="ray host error")


def cluster_lost(address: str, exc: BaseException | None) -> PlatformError:
    why = f": {first_line(exc)}" if exc is not None else ""
    return PlatformError(f"the Ray cluster ({address}) stopped answering{why}", cause="ray head lost")


def is_ray_error(exc: BaseException) -> bool:
    import ray.exceptions as rex

    return isinstance(exc, rex.RayError)


def setup_reason(exc: BaseException) -> str:
    """A runtime_env failure's cause: the agent's last exception line (and pip's ERROR lines)."""
    lines = [line.strip() for line in str(exc).splitlines()]
    raised = [line for line in lines if re.match(r"^[\w.]+(Error|Exception): ", line)]
    tool = [line for line in lines if line.startswith("ERROR: ")]
    found = " ".join([*raised[-1:], *tool[-2:]])
    return (found or first_line(exc))[:600]


def _reason(exc: Any) -> str:
    """Ray's messages carry the whole remote traceback; keep the line that says why."""
    text = str(exc)
    for marker in ("The actor died because", "The actor is dead because", "Reason:", "Error message:"):
        at = text.find(marker)
        if at >= 0:
            return " ".join(text[at:].split("\n")[0:1])[:400]
    return first_line(exc)
