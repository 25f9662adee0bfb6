"""The wire format between the supervisor and an instance: length-prefixed msgpack frames.

Every frame is a 4-byte big-endian length followed by one msgpack array whose first item names
the message. Calls are multiplexed on one connection by call id. This module is imported by the
worker too, so it depends on the standard library, msgpack and ``plugtune.sdk`` only.

supervisor -> instance: ``[CALL, *Call]``, ``[CANCEL, *Cancel]``, ``[STATS]``, ``[STOP]``.
instance -> supervisor: ``[READY, *Ready]``, ``[FATAL, *Fatal]``, ``[LOG, *Log]``, ``[OK, *Ok]``,
``[ERR, *Err]``, ``[STATS, *Stats]``.
supervisor -> zygote: ``[FORK, *Fork]`` (with two file descriptors), ``[STOP]``.
zygote -> supervisor: ``[LOADED, *Loaded]``, ``[FATAL, *Fatal]``, ``[FORKED, *Forked]``,
``[EXITED, *Exited]``.

A frame's fields after its op are read by name: ``Ok(*message[1:])`` (a frame with the wrong number
of fields raises TypeError naming the frame and the field).
"""

from __future__ import annotations

import math
import struct
from dataclasses import asdict
from typing import Any, NamedTuple

import msgpack

from plugtune.sdk import GraderResult, Kind, Policy, RolloutResult, Sample, Sampling, Trajectory
from plugtune.sdk.context import Context

HEADER = struct.Struct(">I")
#: The largest frame an instance may send (its reply, a log line): twice the policy gateway's 16 MiB
#: request limit, through which a rollout's messages came. A larger one means the instance is broken
#: or hostile: the supervisor refuses it as soon as its length arrives, before buffering it.
MAX_FRAME = 32 << 20
#: The largest frame the supervisor may send an instance (a group grader's call carries a group).
MAX_CALL_FRAME = 512 << 20

CALL, CANCEL, STATS, STOP = "call", "cancel", "stats", "stop"
READY, FATAL, LOG, OK, ERR = "ready", "fatal", "log", "ok", "err"
LOADED, FORK, FORKED, EXITED = "loaded", "fork", "forked", "exited"  # the zygote's

# ERR kinds: what the worker saw happen (the supervisor maps them onto the taxonomy).
RAISED, MEMORY, CANCELLED, BAD_RETURN = "raised", "memory", "cancelled", "bad_return"
PIDS, DISK = "pids", "disk"  # the call failed on the instance's pids limit / full temp space
#: A call failed on a service it called: the kind is ``"dependency/<cause>/<declared name>"``, then
#: ``"/<seconds>"`` when the reply said ``Retry-After``.
DEPENDENCY = "dependency"
POLICY_REFUSED = "policy_refused"  # network policy-only refused a connection the call made


def dependency_kind(cause: str, name: str, retry_after_s: float | None = None) -> str:
    after = "" if retry_after_s is None else f"/{retry_after_s:.3f}"
    return f"{DEPENDENCY}/{cause}/{name}{after}"


def parse_dependency_kind(kind: str) -> tuple[str, str, str] | None:
    """``(cause, declared name, Retry-After seconds or "")`` of a dependency kind (None for any other
    kind)."""
    head, _, rest = kind.partition("/")
    if head != DEPENDENCY or not rest:
        return None
    cause, _, rest = rest.partition("/")
    name, _, after = rest.partition("/")
    return cause, name, after


TYPE_KEY = "$t"


# ---- frames: the fields after each op, by name ------------------------------------------------


class Call(NamedTuple):
    """Run a call (supervisor -> instance)."""

    call_id: str
    context: list[Any]  # encode_context's
    args: list[Any]  # encode_args'
    fault: str | None  # a fault to inject instead of running it (FaultInjection), or None


class Cancel(NamedTuple):
    """Cancel a call (supervisor -> instance): a call not started yet is answered ``cancelled``."""

    call_id: str


class Ready(NamedTuple):
    """The instance's ``setup()`` is done (instance -> supervisor)."""

    pid: int  # as the instance says: the supervisor takes its pid from the kernel instead
    setup_ms: float


class Fatal(NamedTuple):
    """The instance or the zygote could not start (its import or ``setup()`` failed)."""

    message: str
    traceback: str


class Log(NamedTuple):
    """A log line (instance -> supervisor)."""

    time: float
    level: str
    message: str
    source: str
    call_id: str  # "" outside a call
    trajectory_id: str


class Ok(NamedTuple):
    """A call returned (instance -> supervisor)."""

    call_id: str
    value: Any  # encode_result's
    metrics: dict[str, float]


class Err(NamedTuple):
    """A call failed (instance -> supervisor)."""

    call_id: str
    kind: str  # RAISED, MEMORY, CANCELLED, ... or a dependency kind
    message: str
    traceback: str
    metrics: dict[str, float]


class Stats(NamedTuple):
    """The instance's gauges (instance -> supervisor, the answer to ``[STATS]``)."""

    outbound_bytes: int


class Loaded(NamedTuple):
    """The zygote imported the plugin (zygote -> supervisor): its decorator's spec."""

    spec: dict[str, Any]


class Fork(NamedTuple):
    """Fork an instance (supervisor -> zygote), its socket and output pipe attached."""

    config: dict[str, Any]


class Forked(NamedTuple):
    """The zygote forked an instance (a claim: the supervisor checks the pid in the kernel)."""

    instance_id: str
    pid: int


class Exited(NamedTuple):
    """A child of the zygote ended."""

    pid: int
    exit_code: int  # negative: killed by that signal


class ProtocolError(Exception):
    """Raised when a peer sends bytes that are not a valid frame."""


def pack(message: list[Any]) -> bytes:
    body = msgpack.packb(message, use_bin_type=True)
    return HEADER.pack(len(body)) + body


class FrameReader:
    """Turns a byte stream into messages; keeps a partial frame between feeds.

    A frame longer than ``limit`` is refused when its length is read, before it is buffered:
    ``broken`` says why, the messages before it are returned, and this feed (when it returned none)
    and every later one raise :class:`ProtocolError` (the stream cannot be resynchronized).
    """

    def __init__(self, limit: int = MAX_CALL_FRAME) -> None:
        self._buf = bytearray()
        self.limit = limit
        self.broken = ""

    def feed(self, data: bytes) -> list[Any]:
        if self.broken:
            raise ProtocolError(self.broken)
        buf = self._buf
        buf += data
        out: list[Any] = []
        pos, size = 0, len(buf)
        view = memoryview(buf)
        try:
            while size - pos >= 4:
                length = int.from_bytes(view[pos : pos + 4], "big")
                if length > self.limit:
                    self.broken = f"a frame of {length:,} bytes is larger than the limit of {self.limit:,}"
                    break
                end = pos + 4 + length
                if end > size:
                    break
                out.append(msgpack.unpackb(view[pos + 4 : end], raw=False, strict_map_key=False))
                pos = end
        finally:
            view.release()
        if self.broken:
            self._buf = bytearray()
            if not out:
                raise ProtocolError(self.broken)
        elif pos:
            del buf[:pos]
        return out


# ---- context and arguments -------------------------------------------------------------------

CTX_FIELDS = ("job_id", "step", "phase", "sample_id", "rollout_index", "attempt", "trajectory_id")


def encode_context(ctx: Context, call_id: str, plugin: str, deadline: float) -> list[Any]:
    c = ctx
    return [
        c.job_id,
        c.step,
        c.phase,
        c.sample_id,
        c.rollout_index,
        c.attempt,
        c.trajectory_id,
        call_id,
        plugin,
        deadline,
    ]


def decode_context(raw: list[Any], logger: Any) -> Context:
    job_id, step, phase, sample_id, rollout_index, attempt, trajectory_id, call_id, plugin, deadline = raw
    return Context(
        job_id=job_id,
        step=step,
        phase=phase,
        sample_id=sample_id,
        rollout_index=rollout_index,
        attempt=attempt,
        trajectory_id=trajectory_id,
        call_id=call_id,
        plugin=plugin,
        deadline=deadline,
        logger=logger,
    )


def encode_args(kind: Kind, args: tuple[Any, ...]) -> list[Any]:
    """The call's arguments as plain data; raises TypeError when they do not fit ``kind``."""
    if len(args) != 2:
        raise TypeError(f"a {kind.value} is invoked with 2 arguments after ctx, got {len(args)}")
    first, second = args
    if kind is Kind.ROLLOUT:
        _expect(first, Policy, "policy")
        _expect(second, Sample, "sample")
        return [_policy(first), _sample(second)]
    _expect(first, Sample, "sample")
    if kind is Kind.GRADER:
        _expect(second, Trajectory, "trajectory")
        return [_sample(first), _trajectory(second)]
    if not isinstance(second, (list, tuple)):
        raise TypeError(f"a group grader is invoked with a list of Trajectory, got {type(second).__name__}")
    for item in second:
        _expect(item, Trajectory, "trajectories[i]")
    return [_sample(first), [_trajectory(t) for t in second]]


# Shallow on purpose: msgpack walks the nested lists/dicts itself (dataclasses.asdict deep-copies).
def _policy(policy: Policy) -> dict[str, Any]:
    return {
        "base_url": policy.base_url,
        "api_key": policy.api_key,
        "model": policy.model,
        "timeout_s": policy.timeout_s,
    }


def _sample(sample: Sample) -> dict[str, Any]:
    sampling = sample.sampling
    return {
        "messages": sample.messages,
        "tools": sample.tools,
        "extra": sample.extra,
        "index": sample.index,
        "sampling": {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens,
        },
    }


def _trajectory(trajectory: Trajectory) -> dict[str, Any]:
    return {
        "trajectory_id": trajectory.trajectory_id,
        "messages": trajectory.messages,
        "tools": trajectory.tools,
        "metrics": trajectory.metrics,
        "extra": trajectory.extra,
    }


def _expect(value: Any, cls: type, name: str) -> None:
    if not isinstance(value, cls):
        raise TypeError(f"{name} must be a {cls.__name__}, got {type(value).__name__}")


def decode_args(kind: Kind, raw: list[Any]) -> tuple[Any, Any]:
    first, second = raw
    if kind is Kind.ROLLOUT:
        return Policy(**first), _decode_sample(second)
    sample = _decode_sample(first)
    if kind is Kind.GRADER:
        return sample, _frozen(Trajectory, second)
    return sample, [_frozen(Trajectory, t) for t in second]


def _decode_sample(raw: dict[str, Any]) -> Sample:
    raw["sampling"] = _frozen(Sampling, raw["sampling"])
    sample: Sample = _frozen(Sample, raw)
    return sample


def _frozen(cls: type, fields: dict[str, Any]) -> Any:
    """A frozen dataclass built from fields just decoded (exactly its fields, as ``_sample`` and
    ``_trajectory`` write them), without the per-field ``object.__setattr__`` of its ``__init__``:
    a third of the cost, on every call's path."""
    obj: Any = object.__new__(cls)
    obj.__dict__.update(fields)
    return obj


# ---- results ---------------------------------------------------------------------------------


def encode_result(value: Any) -> Any:
    """A plugin's return value as plain data, without judging it (the supervisor validates)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, GraderResult):
        return {
            TYPE_KEY: "grader_result",
            "reward": encode_result(value.reward),
            "status": str(getattr(value.status, "value", value.status)),
            "reason": value.reason,
        }
    if isinstance(value, RolloutResult):
        out = asdict(value)
        out["status"] = str(getattr(value.status, "value", value.status))
        return {TYPE_KEY: "rollout_result", **_plain(out)}
    if isinstance(value, (list, tuple)):
        return [encode_result(v) for v in value]
    return _opaque(value)


def encode_status(status: str, reason: str) -> dict[str, Any]:
    """What ``Retry`` / ``Discard`` raised inside a plugin becomes on the wire."""
    return {TYPE_KEY: "status", "status": status, "reason": reason}


def _plain(value: Any) -> Any:
    try:
        msgpack.packb(value, use_bin_type=True)
    except (TypeError, ValueError, OverflowError):
        return _opaque(value)
    return value


def _opaque(value: Any) -> dict[str, Any]:
    text = repr(value)
    return {TYPE_KEY: "object", "type": type(value).__name__, "repr": text[:200]}


def is_finite_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
