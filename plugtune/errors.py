"""One error hierarchy for every failure plugtune reports (DESIGN §2, the contract).

Each class says when it is raised. Every instance carries the taxonomy fields a user needs:
``type`` (exact string), ``owner`` (platform / plugin / data / dependency), ``cause``, ``message``
and ``hint``, and ``record()`` makes it the one :class:`~plugtune.types.ErrorRecord` that the
store, the scheduler, the CLI and the web read.
Errors are translated once, at the layer boundary where they are detected, with ``raise ... from``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from plugtune.types import ErrorRecord, LogLine


class ErrorType(str, enum.Enum):
    INTERNAL = "internal error"
    UNKNOWN = "unknown error"
    CALL_PLUGIN = "Call plugin error"
    INVALID_DATA = "Invalid data"
    INVALID_VALUE = "Invalid value"
    LOSS_NAN = "Loss nan"
    DEPENDENCY = "Dependency error"


class Owner(str, enum.Enum):
    PLATFORM = "platform"
    PLUGIN = "plugin"
    DATA = "data"
    DEPENDENCY = "dependency"  # a service the plugin calls (LLM judge, API): neither its code nor us


class Cause(str, enum.Enum):
    """Why a plugin call failed: exactly one per failed call."""

    TIMEOUT = "Timeout"
    EOF = "EOF"
    ERROR_500 = "500"
    OOM = "FaaS OOM"
    PIDS = "FaaS pids limit"
    DISK = "FaaS disk limit"
    CREATE_FAULT = "Create faas fault"
    INVALID_REWARD = "Invalid reward"


class StatusCause(str, enum.Enum):
    """A call that completed, in which the plugin itself reported that it failed: its own verdict
    (``Status.FAILURE`` / ``Status.RETRY``, or ``raise Retry``), not a fault of the runtime."""

    FAILURE = "Status failure"
    RETRY = "Status retry"


class DependencyCause(str, enum.Enum):
    """Why a call failed on a service the plugin calls (found in the failed call's exception chain):
    the service's fault, not the plugin's code nor the platform."""

    RATE_LIMITED = "rate limited"  # HTTP 429
    SERVER_ERROR = "server error"  # HTTP 5xx
    UNREACHABLE = "unreachable"  # connect refused, DNS, TLS, connection reset
    TIMEOUT = "timeout"  # the client's own timeout on the request
    BAD_REPLY = "bad reply"  # an answer that does not parse (malformed JSON, wrong shape)


OWNERS: dict[ErrorType, Owner] = {
    ErrorType.INTERNAL: Owner.PLATFORM,
    ErrorType.UNKNOWN: Owner.PLATFORM,
    ErrorType.CALL_PLUGIN: Owner.PLUGIN,
    ErrorType.INVALID_DATA: Owner.DATA,
    ErrorType.INVALID_VALUE: Owner.DATA,
    ErrorType.LOSS_NAN: Owner.DATA,
    ErrorType.DEPENDENCY: Owner.DEPENDENCY,
}

HINTS: dict[ErrorType | Cause | StatusCause | DependencyCause, str] = {
    ErrorType.INTERNAL: (
        "A platform component failed. The job retries by itself from its last checkpoint; "
        "you can also retry it now. If it keeps failing, send the support bundle."
    ),
    ErrorType.UNKNOWN: (
        "Nothing else explains this failure. Retry the job; if it repeats, send the support bundle."
    ),
    Cause.TIMEOUT: (
        "The call ran past runtime.timeout_s. Look for blocking calls inside `async def` "
        "(run `plugtune lint`), slow tools or an unbounded loop; raise timeout_s only if the work "
        "really takes that long."
    ),
    Cause.EOF: (
        "The plugin's process died mid-call (os._exit, sys.exit, a crash in native code, or a kill). "
        "Read the plugin's last log lines; do not exit the process from plugin code."
    ),
    Cause.ERROR_500: (
        "The plugin raised an exception. The traceback points at your file and line; reproduce it "
        "with `plugtune test` or `plugtune replay`."
    ),
    Cause.OOM: (
        "The plugin's instance went over runtime.memory_mb. Free large objects between calls, "
        "lower max_concurrency, or raise memory_mb."
    ),
    Cause.PIDS: (
        "The plugin's instance hit its runtime.max_pids limit (processes and threads it may start): "
        "a fork bomb, a subprocess per call that is never waited for, or a thread per call. Reuse a "
        "pool, wait for children, or raise max_pids."
    ),
    Cause.DISK: (
        "The plugin's instance filled its private temp space (runtime.tmp_mb, $TMPDIR and $HOME). "
        "Delete temp files when a call ends, stream large outputs instead of writing them, or raise "
        "tmp_mb."
    ),
    Cause.CREATE_FAULT: (
        "The plugin's instance could not be created: fix the import, syntax or setup() error shown. "
        "When it says `quota exceeded`, see what is in use with `plugtune functions` (end what killed "
        "jobs left with `plugtune functions --end-stale`), lower the job's runtime.max_instances or "
        "memory_mb, or raise the quota each job's runtime gets: `plugtune serve --max-functions N "
        "--max-instances N --total-memory-mb N` (for `plugtune run` and `plugtune test --faas`: "
        "PLUGTUNE_MAX_FUNCTIONS, PLUGTUNE_MAX_INSTANCES, PLUGTUNE_TOTAL_MEMORY_MB). Retrying the same "
        "code will not help."
    ),
    Cause.INVALID_REWARD: (
        "A grader returned NaN, inf, a non-number or a list of the wrong length. Return a finite "
        "float, or None when a trajectory cannot be scored."
    ),
    StatusCause.FAILURE: (
        "The plugin reported this failure itself: it returned Status.FAILURE (it did not raise), "
        "on every try failure_policy.max_attempts allows. The message holds its own reason: fix what "
        "it reports (read its log lines of that call), or return Status.RETRY to drop only the sample "
        "instead of failing the job."
    ),
    StatusCause.RETRY: (
        "The plugin asked for a retry itself (Status.RETRY or `raise Retry(reason)`) on every try, so "
        "the sample was dropped. The message holds its own reason; fix what it reports, or raise "
        "failure_policy.max_attempts if a later try would succeed."
    ),
    ErrorType.DEPENDENCY: (
        "A service the plugin calls failed; the plugin's code is not at fault. The job retries by "
        "itself after a delay (retry.platform_delay_s); check the service named in the message."
    ),
    DependencyCause.RATE_LIMITED: (
        "The service the plugin calls answered 429 (rate limited): it gets more requests than its "
        "limit. Lower the job's demand on it (fewer max_instances or max_concurrency for this plugin) "
        "or raise the service's limit; record its limit as `rpm` under job.yaml `dependencies:`."
    ),
    DependencyCause.SERVER_ERROR: (
        "The service the plugin calls answered with a 5xx server error: it is failing, not your "
        "code. Check the service (its status page, logs); the job retries by itself."
    ),
    DependencyCause.UNREACHABLE: (
        "The service the plugin calls could not be reached (connection refused, name not found, "
        "TLS or reset): check that it is up and that its address in job.yaml `dependencies:` is right."
    ),
    DependencyCause.TIMEOUT: (
        "The request to the service the plugin calls timed out on the client's own timeout: the "
        "service is slow or hanging. Check the service; set a client timeout below runtime.timeout_s "
        "(job.yaml `dependencies:` `timeout_s` records it)."
    ),
    DependencyCause.BAD_REPLY: (
        "The service the plugin calls answered with something that does not parse (malformed JSON or "
        "an unexpected shape). Check the service's reply in the plugin's log lines; if the service "
        "answers that way on purpose, handle it in the plugin and return None (unscorable)."
    ),
    ErrorType.INVALID_DATA: (
        "A data file is missing, unreadable or empty. Fix the path in job.yaml or the file itself."
    ),
    ErrorType.INVALID_VALUE: (
        "A value in job.yaml or the dataset is invalid. Fix each listed file, line and field."
    ),
    ErrorType.LOSS_NAN: (
        "The loss or gradient became non-finite. Check the rewards of the listed batch for extreme "
        "values, lower the learning rate, or set a kl_coef / clip_ratio."
    ),
}

TIMEOUT_HINTS: dict[bool, str] = {  # Cause.TIMEOUT's hint when the plugin's kind is known: is it async?
    True: (
        "The call ran past runtime.timeout_s. In an `async def` plugin a blocking call (time.sleep, "
        "requests, a sync client, heavy CPU work) stalls the event loop for every call in flight: "
        "run `plugtune lint`, await async clients or move the work to `asyncio.to_thread`. Otherwise "
        "look for a slow tool or an unbounded loop; raise timeout_s only if the work really takes "
        "that long."
    ),
    False: (
        "The call ran past runtime.timeout_s. This plugin is sync (`def`), so the event loop is not "
        "the cause: look for a tool, network or subprocess call without its own timeout, a lock or "
        "queue that is never released, or an unbounded loop (its last log lines show how far it "
        "got); raise timeout_s only if the work really takes that long."
    ),
}


class PlugtuneError(Exception):
    """Base of every classified failure."""

    error_type: ErrorType = ErrorType.UNKNOWN

    def __init__(self, message: str, *, cause: str = "", hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.cause = cause
        self._hint = hint

    @property
    def type(self) -> str:
        return self.error_type.value

    @property
    def owner(self) -> str:
        return OWNERS[self.error_type].value

    @property
    def hint(self) -> str:
        if self._hint is not None:
            return self._hint
        return HINTS.get(self.error_type, HINTS[ErrorType.UNKNOWN])

    def details(self) -> dict[str, Any]:
        """What this error carries beyond the taxonomy's five (its class's own facts)."""
        return {}

    def record(
        self, *, evidence: Mapping[str, Any] | None = None, trajectory_id: str = "", attempt: int | None = 1
    ) -> ErrorRecord:
        """This failure as the one record the job keeps: ``evidence`` (the retry decision, ...) joins
        the error's own facts; ``trajectory_id`` and ``attempt`` say where it happened when it knows
        no trajectory of its own."""
        details = self.details()
        return ErrorRecord(
            type=self.type,
            owner=self.owner,
            cause=self.cause,
            message=self.message,
            hint=self.hint,
            plugin=str(details.get("plugin") or ""),
            call_id=str(details.get("call_id") or ""),
            trajectory_id=str(details.get("trajectory_id") or trajectory_id),
            attempt=attempt,
            traceback=str(details.get("traceback") or ""),
            evidence={**(evidence or {}), **details},
        )

    def to_dict(self) -> dict[str, Any]:
        """The taxonomy's five and the error's own facts, side by side."""
        return self.record().flat()


class PlatformError(PlugtuneError):
    """Raised when plugtune's own code (trainer, gateway, store, attempt process) fails."""

    error_type = ErrorType.INTERNAL


class UnknownError(PlugtuneError):
    """Raised when a failure matches no other class."""

    error_type = ErrorType.UNKNOWN


#: The hint of a call that failed because ``network: policy-only`` refused its connection.
POLICY_REFUSED_HINT = (
    "The function's network is `policy-only` (the default): it reaches the policy gateway and the "
    "services declared in job.yaml `dependencies:` only, and this connection went elsewhere. Declare "
    "the service there (e.g. `dependencies: {judge: http://host:port}`, or `deploy(..., "
    "dependencies={'judge': 'http://host:port'})` in Python), or set `network: any` in the plugin's "
    "runtime to use the host's network unrestricted."
)


class PluginCallError(PlugtuneError):
    """Raised when one plugin call fails; ``cause`` is exactly one :class:`Cause` (the runtime's
    finding) or :class:`StatusCause` (the plugin's own verdict, with its reason as the message);
    ``hint``, when given, replaces the cause's general one (a sync plugin's Timeout is not about
    its event loop); ``logs`` are the call's log lines (its evidence on the trajectory page)."""

    error_type = ErrorType.CALL_PLUGIN

    def __init__(
        self,
        cause: Cause | StatusCause | DependencyCause,
        message: str,
        *,
        plugin: str = "",
        call_id: str = "",
        instance_id: str = "",
        trajectory_id: str = "",
        traceback: str = "",
        peak_memory_mb: float | None = None,
        code_hash: str = "",
        hint: str | None = None,
        logs: list[LogLine] | None = None,
    ) -> None:
        super().__init__(message, cause=cause.value, hint=hint)
        self.cause_enum = cause
        self.plugin = plugin
        self.call_id = call_id
        self.instance_id = instance_id
        self.trajectory_id = trajectory_id
        self.traceback = traceback
        self.peak_memory_mb = peak_memory_mb
        self.code_hash = code_hash
        self.logs = list(logs or [])

    @property
    def hint(self) -> str:
        return self._hint if self._hint is not None else HINTS[self.cause_enum]

    def __str__(self) -> str:
        where = f" [{self.plugin}]" if self.plugin else ""
        return f"{self.cause}{where}: {self.message}"

    def details(self) -> dict[str, Any]:
        return {
            "plugin": self.plugin,
            "call_id": self.call_id,
            "instance_id": self.instance_id,
            "trajectory_id": self.trajectory_id,
            "traceback": self.traceback,
            "peak_memory_mb": self.peak_memory_mb,
            "code_hash": self.code_hash,
        }


class DependencyCallError(PluginCallError):
    """Raised when one plugin call failed on a service the plugin calls (``cause`` is a
    :class:`DependencyCause`): the owner is the dependency, so the job is retried automatically
    like a platform error; ``dependency`` names it as job.yaml declares it ("" when undeclared);
    ``retry_after_s`` is the service's ``Retry-After`` in seconds (None when it sent none)."""

    error_type = ErrorType.DEPENDENCY

    def __init__(
        self,
        cause: DependencyCause,
        message: str,
        *,
        dependency: str = "",
        retry_after_s: float | None = None,
        **fields: Any,
    ) -> None:
        super().__init__(cause, message, **fields)
        self.dependency = dependency
        self.retry_after_s = retry_after_s

    def details(self) -> dict[str, Any]:
        return {**super().details(), "dependency": self.dependency}


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input: where it is and what to do."""

    file: str
    message: str
    line: int | None = None
    field: str | None = None

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
        if self.field:
            where += f" [{self.field}]"
        return f"{where}: {self.message}"


class DataError(PlugtuneError):
    """Base for input problems; carries every problem found, not only the first."""

    error_type = ErrorType.INVALID_VALUE

    def __init__(self, problems: list[Problem], *, cause: str = "") -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        n = len(self.problems)
        super().__init__(f"{n} problem{'s' if n != 1 else ''} found:\n{lines}", cause=cause)

    def details(self) -> dict[str, Any]:
        return {"problems": [p.__dict__ for p in self.problems]}


class InvalidDataError(DataError):
    """Raised when a data path is missing, or a file is absent, unreadable or empty."""

    error_type = ErrorType.INVALID_DATA


class InvalidValueError(DataError):
    """Raised when a value is malformed: bad JSON, a missing/unknown key, a wrong type, a bad setting."""

    error_type = ErrorType.INVALID_VALUE


class LossNanError(PlugtuneError):
    """Raised by the trainer when the loss or a gradient is non-finite; the step is not applied."""

    error_type = ErrorType.LOSS_NAN

    def __init__(
        self, message: str, *, step: int, stats: dict[str, float], trajectory_ids: list[str]
    ) -> None:
        super().__init__(message, cause="non-finite loss")
        self.step = step
        self.stats = dict(stats)
        self.trajectory_ids = list(trajectory_ids)

    def details(self) -> dict[str, Any]:
        return {"step": self.step, "stats": self.stats, "trajectory_ids": self.trajectory_ids}


def reported_status(
    status: str,
    plugin: str,
    reason: str | None,
    *,
    call_id: str = "",
    trajectory_id: str = "",
    attempt: int = 1,
) -> ErrorRecord:
    """The record of a call in which ``plugin`` itself reported ``Status.FAILURE`` or ``Status.RETRY``
    (``status`` is the status's value): the same cause, message and hint for every trainer."""
    cause = StatusCause.FAILURE if status == "failure" else StatusCause.RETRY
    return ErrorRecord(
        type=ErrorType.CALL_PLUGIN.value,
        owner=Owner.PLUGIN.value,
        cause=cause.value,
        message=f"{plugin} returned Status.{status.upper()}; its reason: {reason or '(none given)'}",
        hint=HINTS[cause],
        plugin=plugin,
        call_id=call_id,
        trajectory_id=trajectory_id,
        attempt=attempt,
    )


def discarded_by(plugin: str, reason: str | None) -> str:
    """A trajectory's ``discard_reason`` when ``plugin`` returned ``Status.DISCARD``."""
    return f"{plugin} discarded it (Status.DISCARD): {reason or '(no reason given)'}"
