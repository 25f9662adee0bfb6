"""How a job calls its plugins: the retry policy applied to every call, and per-step counts and
plugin metrics (every ``ctx.metric`` of the step's calls, by plugin and name).

The trainer calls ``await caller(fn, ctx, *args)``. Retries follow ``retry_policy.decide``; a
decision to fail the job raises :class:`JobStop`, which the trainer does not catch, so the
attempt ends with that classified error. A dropped sample comes back to the trainer as the
failed call (its trajectory is marked failed, left out of the loss and counted).

A call that failed on a dependency (``DependencyCallError``: the service's fault, not the plugin's)
is retried under ``failure_policy.dependency`` instead: on the same instance (``PREFER_INSTANCE``),
after an exponential backoff with jitter never shorter than the reply's ``Retry-After``, apart
from ``max_attempts``; the circuit breaker does not count it. Once its tries or ``max_wait_s`` are
used up the job fails with that error, which the scheduler retries like a platform error. A
plugin's ``Retry`` raised on a dependency's failure (the worker reads its exception chain; the
outcome's value names the dependency) gets the same backoff and bounds, then drops the sample.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from plugtune.errors import Cause, DependencyCallError, PluginCallError, StatusCause
from plugtune.jobs.plugin_metrics import MAX_NAMES, PluginMetrics
from plugtune.jobs.retry_policy import FailJob, FailureKind, RetryCall, breaker, decide, kind_of
from plugtune.runtime.backend import PREFER_INSTANCE
from plugtune.sdk import Context, Status
from plugtune.spec.models import CircuitBreaker, DependencyRetry, FailurePolicy
from plugtune.trainer.protocols import PluginFunction
from plugtune.trainer.tracking import CallSpans
from plugtune.types import CallOutcome, LogLine, MetricPoint

log = logging.getLogger(__name__)

#: Per step (the console's plugin-error curve and `plugtune run`'s progress bar read these).
FAILED_CALLS, CALLS = "plugin/failed_calls", "plugin/calls"

_STATUS_KINDS = {
    Status.FAILURE.value: (FailureKind.STATUS_FAILURE, StatusCause.FAILURE),
    Status.RETRY.value: (FailureKind.STATUS_RETRY, StatusCause.RETRY),
}


class JobStop(Exception):  # a control-flow signal, not an error of its own
    """Raised when a failed plugin call must end the job; ``error`` is the classified cause."""

    def __init__(
        self, error: PluginCallError, reason: str, ctx: Context | None = None, call_args: tuple[Any, ...] = ()
    ) -> None:
        super().__init__(f"{error} ({reason})")
        self.error = error
        self.reason = reason
        self.ctx = ctx  # the failing call, so its trajectory can be kept as evidence
        self.call_args = call_args  # what that call was given (the exception's own args stay its message)


class StepCounts:
    """One step's plugin calls, errors by cause and by plugin, the first error of each cause, and
    the ``ctx.metric`` values of its calls that replied (retried tries too)."""

    def __init__(self) -> None:
        self.calls = 0
        self.errors: Counter[str] = Counter()
        self.dependency_errors: Counter[str] = Counter()  # by cause; also in errors, not in the breaker
        self.by_plugin: Counter[str] = Counter()
        self.examples: dict[str, PluginCallError] = {}
        self.plugin_metrics = PluginMetrics()

    @property
    def worst_plugin(self) -> str:
        return self.by_plugin.most_common(1)[0][0] if self.by_plugin else ""

    def metric_points(self, step: int, prefix: str = "") -> list[MetricPoint]:
        """The step's plugin calls and failed calls (retried ones too; in all and by cause) and its
        plugin metrics (``metric/<plugin>/<name>/<stat>``), also of a step that stopped the job."""
        now, failed = time.time(), float(sum(self.errors.values()))
        for plugin, n in self.plugin_metrics.dropped.items():
            log.warning(
                "step %d: %d ctx.metric value(s) of plugin %s were left out: it used more than %d "
                "metric names in one step (use a few fixed names)",
                step,
                n,
                plugin,
                MAX_NAMES,
            )
        return [
            *self.plugin_metrics.points(step, prefix),
            MetricPoint(time=now, plugin="", name=prefix + FAILED_CALLS, value=failed, step=step),
            MetricPoint(time=now, plugin="", name=prefix + CALLS, value=float(self.calls), step=step),
            *(
                MetricPoint(time=now, plugin="", name=f"{prefix}{FAILED_CALLS}/{cause}", value=n, step=step)
                for cause, n in sorted((c, float(n)) for c, n in self.errors.items())
            ),
        ]

    def breaker_error(self, config: CircuitBreaker, poison_calls: int = 0) -> PluginCallError | None:
        """The classified error the job's circuit breaker fails the job with after these calls
        (cause: the dominant one, with its first example's evidence), or None when it holds.
        Calls that failed on a dependency are left out (of the calls too): the service's trouble is
        not the plugin's, and ``failure_policy.dependency`` bounds it. ``poison_calls``: how many of
        the failed calls were on poison rows (every trajectory of the row failed the same way), said
        in the message."""
        plugin_errors = self.errors - self.dependency_errors
        calls = self.calls - sum(self.dependency_errors.values())
        decision = breaker(calls, dict(plugin_errors), config)
        if not decision.trip:
            return None
        causes: dict[str, Cause | StatusCause] = {c.value: c for c in (*Cause, *StatusCause)}
        cause = causes.get(decision.dominant_cause or "", Cause.ERROR_500)
        example = self.examples.get(cause.value)
        return PluginCallError(
            cause,
            decision.message
            + _poison_note(poison_calls)
            + (f" First one: {example.message}" if example else ""),
            plugin=example.plugin if example else self.worst_plugin,
            call_id=example.call_id if example else "",
            trajectory_id=example.trajectory_id if example else "",
            traceback=example.traceback if example else "",
            peak_memory_mb=example.peak_memory_mb if example else None,
            code_hash=example.code_hash if example else "",
        )


def _poison_note(poison_calls: int) -> str:
    if poison_calls <= 0:
        return ""
    return (
        f" {poison_calls} of the failed calls were on dataset rows every trajectory of which failed "
        "the same way (poison rows: hyperparameters.poison_after quarantines them; `plugtune doctor` "
        "lists them)."
    )


@dataclass
class Outage:
    """A dependency whose calls have failed since ``since`` (wall clock) with no success between."""

    cause: str
    since: float

    def message(self, name: str) -> str:
        since = time.strftime("%H:%M:%S", time.localtime(self.since))
        return f"waiting for dependency {name}: {self.cause} since {since}"


class PolicyCaller:
    """Calls plugins under the job's ``failure_policy`` and counts calls and errors per step.

    Counts are kept by the step a call belongs to (``ctx.step``): the trainer starts the next
    step's rollouts while it trains on this one, so calls of two steps can be in flight at once.
    Every call (each retry too) is a span in ``spans`` when the job exports traces.
    """

    def __init__(
        self, failure: FailurePolicy, spans: CallSpans | None = None, rng: random.Random | None = None
    ) -> None:
        self.failure = failure
        self.spans = spans or CallSpans()
        self.retries = 0
        self.dependency_waited_s = 0.0  # all backoff waits of this job's calls, in seconds
        self.backoff_waited_s = 0.0  # the waits of failure_policy.backoff_s before plugins' retries
        self._rng = rng or random.Random()
        self._steps: dict[int, StepCounts] = {}
        self.outages: dict[str, Outage] = {}  # by dependency name, until a call on it succeeds

    def waiting(self, now: float | None = None) -> dict[str, Outage]:
        """The dependencies down for ``failure_policy.dependency.down_after_s`` or longer (every call
        on them failed since), which the job is waiting for."""
        now = time.time() if now is None else now
        after = self.failure.dependency.down_after_s
        return {name: o for name, o in self.outages.items() if now - o.since >= after}

    def _failed_on(self, name: str, cause: str) -> None:
        outage = self.outages.get(name)
        if outage is None:
            self.outages[name] = Outage(cause, time.time())
        else:
            outage.cause = cause

    def counts(self, step: int) -> StepCounts:
        """The counts of ``step`` so far (created empty)."""
        return self._steps.setdefault(step, StepCounts())

    def pending_steps(self) -> list[int]:
        """The steps whose counts were not taken yet, oldest first."""
        return sorted(self._steps)

    def take_counts(self, step: int) -> StepCounts:
        """The counts of ``step`` and of any earlier step not taken yet, and forget them."""
        total = StepCounts()
        for s in sorted(k for k in self._steps if k <= step):
            c = self._steps.pop(s)
            total.calls += c.calls
            total.errors.update(c.errors)
            total.dependency_errors.update(c.dependency_errors)
            total.by_plugin.update(c.by_plugin)
            for cause, error in c.examples.items():
                total.examples.setdefault(cause, error)
            total.plugin_metrics.merge(c.plugin_metrics)
        return total

    def _failed_call(self, fn: PluginFunction, ctx: Context, started_ns: int, exc: PluginCallError) -> None:
        """A try that raised: its span and its count (a dependency's failures too)."""
        name, cause = fn.spec.name, exc.cause
        self.spans.record(
            name, ctx, started_ns, status="error", cause=cause, call_id=exc.call_id, message=str(exc)
        )
        self._count_error(ctx.step, exc.plugin or name, cause, exc)

    def _count_error(self, step: int, plugin: str, cause: str, error: PluginCallError | None = None) -> None:
        counts = self.counts(step)
        counts.errors[cause] += 1
        counts.by_plugin[plugin] += 1
        if error is not None:
            counts.examples.setdefault(cause, error)

    async def _back_off(self, delay: float) -> None:
        """Wait ``failure_policy``'s backoff before a plugin's next try (counted with the waits)."""
        if delay > 0:
            await asyncio.sleep(delay)
            self.backoff_waited_s += delay

    def dependency_delay(
        self, retry_after_s: float | None, tries: int, spent_s: float, down: bool = False
    ) -> float | None:
        """Seconds to wait before retrying a call whose ``tries``-th try failed on a dependency
        (``spent_s`` since its first failure), or None when ``failure_policy.dependency`` is used up:
        ``backoff_s * 2**(tries-1)`` capped at ``max_backoff_s``, drawn in its upper half (jitter),
        at least the reply's ``Retry-After`` (``retry_after_s``). While the dependency is ``down``
        (see :meth:`waiting`) tries are not counted: the call waits, bounded by ``max_wait_s``."""
        policy: DependencyRetry = self.failure.dependency
        if tries >= policy.max_attempts and not down:
            return None
        step = min(policy.backoff_s * 2 ** min(tries - 1, 60), policy.max_backoff_s)
        delay = step * (0.5 + 0.5 * self._rng.random())
        if retry_after_s is not None:
            delay = max(delay, retry_after_s)
        if spent_s + delay > policy.max_wait_s:
            return None
        return delay

    async def __call__(self, fn: PluginFunction, ctx: Context, *args: Any) -> CallOutcome:
        attempt, plugin_try, dependency_tries = 1, 1, 0
        first_dependency_failure = 0.0
        prefer = ""  # the instance a retry after a dependency failure goes back to
        failed_on: set[str] = set()  # the dependencies this call failed on (an outage ends on success)
        while True:
            self.counts(ctx.step).calls += 1
            call_ctx, started_ns = dataclasses.replace(ctx, attempt=attempt), time.time_ns()
            token = PREFER_INSTANCE.set(prefer)
            try:
                outcome = await fn.invoke(call_ctx, *args)
            except DependencyCallError as exc:
                self._failed_call(fn, call_ctx, started_ns, exc)
                self.counts(ctx.step).dependency_errors[exc.cause] += 1
                dependency = exc.dependency or "?"
                failed_on.add(dependency)
                self._failed_on(dependency, exc.cause)
                now = time.monotonic()
                if dependency_tries == 0:
                    first_dependency_failure = now
                dependency_tries += 1
                delay = self.dependency_delay(
                    exc.retry_after_s,
                    dependency_tries,
                    now - first_dependency_failure,
                    down=dependency in self.waiting(),
                )
                if delay is None:
                    policy = self.failure.dependency
                    reason = (
                        f"dependency {dependency}: {dependency_tries} tries in "
                        f"{now - first_dependency_failure:.0f} s (failure_policy.dependency: max_attempts "
                        f"{policy.max_attempts}, max_wait_s {policy.max_wait_s:g})"
                    )
                    raise JobStop(exc, reason, ctx, args) from exc
                log.info(
                    "retrying %s in %.2f s on instance %s after dependency %s: %s (try %d)",
                    fn.spec.name,
                    delay,
                    exc.instance_id or "?",
                    dependency,
                    exc.cause,
                    attempt + 1,
                )
                await asyncio.sleep(delay)
                self.dependency_waited_s += delay
                attempt, self.retries, prefer = attempt + 1, self.retries + 1, exc.instance_id
                continue
            except PluginCallError as exc:
                self._failed_call(fn, call_ctx, started_ns, exc)
                rules = self.failure.for_call(fn.spec.name, exc.cause)
                decision = decide(kind_of(exc), plugin_try, rules)
                if isinstance(decision, RetryCall):
                    delay = rules.backoff(plugin_try, self._rng.random())
                    log.info(
                        "retrying %s after %s in %.2f s (try %d)", fn.spec.name, exc.cause, delay, attempt + 1
                    )
                    await self._back_off(delay)
                    attempt, plugin_try, self.retries = attempt + 1, decision.attempt, self.retries + 1
                    prefer = ""
                    continue
                if isinstance(decision, FailJob):
                    raise JobStop(exc, decision.reason, ctx, args) from exc
                raise  # DropSample: the trainer marks the trajectory failed and counts it
            finally:
                PREFER_INSTANCE.reset(token)
            self.spans.record(
                fn.spec.name, call_ctx, started_ns, status=outcome.status, call_id=outcome.call_id
            )
            if outcome.metrics:
                self.counts(ctx.step).plugin_metrics.add(fn.spec.name, outcome.metrics)
            if outcome.status != Status.RETRY.value:
                for name in failed_on:  # a call that failed on it went through: it is up again
                    self.outages.pop(name, None)
            reported = _STATUS_KINDS.get(outcome.status)
            if reported is None:
                return outcome
            if outcome.status == Status.RETRY.value and isinstance(outcome.value, dict):
                # the plugin raised Retry on a dependency's failure: the dependency's backoff
                tries = (dependency_tries + 1, self.failure.dependency.max_attempts)
                error = status_error(StatusCause.RETRY, fn.spec.name, outcome, tries, ctx)
                self._count_error(ctx.step, fn.spec.name, StatusCause.RETRY.value, error)
                self.counts(ctx.step).dependency_errors[StatusCause.RETRY.value] += 1
                name = str(outcome.value.get("name") or "?")
                failed_on.add(name)
                self._failed_on(name, str(outcome.value.get("cause") or "failing"))
                now = time.monotonic()
                if dependency_tries == 0:
                    first_dependency_failure = now
                dependency_tries += 1
                after = outcome.value.get("retry_after_s")
                delay = self.dependency_delay(
                    float(after) if isinstance(after, (int, float)) else None,
                    dependency_tries,
                    now - first_dependency_failure,
                )
                if delay is None:  # used up: dropped, as any Retry is after its last try
                    return dataclasses.replace(outcome, value=None)  # a Retry's value is None
                await asyncio.sleep(delay)
                self.dependency_waited_s += delay
                attempt, self.retries, prefer = attempt + 1, self.retries + 1, outcome.instance_id
                continue
            kind_of_status, cause = reported
            rules = self.failure.for_call(fn.spec.name, cause.value)
            error = status_error(cause, fn.spec.name, outcome, (plugin_try, rules.max_attempts), ctx)
            self._count_error(ctx.step, fn.spec.name, cause.value, error)
            decision = decide(kind_of_status, plugin_try, rules)
            if isinstance(decision, RetryCall):
                await self._back_off(rules.backoff(plugin_try, self._rng.random()))
                attempt, plugin_try, self.retries = attempt + 1, decision.attempt, self.retries + 1
                prefer = ""
                continue
            if isinstance(decision, FailJob):
                raise JobStop(error, decision.reason, ctx, args)
            return outcome  # dropped: the trainer records the status on the trajectory


def status_error(
    cause: StatusCause, plugin: str, outcome: CallOutcome, tries: tuple[int, int], ctx: Context
) -> PluginCallError:
    """The plugin's own verdict as an error: its status, which try of how many, and its reason."""
    status = "Status.FAILURE" if cause is StatusCause.FAILURE else "Status.RETRY"
    reason = outcome.reason or "(none given)"
    return PluginCallError(
        cause,
        f"{plugin} returned {status} (try {tries[0]} of {tries[1]}); its reason: {reason}",
        plugin=plugin,
        call_id=outcome.call_id,
        instance_id=outcome.instance_id,
        trajectory_id=ctx.trajectory_id,
    )


#: ``dependency/waiting/<name>/<cause>``: the start (epoch seconds) of an outage the job waits for,
#: 0 once it is over (``plugtune run``'s bar shows the ones above 0).
WAITING = "dependency/waiting/"
OUTAGE_POLL_S = 1.0


class OutageWatch:
    """While an attempt runs, writes which dependencies the job is waiting for as they change: a
    :data:`WAITING` point and a log line (``waiting for dependency judge: unreachable since 12:03:05``)."""

    def __init__(self, caller: PolicyCaller, writer: Any, step: Callable[[], int], plugin: str) -> None:
        self.caller = caller
        self.writer = writer  # a StoreWriter (add_metrics, add_logs, write_soon)
        self.step = step
        self.plugin = plugin  # the log's plugin column (the job's own warnings)
        self.shown: dict[str, str] = {}  # dependency name -> its series shown above 0

    async def run(self) -> None:
        for _ in range(100_000_000):  # until the attempt ends (it cancels this)
            await asyncio.sleep(OUTAGE_POLL_S)
            self.update()

    def update(self, final: bool = False) -> None:
        """Write what changed; ``final`` (the attempt ends): every series shown goes back to 0."""
        waiting = {} if final else self.caller.waiting()
        now, step = time.time(), self.step()
        points: list[MetricPoint] = []
        lines: list[LogLine] = []
        for name, series in list(self.shown.items()):
            outage = waiting.get(name)
            if outage is not None and f"{WAITING}{name}/{outage.cause}" == series:
                continue
            points.append(MetricPoint(time=now, plugin="", name=series, value=0.0, step=step))
            del self.shown[name]
            if outage is None and not final:
                lines.append(
                    LogLine(now, "INFO", self.plugin, f"dependency {name} answers again", source="trainer")
                )
        bound = self.caller.failure.dependency.max_wait_s
        for name, outage in waiting.items():
            series = f"{WAITING}{name}/{outage.cause}"
            if self.shown.get(name) == series:
                continue
            self.shown[name] = series
            points.append(MetricPoint(time=now, plugin="", name=series, value=outage.since, step=step))
            text = (
                f"{outage.message(name)}: its calls are retried with backoff; one still failing after "
                f"failure_policy.dependency.max_wait_s={bound:g} s fails the job as the dependency's"
            )
            log.warning("%s", text)
            lines.append(LogLine(now, "WARNING", self.plugin, text, source="trainer"))
        if points:
            self.writer.add_metrics(points)
            self.writer.add_logs(lines)
            self.writer.write_soon()


def waiting_summary(latest: dict[str, Any]) -> str:
    """``waiting for dependency judge: unreachable since 12:03:05`` for each :data:`WAITING` series
    whose latest value is an outage's start ("" when none)."""
    out = []
    for name, value in sorted(latest.items()):
        if name.startswith(WAITING) and value and value > 0:
            dependency, _, cause = name[len(WAITING) :].partition("/")
            out.append(Outage(cause, float(value)).message(dependency))
        if len(out) >= 3:
            break
    return "  ".join(out)
