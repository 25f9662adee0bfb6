"""``JobSpec``: the typed ``job.yaml`` — the single source for validation, CLI help and the console.

Every field carries a description; :func:`spec_reference` turns the model into rows a CLI or a
web page can print. Paths in the spec are relative to the folder that holds ``job.yaml``.
``model: builtin:tiny-chat`` names the tiny demo model packaged with plugtune.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from plugtune.runtime.dependencies import LIMITS as DEPENDENCY_LIMITS
from plugtune.runtime.dependencies import NAME as DEPENDENCY_NAME
from plugtune.runtime.dependencies import Dependency, parse_target
from plugtune.sdk.runtime_spec import LIMITS, Runtime
from plugtune.trainer.config import TrainerConfig
from plugtune.trainer.draft import GroupRule
from plugtune.trainer.health import SignalThresholds
from plugtune.trainer.tasks import DEFAULT_TASK as _DEFAULT_TASK

#: The rollout used when ``plugins.rollout`` is absent: one chat call, the reply is the trajectory.
BUILTIN_ROLLOUT = "plugtune.jobs.builtin_rollout:single_turn"

#: ``model: builtin:<name>`` shorthands, resolved inside the installed package.
BUILTIN_MODEL_PREFIX = "builtin:"
BUILTIN_MODELS: dict[str, tuple[str, ...]] = {"tiny-chat": ("demo", "model")}

#: ``file.py:function`` — the file relative to job.yaml, the function defined at its top level.
ENTRY_PATTERN = re.compile(r"^(?P<file>[^:]+\.py):(?P<function>[A-Za-z_][A-Za-z0-9_]*)$")

#: A plugin's ``name:`` in job.yaml: it keys reward components, metrics and logs.
PLUGIN_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]*$"

_STRICT = ConfigDict(extra="forbid", strict=True, validate_default=True)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


#: Variables that make a dynamic loader, glibc, an interpreter or a shell load code or files, or that
#: the runtime sets itself: a job may not set them (``env``) or import them (``secrets``). The
#: exact names, then prefixes; the glibc names are its list of variables unsafe for set-uid programs.
LOADER_VARIABLES = frozenset(
    {
        "GCONV_PATH", "GETCONF_DIR", "GLIBC_TUNABLES", "HOSTALIASES", "LOCALDOMAIN", "LOCPATH",
        "NIS_PATH", "NLSPATH", "RES_OPTIONS", "TZDIR", "TMPDIR", "HOME", "PATH",
        "BASH_ENV", "SHELLOPTS", "BASHOPTS", "PS4", "NODE_OPTIONS", "NODE_PATH",
        "RUBYOPT", "RUBYLIB", "PERLLIB", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS",
        "CLASSPATH",
    }
)  # fmt: skip
LOADER_PREFIXES = ("LD_", "PYTHON", "MALLOC_", "RESOLV_", "PERL5", "OPENSSL_", "BASH_FUNC_")
#: PYTHON* variables that load nothing (hash seed, buffering, encodings) and stay allowed.
HARMLESS_PYTHON = frozenset(
    {"PYTHONHASHSEED", "PYTHONUNBUFFERED", "PYTHONIOENCODING", "PYTHONDONTWRITEBYTECODE", "PYTHONUTF8"}
)


def is_loader_variable(name: str) -> bool:
    """Does ``name`` steer what a loader, libc, an interpreter or a shell loads (or does the runtime
    set it)? Such a variable is never taken from a job."""
    if name in HARMLESS_PYTHON:
        return False
    return name in LOADER_VARIABLES or name.startswith(LOADER_PREFIXES)


def check_env_name(name: str) -> str:
    """``name`` when a job may set or import it; ValueError saying why not."""
    if not _ENV_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not an environment variable name (letters, digits, _)")
    if name.startswith("PLUGTUNE_"):
        raise ValueError(
            f"variables named PLUGTUNE_* are the platform's and never reach plugins: rename {name}"
        )
    if is_loader_variable(name):
        raise ValueError(
            f"the variable {name} is refused: it changes what the dynamic loader, libc, Python or a "
            "shell loads (or the runtime sets it), so a job may not set it; remove it, and set what "
            "the plugin needs in its code (os.environ, sys.path) or ship the file in the plugin's folder"
        )
    return name


EnvName = Annotated[str, AfterValidator(check_env_name)]


class RuntimeOverrides(BaseModel):
    """Runtime settings for one plugin; each one given here overrides the decorator's ``Runtime``."""

    model_config = _STRICT

    memory_mb: int | None = Field(
        default=None,
        ge=LIMITS["memory_mb"][0],
        le=LIMITS["memory_mb"][1],
        description="Memory limit per instance (MiB); going over it is `FaaS OOM`.",
    )
    timeout_s: float | None = Field(
        default=None,
        ge=LIMITS["timeout_s"][0],
        le=LIMITS["timeout_s"][1],
        description="Wall-clock limit per call (s); going over it is `Timeout`.",
    )
    max_concurrency: int | None = Field(
        default=None,
        ge=LIMITS["max_concurrency"][0],
        le=LIMITS["max_concurrency"][1],
        description="Calls one instance runs at once (event-loop tasks for async, threads for sync).",
    )
    min_instances: int | None = Field(
        default=None,
        ge=LIMITS["min_instances"][0],
        le=LIMITS["min_instances"][1],
        description="Instances kept warm.",
    )
    max_instances: int | None = Field(
        default=None,
        ge=LIMITS["max_instances"][0],
        le=LIMITS["max_instances"][1],
        description="Most instances the autoscaler starts.",
    )
    cpu: float | None = Field(
        default=None, ge=LIMITS["cpu"][0], le=LIMITS["cpu"][1], description="CPU quota per instance (cores)."
    )
    tmp_mb: int | None = Field(
        default=None,
        ge=LIMITS["tmp_mb"][0],
        le=LIMITS["tmp_mb"][1],
        description="Private temp space per instance (MiB; $TMPDIR and $HOME); full is `FaaS disk limit`.",
    )
    max_pids: int | None = Field(
        default=None,
        ge=LIMITS["max_pids"][0],
        le=LIMITS["max_pids"][1],
        description="Processes and threads the plugin may start per instance; more is `FaaS pids limit`.",
    )
    network: Literal["none", "policy-only", "any"] | None = Field(
        default=None,
        description="What the instances can reach: `policy-only` (the policy gateway and the job's "
        "`dependencies:` only; the default), `none` (nothing but their own loopback) or `any` (the "
        "host's network).",
    )

    @model_validator(mode="after")
    def _instances_ordered(self) -> RuntimeOverrides:
        if self.min_instances is not None and self.max_instances is not None:
            if self.min_instances > self.max_instances:
                raise ValueError(
                    f"min_instances={self.min_instances} is larger than max_instances={self.max_instances}"
                )
        return self

    def given(self) -> dict[str, Any]:
        """Only the settings written in job.yaml."""
        return self.model_dump(exclude_none=True)


def _check_target(value: str) -> str:
    parse_target(value)  # a ValueError saying what a valid address looks like
    return value.strip()


def _check_dependency_name(value: str) -> str:
    if not DEPENDENCY_NAME.match(value):
        raise ValueError(
            f"dependency name {value!r} must start with a letter and hold only letters, digits, _ and - "
            "(at most 64)"
        )
    return value


DependencyName = Annotated[str, AfterValidator(_check_dependency_name)]
Target = Annotated[str, AfterValidator(_check_target)]


class DependencySpec(BaseModel):
    """A service the job's plugins call (LLM judge, API, sandbox): under `network: policy-only`
    the instances reach it (and the policy gateway) only; a call failed on it is a `Dependency error`."""

    model_config = _STRICT

    url: Target = Field(
        ...,
        description="Where it is: a URL (http://127.0.0.1:8000/v1, https://api.example.com) or host:port.",
    )
    rpm: int | None = Field(
        default=None,
        ge=DEPENDENCY_LIMITS["rpm"][0],
        le=DEPENDENCY_LIMITS["rpm"][1],
        description="Connections per minute its plugins may open to it, all instances and plugins of "
        "the job together (under network policy-only; a kept-alive connection's later requests are "
        "not counted).",
    )
    concurrency: int | None = Field(
        default=None,
        ge=DEPENDENCY_LIMITS["concurrency"][0],
        le=DEPENDENCY_LIMITS["concurrency"][1],
        description="Connections open to it at once (under HTTP/1.1: requests in flight), all "
        "instances and plugins of the job together (under network policy-only); a 429 halves it "
        "until calls succeed again.",
    )
    timeout_s: float | None = Field(
        default=None,
        ge=DEPENDENCY_LIMITS["timeout_s"][0],
        le=DEPENDENCY_LIMITS["timeout_s"][1],
        description="How long a request waits for its reply to begin (under network policy-only, "
        "enforced by the runtime whatever the plugin's client waits: past it the call fails as a "
        "Dependency error, cause timeout).",
    )

    @field_validator("timeout_s", mode="before")
    @classmethod
    def _whole_seconds(cls, value: Any) -> Any:
        return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


class DataSpec(BaseModel):
    """Dataset files (JSON Lines: one ``{"messages", "tools", "extra"}`` object per line)."""

    model_config = _STRICT

    train: str = Field(..., min_length=1, description="Training rows (.jsonl), relative to job.yaml.")
    validation: str | None = Field(
        default=None, min_length=1, description="Optional held-out rows (.jsonl), relative to job.yaml."
    )


class EvalSpec(BaseModel):
    """How ``data.validation`` is evaluated: before step 1 (as step 0), every
    ``hyperparameters.eval_every_n_steps`` and at the end."""

    model_config = _STRICT

    k: int = Field(
        default=4,
        ge=1,
        le=1024,
        description="pass@k: the chance that one of k replies sampled at the job's temperature passes "
        "(`eval/pass@k`); pass@1 (`eval/pass@1`) is always measured on one greedy reply.",
    )
    samples: int | None = Field(
        default=None,
        ge=0,
        le=1024,
        description="Replies sampled per row for pass@k (n >= k; default k; more gives an unbiased "
        "estimate with less variance; 0 = greedy replies only, no pass@k).",
    )
    pass_threshold: float = Field(
        default=1.0,
        allow_inf_nan=False,
        description="A reply passes when its reward is at least this (1.0: an exact-match grader's "
        "full mark).",
    )

    @model_validator(mode="after")
    def _enough_samples(self) -> EvalSpec:
        if self.samples and self.samples < self.k:
            raise ValueError(f"samples={self.samples} is fewer than k={self.k}: pass@k needs n >= k samples")
        return self

    def sample_count(self) -> int:
        """n: the replies sampled per row (``samples``, or ``k`` when not given)."""
        return self.k if self.samples is None else self.samples


class WandbSpec(BaseModel):
    """A Weights & Biases run, offline (``jobs/ID/wandb``; upload it later with ``wandb sync``)."""

    model_config = _STRICT

    project: str = Field(..., min_length=1, max_length=128, description="W&B project of the run.")

    @field_validator("project")
    @classmethod
    def _wandb_installed(cls, value: str) -> str:
        import importlib.util

        if importlib.util.find_spec("wandb") is None:
            raise ValueError("tracking.wandb needs wandb installed: pip install -e '.[tracking]'")
        return value


class OtlpSpec(BaseModel):
    """An OpenTelemetry collector that receives one span per plugin call over OTLP/HTTP."""

    model_config = _STRICT

    endpoint: str = Field(
        ...,
        pattern=r"^https?://[^\s/]+(/\S*)?$",
        description="The collector's OTLP/HTTP URL, e.g. http://127.0.0.1:4318 (/v1/traces is added "
        "unless the URL ends with it).",
    )

    @field_validator("endpoint")
    @classmethod
    def _exporter_installed(cls, value: str) -> str:
        import importlib.util

        if importlib.util.find_spec("opentelemetry.exporter.otlp.proto.http") is None:
            raise ValueError("tracking.otlp needs the OTLP exporter installed: pip install -e '.[tracking]'")
        return value


class TrackingSpec(BaseModel):
    """Trackers besides the console: TensorBoard event files are always written (``jobs/ID/tensorboard``)."""

    model_config = _STRICT

    wandb: WandbSpec | None = Field(default=None, description="Log the metrics to W&B, offline.")
    otlp: OtlpSpec | None = Field(default=None, description="Export a span per plugin call over OTLP.")


class RolloutEntry(BaseModel):
    """The job's rollout plugin."""

    model_config = _STRICT

    entry: str = Field(..., description="`file.py:function`, the file relative to job.yaml.")
    runtime: RuntimeOverrides | None = Field(
        default=None, description="Overrides of the decorator's Runtime."
    )


class GraderEntry(BaseModel):
    """One grader (or group grader) plugin."""

    model_config = _STRICT

    entry: str = Field(..., description="`file.py:function`, the file relative to job.yaml.")
    name: str | None = Field(
        default=None,
        pattern=PLUGIN_NAME_PATTERN,
        max_length=100,
        description=(
            "The name its rewards, metrics and logs are keyed by (default: the function's name); "
            "needed when two plugins' functions share a name."
        ),
    )
    weight: float | None = Field(
        default=None, gt=0, description="Weight in the summed reward (> 0); default: the decorator's weight."
    )
    runtime: RuntimeOverrides | None = Field(
        default=None, description="Overrides of the decorator's Runtime."
    )
    shape: Literal["trl", "trl-text", "verl"] | None = Field(
        default=None,
        description="The entry is a TRL (`trl`, `trl-text`: completions as strings) or verl (`verl`: "
        "compute_score) reward function, undecorated, used as it is (as `@grader(shape=...)`, or "
        "`@group_grader(shape=...)` under group_graders, would).",
    )


class PluginsSpec(BaseModel):
    """Which plugins the job calls."""

    model_config = _STRICT

    rollout: RolloutEntry | None = Field(
        default=None,
        description=f"The rollout; without one the built-in single-turn rollout ({BUILTIN_ROLLOUT}) is used.",
    )
    graders: list[GraderEntry] = Field(default_factory=list, description="Graders scoring each trajectory.")
    group_graders: list[GraderEntry] = Field(
        default_factory=list, description="Graders scoring a prompt's whole group of trajectories at once."
    )
    runtime_backend: Literal["local", "ray"] = Field(
        default="local",
        description="Where plugin instances run: `local` processes on this machine, or `ray` actors on "
        "the cluster at $PLUGTUNE_RAY_ADDRESS (unset: a local Ray head for the job); needs "
        "pip install -e '.[ray]'.",
    )

    @field_validator("runtime_backend")
    @classmethod
    def _ray_installed(cls, value: str) -> str:
        import importlib.util

        if value == "ray" and importlib.util.find_spec("ray") is None:
            raise ValueError("runtime_backend: ray needs Ray installed: pip install -e '.[ray]'")
        return value


#: The task of dataset rows without ``task:``: the top-level ``plugins``; no ``tasks:`` entry may take it.
DEFAULT_TASK = _DEFAULT_TASK


def _check_task_name(value: str) -> str:
    if not re.fullmatch(PLUGIN_NAME_PATTERN, value) or len(value) > 64:
        raise ValueError(
            f"task name {value!r} must start with a letter or _ and hold only letters, digits, _ . - "
            "(at most 64)"
        )
    if value == DEFAULT_TASK:
        raise ValueError(
            f"the task {DEFAULT_TASK!r} is the top-level plugins' (rows without task:); "
            "name this one otherwise"
        )
    return value


TaskName = Annotated[str, AfterValidator(_check_task_name)]


class TaskPluginEntry(BaseModel):
    """A plugin of a task: a job plugin's name (``- exact``, or ``use: exact``: one of ``plugins:`` or
    of another task, the same deployed plugin), or an entry of its own, as under ``plugins:``."""

    model_config = _STRICT

    use: str | None = Field(
        default=None,
        pattern=PLUGIN_NAME_PATTERN,
        max_length=100,
        description="The name of a plugin the job already lists (under plugins or another task).",
    )
    entry: str | None = Field(default=None, description="`file.py:function`, the file relative to job.yaml.")
    name: str | None = Field(
        default=None,
        pattern=PLUGIN_NAME_PATTERN,
        max_length=100,
        description="The name its rewards, metrics and logs are keyed by (default: the function's name); "
        "unique in the job.",
    )
    weight: float | None = Field(
        default=None, gt=0, description="Weight in the summed reward (> 0); default: the decorator's weight."
    )
    runtime: RuntimeOverrides | None = Field(
        default=None, description="Overrides of the decorator's Runtime."
    )
    shape: Literal["trl", "trl-text", "verl"] | None = Field(
        default=None, description="As under plugins.graders: an undecorated TRL or verl reward function."
    )

    @model_validator(mode="after")
    def _use_or_entry(self) -> TaskPluginEntry:
        if (self.use is None) == (self.entry is None):
            raise ValueError("give a plugin's name (use: NAME, or just NAME) or an entry: file.py:function")
        if self.use is not None and self.model_fields_set - {"use"}:
            extra = ", ".join(sorted(self.model_fields_set - {"use"}))
            raise ValueError(
                f"use: names a plugin as the job already lists it; {extra} cannot be set here (set them "
                "where it is listed, or give an entry of its own)"
            )
        return self


def _named(value: Any) -> Any:
    return {"use": value} if isinstance(value, str) else value


class TaskSpec(BaseModel):
    """The plugin set of one task: the dataset rows whose ``task:`` names it are rolled out and
    graded by these."""

    model_config = _STRICT

    rollout: TaskPluginEntry | None = Field(
        default=None, description="The task's rollout (default: plugins.rollout, else the built-in one)."
    )
    graders: list[TaskPluginEntry] = Field(
        default_factory=list, description="Graders scoring each of the task's trajectories."
    )
    group_graders: list[TaskPluginEntry] = Field(
        default_factory=list, description="Graders scoring a group of the task's trajectories at once."
    )

    @field_validator("rollout", mode="before")
    @classmethod
    def _rollout_by_name(cls, value: Any) -> Any:
        return _named(value)

    @field_validator("graders", "group_graders", mode="before")
    @classmethod
    def _graders_by_name(cls, value: Any) -> Any:
        return [_named(v) for v in value] if isinstance(value, list) else value

    @model_validator(mode="after")
    def _some_grader(self) -> TaskSpec:
        if not self.graders and not self.group_graders:
            raise ValueError("a task needs at least one grader or group grader to compute its reward")
        if self.rollout is not None and (self.rollout.weight is not None or self.rollout.shape is not None):
            raise ValueError("a rollout has no weight or shape (those are a grader's)")
        return self


class DependencyRetry(BaseModel):
    """How a call that failed on a service its plugin calls (a `Dependency error`: 429, 5xx,
    unreachable, timeout, bad reply) is retried: on the same instance (it is fine), after an
    exponential backoff with jitter that is never shorter than the service's `Retry-After`."""

    model_config = _STRICT

    max_attempts: int = Field(
        default=5,
        ge=1,
        le=1000,
        description="Tries per call that fails on a dependency (the first included); not counted "
        "while the dependency is down (down_after_s): then the call waits, up to max_wait_s.",
    )
    backoff_s: float = Field(
        default=0.5,
        gt=0,
        le=3600,
        description="Wait before the first retry; doubled after each failed try (up to max_backoff_s), "
        "each wait drawn between half and all of it (jitter), and at least the reply's Retry-After.",
    )
    max_backoff_s: float = Field(
        default=30.0, gt=0, le=3600, description="Longest wait between two tries (a longer Retry-After wins)."
    )
    down_after_s: float = Field(
        default=10.0,
        ge=0,
        le=86_400,
        description="A dependency whose calls have all failed for this long is down: the job says it "
        "is waiting for it (`plugtune run`'s bar, the job's log) until a call on it succeeds.",
    )
    max_wait_s: float = Field(
        default=120.0,
        ge=0,
        le=7 * 86_400,
        description="A call stops retrying once its tries and waits on the dependency took this long; "
        "the job then fails as the dependency's (owner dependency) and is retried automatically "
        "like a platform error (`retry:`).",
    )


class GroupPolicy(BaseModel):
    """Which prompt groups train when some of their trajectories failed or were not scored (the
    same on plugtune's trainer and TRL). A dropped group's trajectories that succeeded are recorded
    `discard`, saying why; each step counts the groups dropped (`groups/dropped_by_rule`)."""

    model_config = _STRICT

    drop: Literal["trajectory", "group"] = Field(
        default="trajectory",
        description="A trajectory that failed and was dropped (on_exhausted: drop_sample) leaves its "
        "group, whose other trajectories train (`trajectory`), or drops its whole group (`group`).",
    )
    min_scored: int = Field(
        default=0,
        ge=0,
        le=100_000,
        description="Drop a group with fewer scored trajectories (succeeded, with a reward) than this "
        "(0: no minimum).",
    )

    def rule(self) -> GroupRule:
        """The rule as the trainer takes it."""
        return GroupRule(drop=self.drop, min_scored=self.min_scored)


#: The causes of a failed plugin call that ``failure_policy.by_cause`` may set (a Create faas fault
#: is never retried: the same code fails again; a Dependency error has ``failure_policy.dependency``).
CALL_CAUSES = (
    "Timeout",
    "EOF",
    "500",
    "FaaS OOM",
    "FaaS pids limit",
    "FaaS disk limit",
    "Invalid reward",
    "Status failure",
    "Status retry",
)
CallCause = Literal[
    "Timeout",
    "EOF",
    "500",
    "FaaS OOM",
    "FaaS pids limit",
    "FaaS disk limit",
    "Invalid reward",
    "Status failure",
    "Status retry",
]
MAX_BACKOFF_S = 60.0  # the longest wait between a call's tries, whatever backoff_s doubles to


class CallPolicy(BaseModel):
    """What happens to some failed calls (a cause's, a plugin's): each field left out keeps the value
    of the policy above it (the plugin's, then the job's ``by_cause``, then the job's)."""

    model_config = _STRICT

    max_attempts: int | None = Field(default=None, ge=1, le=100, description="Tries per call.")
    on_exhausted: Literal["fail_job", "drop_sample"] | None = Field(
        default=None, description="After the last try: fail the job, or drop the sample and count it."
    )
    backoff_s: float | None = Field(
        default=None,
        ge=0,
        le=3600,
        allow_inf_nan=False,
        description="Seconds before the second try, doubled for each later one (at most 60 s, with "
        "jitter in its upper half); 0 retries at once.",
    )


class PluginPolicy(CallPolicy):
    """A plugin's own failure policy (``failure_policy.plugins.<name>``), with its own ``by_cause``."""

    by_cause: dict[CallCause, CallPolicy] = Field(
        default_factory=dict, description="Overrides for this plugin's calls that failed with a cause."
    )


class FailurePolicy(BaseModel):
    """What happens when a plugin call fails (status `failure` or an exception)."""

    model_config = _STRICT

    max_attempts: int = Field(
        default=3, ge=1, le=100, description="Tries per call (each on a fresh instance)."
    )
    on_exhausted: Literal["fail_job", "drop_sample"] = Field(
        default="fail_job", description="After the last try: fail the job, or drop the sample and count it."
    )
    backoff_s: float = Field(
        default=0.0,
        ge=0,
        le=3600,
        allow_inf_nan=False,
        description="Seconds before a failed call's second try, doubled for each later one (at most "
        "60 s, with jitter in its upper half); 0 retries at once.",
    )
    by_cause: dict[CallCause, CallPolicy] = Field(
        default_factory=dict,
        description="Overrides for calls that failed with a cause (`Timeout`, `EOF`, `500`, `FaaS OOM`, "
        "`FaaS pids limit`, `FaaS disk limit`, `Invalid reward`, `Status failure`, `Status retry`), "
        "e.g. `Timeout: {max_attempts: 1, on_exhausted: drop_sample}`.",
    )
    plugins: dict[str, PluginPolicy] = Field(
        default_factory=dict,
        description="Overrides for one plugin's calls, by its name in the job (its `name:`, else its "
        "function), each with its own `by_cause`.",
    )
    dependency: DependencyRetry = Field(
        default_factory=DependencyRetry,
        description="Calls that failed on a declared service (Dependency error): retried apart from "
        "max_attempts, with backoff, and not counted by the circuit breaker.",
    )
    group: GroupPolicy = Field(
        default_factory=GroupPolicy,
        description="The group rule: drop a failed trajectory or its whole group, or keep a group only "
        "with at least min_scored scored trajectories.",
    )

    def for_call(self, plugin: str, cause: str) -> FailurePolicy:
        """The policy for a call of ``plugin`` that failed with ``cause``: for each of
        ``max_attempts``, ``on_exhausted`` and ``backoff_s``, the first set of the plugin's
        ``by_cause``, the plugin's own, the job's ``by_cause``, the job's."""
        own = self.plugins.get(plugin)
        layers: list[CallPolicy] = []
        if own is not None:
            layers += [p for p in (own.by_cause.get(cause),) if p is not None] + [own]  # type: ignore[call-overload]
        layers += [p for p in (self.by_cause.get(cause),) if p is not None]  # type: ignore[call-overload]
        if not layers:
            return self
        update: dict[str, Any] = {}
        for key in ("max_attempts", "on_exhausted", "backoff_s"):
            for layer in layers:
                value = getattr(layer, key)
                if value is not None:
                    update[key] = value
                    break
        return self.model_copy(update=update) if update else self

    def backoff(self, tries: int, draw: float) -> float:
        """Seconds to wait after the ``tries``-th try failed (``draw`` in [0, 1): the jitter)."""
        if self.backoff_s <= 0:
            return 0.0
        step = min(self.backoff_s * 2 ** min(tries - 1, 30), MAX_BACKOFF_S)
        return step * (0.5 + 0.5 * draw)


class RetryPolicy(BaseModel):
    """Automatic retries of the whole job after a platform error (resumed from the last checkpoint)."""

    model_config = _STRICT

    platform_delay_s: float = Field(
        default=900.0, ge=0, le=7 * 86_400, description="Seconds to wait before a retry."
    )
    max_auto_retries: int = Field(
        default=3, ge=0, le=100, description="Automatic retries before the job stops."
    )


class CircuitBreaker(BaseModel):
    """Stop early when plugins fail for most of a step's calls, instead of burning compute."""

    model_config = _STRICT

    max_error_share: float = Field(
        default=0.5, gt=0, le=1.0, description="Trip when failed calls exceed this share of a step's calls."
    )
    min_calls: int = Field(
        default=8, ge=1, le=1_000_000, description="Calls a step needs before the breaker may trip."
    )


class SignalSpec(BaseModel):
    """When the reward-signal health checks warn (each warning is also a per-step metric; see
    the docs, plugins/policy.md: Reward signal health). A check looks at the last 10 steps (all of
    a shorter run's)."""

    model_config = _STRICT

    unscorable_share: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="Warn (`unscorable`) when a grader returns None for more than this share of the "
        "successful trajectories it scores (metric `grader/<name>/unscorable_share`).",
    )
    saturation_steps: int = Field(
        default=5,
        ge=1,
        le=10_000,
        description="Warn (`saturated`) when the reward sits at its ceiling (or floor) for this many "
        "steps in a row (metrics `reward/at_ceiling_share`, `reward/at_floor_share`).",
    )
    saturation_share: float = Field(
        default=0.95,
        gt=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="A step sits at the ceiling (floor) when at least this share of its scored "
        "trajectories got the ceiling (floor) reward.",
    )
    reward_floor: float | None = Field(
        default=None,
        allow_inf_nan=False,
        description="The lowest reward the graders can give (default: the lowest this run has scored).",
    )
    reward_ceiling: float | None = Field(
        default=None,
        allow_inf_nan=False,
        description="The highest reward the graders can give (default: the highest this run has scored).",
    )

    dominant_share: float = Field(
        default=0.9,
        gt=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="Warn (`dominant_component`) when one grader carries more than this share of the "
        "final reward's variance within groups, with two graders or more (metric "
        "`reward/<grader>/variance_share`).",
    )

    length_rise: float = Field(
        default=0.2,
        gt=0.0,
        le=100.0,
        allow_inf_nan=False,
        description="Warn (`length_hacking`) when, between the halves of the last 10 steps, the replies "
        "grew by this share or more (0.2: 20% longer; metric `response_length`) while the mean reward "
        "fell by `reward_drop` of its range.",
    )
    reward_drop: float = Field(
        default=0.1,
        gt=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="The fall of the mean reward (a share of the reward's range over the same steps; "
        "metric `reward/mean`) that, with replies grown by `length_rise`, makes `length_hacking` warn.",
    )

    eval_drop: float = Field(
        default=0.05,
        gt=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="Warn (`eval_divergence`, or `length_hacking` when the greedy replies grew by "
        "`length_rise`) when eval pass@1 fell by at least this much in all (and by more than twice "
        "its standard error) over `eval_falls` evaluations while the train reward did not fall.",
    )
    eval_falls: int = Field(
        default=2,
        ge=1,
        le=1000,
        description="How many evaluations in a row must each score a lower pass@1 than the one before "
        "(1: any single fall; 2, the default, lets the early dip many runs have pass).",
    )

    @field_validator("reward_floor", "reward_ceiling", mode="before")
    @classmethod
    def _whole_reward(cls, value: Any) -> Any:
        return float(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @model_validator(mode="after")
    def _floor_below_ceiling(self) -> SignalSpec:
        low, high = self.reward_floor, self.reward_ceiling
        if low is not None and high is not None and low >= high:
            raise ValueError(f"reward_floor {low:g} must be below reward_ceiling {high:g}")
        return self

    def thresholds(self) -> SignalThresholds:
        """The thresholds as the trainer takes them."""
        return SignalThresholds(**self.model_dump())


class JobSpec(BaseModel):
    """A training job, as written in ``job.yaml``."""

    model_config = _STRICT

    name: str = Field(
        default=...,
        min_length=1,
        max_length=100,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Job name (letters, digits, . _ -).",
    )
    model: str = Field(
        default=...,
        min_length=1,
        description="Local Hugging Face model folder (relative to job.yaml), or `builtin:tiny-chat`.",
    )
    algorithm: Literal["grpo"] = Field(default="grpo", description="Training algorithm.")
    trainer: Literal["plugtune", "trl"] = Field(
        default="plugtune",
        description="Which engine trains: `plugtune` (the embedded GRPO trainer) or `trl` (TRL's "
        "GRPOTrainer, with the plugins in plugtune's runtime; needs pip install -e '.[trl]'). verl runs "
        "from its own launcher (see the docs, scaling/verl.md).",
    )
    hyperparameters: TrainerConfig = Field(
        default_factory=TrainerConfig,
        description="GRPO training settings; names, defaults, ranges and docs come from TrainerConfig.",
    )
    data: DataSpec = Field(..., description="Dataset files.")
    plugins: PluginsSpec = Field(..., description="Rollout and grader plugins.")
    env: dict[EnvName, str] = Field(
        default_factory=dict,
        description="Variables every plugin instance gets (plain values, stored with the job: put "
        "keys and tokens in `secrets`).",
    )
    secrets: list[EnvName] = Field(
        default_factory=list,
        description="Names of variables copied into every plugin instance from the environment of the "
        "process that runs the job (`plugtune run`'s shell, or `plugtune serve`'s); never stored. A "
        "name not set there fails the job as Invalid value.",
    )
    dependencies: dict[DependencyName, DependencySpec] = Field(
        default_factory=dict,
        description="Services the plugins call (LLM judge, API): name -> URL or host:port, or "
        "{url, rpm, concurrency, timeout_s}. Under `network: policy-only` the instances reach these "
        "and the policy gateway only; a call failed on one is a `Dependency error` (owner dependency).",
    )
    failure_policy: FailurePolicy = Field(default_factory=FailurePolicy, description="Plugin call failures.")
    retry: RetryPolicy = Field(default_factory=RetryPolicy, description="Automatic job retries.")
    circuit_breaker: CircuitBreaker = Field(
        default_factory=CircuitBreaker,
        description="Early stop on plugin errors.",
    )
    tracking: TrackingSpec = Field(
        default_factory=TrackingSpec,
        description="Metric trackers and plugin-call traces (TensorBoard always).",
    )
    eval: EvalSpec = Field(
        default_factory=EvalSpec,
        description="Evaluation of data.validation (used only when data.validation is given).",
    )
    signal: SignalSpec = Field(
        default_factory=SignalSpec,
        description="Thresholds of the reward-signal health warnings.",
    )
    tasks: dict[TaskName, TaskSpec] = Field(
        default_factory=dict,
        description="Multi-task jobs: task name -> its plugin set ({rollout, graders, group_graders}; "
        "a plugin is an entry or the name of one the job lists). A dataset row's `task:` picks the set "
        "that scores it; rows without one use `plugins` (the task `default`). Each task's reward, "
        "failures and signal health are measured apart (metrics task/<name>/...).",
    )

    def declared(self) -> tuple[Dependency, ...]:
        """``dependencies:`` as the runtime takes them."""
        out = []
        for name, spec in self.dependencies.items():
            host, port = parse_target(spec.url)
            out.append(Dependency(name, spec.url, host, port, spec.rpm, spec.concurrency, spec.timeout_s))
        return tuple(out)

    @field_validator("dependencies", mode="before")
    @classmethod
    def _url_shorthand(cls, value: Any) -> Any:
        if isinstance(value, dict):  # `judge: http://...` is `judge: {url: http://...}`
            return {k: {"url": v} if isinstance(v, str) else v for k, v in value.items()}
        return value

    @field_validator("trainer")
    @classmethod
    def _trl_installed(cls, value: str) -> str:
        import importlib.util

        if value == "trl" and importlib.util.find_spec("trl") is None:
            raise ValueError("trainer: trl needs TRL installed: pip install -e '.[trl]'")
        return value

    @model_validator(mode="after")
    def _some_grader(self) -> JobSpec:
        if not self.plugins.graders and not self.plugins.group_graders and not self.tasks:
            raise ValueError(
                "plugins: at least one grader or group grader is needed to compute a reward (a multi-task "
                "job may leave them out when every dataset row names one of its tasks:)"
            )
        return self

    def has_default_graders(self) -> bool:
        """Whether rows without ``task:`` can be scored: ``plugins`` has a grader or group grader."""
        return bool(self.plugins.graders or self.plugins.group_graders)

    @field_validator("model")
    @classmethod
    def _known_builtin(cls, model: str) -> str:
        name = model[len(BUILTIN_MODEL_PREFIX) :] if model.startswith(BUILTIN_MODEL_PREFIX) else None
        if name is not None and name not in BUILTIN_MODELS:
            known = ", ".join(BUILTIN_MODEL_PREFIX + k for k in BUILTIN_MODELS)
            raise ValueError(f"unknown builtin model {model!r}; known: {known}")
        return model

    def rollout_entry(self) -> str:
        """The rollout's entry, or the built-in single-turn rollout."""
        return self.plugins.rollout.entry if self.plugins.rollout else BUILTIN_ROLLOUT


def resolve_model(model: str, base_dir: Path) -> Path:
    """The model folder ``model`` names: a builtin shorthand, or a path relative to ``base_dir``."""
    if model.startswith(BUILTIN_MODEL_PREFIX):
        name = model[len(BUILTIN_MODEL_PREFIX) :]
        if name not in BUILTIN_MODELS:
            known = ", ".join(BUILTIN_MODEL_PREFIX + k for k in BUILTIN_MODELS)
            raise ValueError(f"unknown builtin model {model!r}; known: {known}")
        return Path(str(resources.files("plugtune").joinpath(*BUILTIN_MODELS[name])))
    return (base_dir / model).expanduser().resolve()


@dataclass(frozen=True)
class EntryRef:
    """A parsed plugin entry: a file relative to job.yaml (or a module for built-ins) and a function."""

    file: str | None
    module: str | None
    function: str


def parse_entry(entry: str) -> EntryRef:
    """Split ``file.py:function`` (or the built-in rollout's ``module:function``); ValueError if malformed."""
    if entry == BUILTIN_ROLLOUT:
        module, function = entry.split(":")
        return EntryRef(file=None, module=module, function=function)
    match = ENTRY_PATTERN.match(entry.strip())
    if match is None:
        raise ValueError(
            f"plugin entry {entry!r} must look like `file.py:function` (e.g. plugins/rollout.py:solve)"
        )
    return EntryRef(file=match["file"], module=None, function=match["function"])


def merge_runtime(decorator: Runtime, overrides: RuntimeOverrides | None) -> Runtime:
    """The plugin's effective Runtime: the decorator's, with job.yaml's settings on top."""
    if overrides is None:
        return decorator
    return decorator.replace(**overrides.given())


@dataclass(frozen=True)
class FieldDoc:
    """One row of the spec reference: a dotted path, its type, its default and what it means."""

    path: str
    type: str
    default: str
    description: str


def spec_reference(model: type[BaseModel] = JobSpec, prefix: str = "") -> list[FieldDoc]:
    """Every field of ``model`` (recursively), for CLI help and the console."""
    rows: list[FieldDoc] = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        if info.annotation is TrainerConfig:
            rows.append(FieldDoc(path, "mapping", "(section defaults)", info.description or ""))
            rows.extend(_trainer_reference(path + "."))
            continue
        nested = nested_model(info.annotation)
        default = "required" if info.is_required() else _default_text(info)
        keyed = nested is not None and getattr(info.annotation, "__origin__", None) is dict
        if keyed and nested is not None:  # a mapping of name -> section (dependencies:)
            rows.append(FieldDoc(path, f"mapping of name -> {nested.__name__}", "{}", info.description or ""))
            rows.extend(spec_reference(nested, path + ".<name>."))
            continue
        rows.append(FieldDoc(path, _type_text(info.annotation), default, info.description or ""))
        if nested is not None:
            suffix = "[]." if _is_list(info.annotation) else "."
            rows.extend(spec_reference(nested, path + suffix))
    return rows


def _trainer_reference(prefix: str) -> list[FieldDoc]:
    """The trainer's fields, each documented with its default and range (``TrainerConfig.docs``)."""
    docs, types = TrainerConfig.docs(), TrainerConfig.__annotations__  # the annotations as written
    return [
        FieldDoc(prefix + name, str(types[name]), repr(info.default), docs[name])
        for name, info in TrainerConfig.model_fields.items()
    ]


def nested_model(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside a field's annotation (``X``, ``X | None``, ``list[X]``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = nested_model(arg)
        if found is not None:
            return found
    return None


def _is_list(annotation: Any) -> bool:
    return getattr(annotation, "__origin__", None) is list


def _type_text(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    return text or str(annotation).replace("typing.", "").replace("plugtune.spec.models.", "")


def _default_text(info: Any) -> str:
    if info.default_factory is not None:
        return "(section defaults)" if nested_model(info.annotation) else "[]"
    return "none" if info.default is None else repr(info.default)
