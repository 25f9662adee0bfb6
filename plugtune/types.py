"""Records that cross layers (runtime → jobs → store → web). Frozen dataclasses, one place."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class LogLine:
    """One line a plugin wrote (``ctx.logger``, stdout or stderr) or the runtime wrote about it."""

    time: float
    level: str
    plugin: str
    message: str
    source: str = "logger"  # logger | stdout | stderr | runtime
    call_id: str = ""
    trajectory_id: str = ""
    instance_id: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class MetricPoint:
    """One sampled value of a plugin's resource metric (names as in the console)."""

    time: float
    plugin: str
    name: str  # exec_qps | latency_ms_avg | latency_ms_p50 | latency_ms_p99 | error_qps/<cause> |
    #            cpu_percent | memory_percent | instances | outbound_mib_s | concurrency_per_instance
    value: float
    step: int | None = None  # training metrics (plugin "") carry the step they describe


@dataclass(frozen=True)
class TokenSegment:
    """A run of response tokens produced by one source under one policy version."""

    start: int
    end: int
    source: str  # policy | environment
    policy_version: int


@dataclass(frozen=True)
class DroppedSpan:
    """Response tokens a history rewrite cut from the record (they never reach the trainer): they
    stood at response position ``at`` of the record as it is now (a later rewrite that cuts before
    ``at`` moves it back to its own cut)."""

    at: int
    tokens: int
    policy_tokens: int  # of them, sampled by the policy (mask 1)
    rewrite: int  # which rewrite of the trajectory (1, 2, ...)


@dataclass(frozen=True)
class TokenTrace:
    """What the policy gateway recorded for one trajectory: exact tokens, never re-tokenized."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]  # 1 = sampled by the policy, 0 = tool / environment / template
    response_logprobs: list[float]  # 0.0 where mask is 0
    messages: list[dict[str, Any]]
    segments: list[TokenSegment] = field(default_factory=list)
    rewrites: int = 0  # how many times a later call rewrote history and started a new segment
    dropped_policy_tokens: int = 0  # policy-sampled tokens those rewrites cut from the record
    finish_reason: str = ""
    dropped_spans: list[DroppedSpan] = field(default_factory=list)  # where those rewrites cut


#: The taxonomy's five fields (DESIGN §2): a job error's own columns in the store.
TAXONOMY = ("type", "owner", "cause", "message", "hint")
#: The fields a trajectory keeps of each of its errors (its stored and printed form).
_ON_TRAJECTORY = (*TAXONOMY, "plugin", "call_id", "trajectory_id", "attempt", "traceback")
_NAMED = ("plugin", "call_id", "trajectory_id", "traceback")
_JOB_FORM = (*TAXONOMY, "evidence", "time", "attempt")


@dataclass(frozen=True)
class ErrorRecord:
    """A classified failure (DESIGN §2), the one shape it has from the exception that found it to the
    store, the scheduler, the CLI and the web.

    ``evidence`` holds every fact beyond the taxonomy's five, as the job keeps them (the failing
    call's plugin, call_id, traceback, instance, peak memory, a data error's problems, the retry
    decision, ...); ``plugin``, ``call_id``, ``trajectory_id`` and ``traceback`` name the ones the
    console shows in their own rows. ``attempt`` is the try of the call on a trajectory's error and
    the job's attempt on a job's error (None: none); ``time`` when the job recorded it.
    """

    type: str
    owner: str
    cause: str
    message: str
    hint: str = ""
    plugin: str = ""
    call_id: str = ""
    trajectory_id: str = ""
    attempt: int | None = 1
    traceback: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)
    time: float | None = None

    def __post_init__(self) -> None:
        named = {k: getattr(self, k) for k in _NAMED if getattr(self, k) and k not in self.evidence}
        if named:  # the evidence holds them too: the store keeps a job's error as its evidence
            object.__setattr__(self, "evidence", {**self.evidence, **named})

    def to_dict(self) -> dict[str, Any]:
        """The job's form, as ``plugtune jobs show --json`` prints it and the store keeps it:
        the taxonomy's five, ``evidence``, ``time`` and ``attempt``."""
        out: dict[str, Any] = {k: getattr(self, k) for k in TAXONOMY}
        out.update(evidence=dict(self.evidence), time=self.time, attempt=self.attempt)
        return out

    def on_trajectory(self) -> dict[str, Any]:
        """The form a trajectory keeps (and prints) of this error: its evidence stays with the job."""
        return {k: getattr(self, k) for k in _ON_TRAJECTORY}

    def flat(self) -> dict[str, Any]:
        """The taxonomy's five with the evidence beside them (what ``plugtune test --json`` prints
        of a failed call)."""
        return {**{k: getattr(self, k) for k in TAXONOMY}, **self.evidence}

    @classmethod
    def from_dict(cls, data: dict[str, Any], **fields: Any) -> ErrorRecord:
        """The record of a stored or printed error of any form plugtune wrote: the job's
        (``to_dict``), or an older attempt's or exception's (its own facts beside ``evidence``: they
        join it, as the job kept them). ``fields`` (time, attempt) replace what ``data`` says."""
        found = data.get("evidence")
        evidence = dict(found) if isinstance(found, dict) else {}
        evidence.update({k: v for k, v in data.items() if k not in _JOB_FORM})
        attempt, time = data.get("attempt", 1), data.get("time")
        values: dict[str, Any] = {
            **{k: str(data.get(k) or "") for k in TAXONOMY},
            **{k: str(data.get(k) or evidence.get(k) or "") for k in _NAMED},
            "attempt": attempt if isinstance(attempt, int) or attempt is None else 1,
            "evidence": evidence,
            "time": float(time) if isinstance(time, (int, float)) else None,
        }
        return cls(**{**values, **fields})


@dataclass(frozen=True)
class TrajectoryRecord:
    """One trajectory as DESIGN §4 describes it."""

    trajectory_id: str
    group_id: str
    step: int
    sample_index: int
    rollout_index: int
    attempt: int
    policy_version: int
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    reward: float | None = None
    reward_components: dict[str, float | None] = field(default_factory=dict)
    advantage: float | None = None
    status: str = "success"  # success | failed | discard
    stop_reason: str = ""
    errors: list[ErrorRecord] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    timing: dict[str, float] = field(default_factory=dict)
    code_hash: dict[str, str] = field(default_factory=dict)
    phase: str = "train"  # train | eval (held-out rows, never trained on)
    # Why it gave the policy no gradient (empty when it did): discarded by a plugin, failed and
    # dropped, unscorable, a zero-advantage group, no policy tokens, or a step that was not applied.
    discard_reason: str = ""
    # The trainer's log-prob of each response token under the weights it trained (before the step),
    # 0.0 where the mask is 0; empty when no trainer scored it (not trained, or an engine's trainer).
    trainer_logprobs: list[float] = field(default_factory=list)
    dropped_spans: list[DroppedSpan] = field(default_factory=list)  # cut by history rewrites

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "errors": [e.on_trajectory() for e in self.errors]}


@dataclass(frozen=True)
class CallOutcome:
    """A plugin call that completed (failed calls raise ``PluginCallError`` instead).

    ``status`` is the plugin's own verdict (success / failure / retry / discard); ``value`` is
    what it returned, already validated at the runtime boundary: a finite float or None for a
    grader, a list of those for a group grader, the ``RolloutResult`` fields as a dict (or None)
    for a rollout.
    """

    status: str
    value: Any
    reason: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    logs: list[LogLine] = field(default_factory=list)
    call_id: str = ""
    instance_id: str = ""
    latency_ms: float = 0.0
