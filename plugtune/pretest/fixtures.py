"""``plugtune test --expect fixtures.jsonl``: a job's graders against answers whose reward is known.

A fixture is one JSON object per line:

* the sample: ``"row": N`` (line N+1 of the job's ``data.train``) or ``"sample": {...}`` (a dataset
  row: ``messages`` or ``prompt``, ``extra``);
* the reply to score: ``"completion": "..."`` (the sample's messages and this assistant reply) or
  ``"messages": [...]`` (the whole conversation, as a rollout with tools leaves it);
* ``"expect"``: the reward (a number, compared within ``"tolerance"``, default 1e-6), ``null``
  (unscorable), or the grader's verdict: ``"failure"``, ``"retry"``, ``"discard"``, or ``"error"``
  (the call fails: it raises, times out, ...);
* ``"grader"``: the job.yaml name of the grader to ask (needed when the job has several);
  ``"name"``: a label for the table.

A fixture for a group grader names it in ``"grader"`` and gives, instead of one reply, the group's
replies as ``"completions": ["...", ...]`` (each one the sample's messages and that assistant
reply, in the order the grader gets them); its ``"expect"`` is a list with one reward or ``null``
per completion (each compared within ``"tolerance"``), or one of the verdicts above for the call.

Each fixture is one grader call, in this process (a forked child per sync call, killed at its
``timeout_s``) or with ``--faas`` in the function runtime with the job's limits; the result is a
pass/fail row per fixture and an exit status for CI: 0 when every fixture passed, 1 when one did
not, 2 when the fixtures file or the job is invalid (each problem named by its line and field).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plugtune.errors import DataError, PluginCallError, Problem
from plugtune.jobs.plugins import JobFunction
from plugtune.pretest.deployment import deploy_job
from plugtune.runtime.runtime import BaseRuntime
from plugtune.sdk import Context, Kind, Sample, Trajectory
from plugtune.spec.validation import ValidatedJob

VERDICTS = ("failure", "retry", "discard", "error")
MAX_FIXTURES = 10_000
MAX_LINE_BYTES = 1 << 20
MAX_FILE_BYTES = 64 << 20
DEFAULT_TOLERANCE = 1e-6
KEYS = {"row", "sample", "completion", "messages", "completions", "expect", "tolerance", "grader", "name"}
MAX_GROUP = 1024  # completions in one group fixture

Expect = float | str | None | tuple[float | None, ...]


@dataclass(frozen=True)
class Fixture:
    line: int
    name: str
    grader: str
    sample: Sample
    # one reply for a grader; the group's replies, in order, for a group grader
    trajectories: tuple[Trajectory, ...]
    expect: Expect  # a tuple (one reward or None per reply) only for a group grader
    tolerance: float
    group: bool = False


@dataclass(frozen=True)
class FixtureResult:
    fixture: Fixture
    got: str  # what the grader did, as the table shows it: "1.0", "None", "[1.0, None]", "failure: why", ...
    passed: bool

    def to_dict(self) -> dict[str, Any]:
        f = self.fixture
        return {
            "line": f.line,
            "name": f.name,
            "grader": f.grader,
            "group": f.group,
            "expect": list(f.expect) if isinstance(f.expect, tuple) else f.expect,
            "got": self.got,
            "passed": self.passed,
        }


def read_fixtures(path: Path, job: ValidatedJob, rows: list[dict[str, Any]]) -> list[Fixture]:
    """The fixtures of ``path``; DataError naming every bad line and field (nothing is run then)."""
    name = str(path)
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise DataError(
                [Problem(name, f"is {size} bytes; a fixtures file holds at most {MAX_FILE_BYTES}")]
            )
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError([Problem(name, f"cannot be read: {exc.strerror or exc}")]) from None
    refs = job.plugin_refs()  # a multi-task job's tasks' graders too
    graders = {ref.name: ref for ref in refs if ref.kind is Kind.GRADER}
    group_graders = {ref.name for ref in refs if ref.kind is Kind.GROUP_GRADER}
    fixtures: list[Fixture] = []
    problems: list[Problem] = []
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        if len(fixtures) + len(problems) >= MAX_FIXTURES:
            problems.append(Problem(name, f"more than {MAX_FIXTURES} fixtures: split the file", number))
            break

        def bad(message: str, field: str | None = None, line_no: int = number) -> None:
            problems.append(Problem(name, message, line_no, field))

        if len(line) > MAX_LINE_BYTES:
            bad(f"is {len(line)} bytes; a fixture line holds at most {MAX_LINE_BYTES}")
            continue
        try:
            data = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            bad(f"is not JSON ({exc}); write one object per line")
            continue
        if not isinstance(data, dict):
            bad("is not a JSON object; write one object per line")
            continue
        unknown = sorted(set(data) - KEYS)
        if unknown:
            bad(f"unknown key(s) {', '.join(unknown)}; a fixture takes {', '.join(sorted(KEYS))}", unknown[0])
            continue
        fixture = _fixture(data, number, graders, group_graders, rows, bad)
        if fixture is not None:
            fixtures.append(fixture)
    if not fixtures and not problems:
        problems.append(
            Problem(name, "holds no fixture: write one JSON object per line (see plugtune test --help)")
        )
    if problems:
        raise DataError(problems)
    return fixtures


def _fixture(
    data: dict[str, Any],
    number: int,
    graders: dict[str, Any],
    group_graders: set[str],
    rows: list[dict[str, Any]],
    bad: Any,
) -> Fixture | None:
    grader = data.get("grader")
    if grader is None:
        if len(graders) != 1:
            bad(f"the job has {len(graders)} graders ({', '.join(graders)}): name one", "grader")
            return None
        grader = next(iter(graders))
    elif not isinstance(grader, str):
        bad(f"must be the job.yaml name of a grader or group grader; got {grader!r}"[:300], "grader")
        return None
    elif grader not in graders and grader not in group_graders:
        known = ", ".join([*graders, *group_graders]) or "none"
        bad(f"no grader {grader!r} in the job; its graders and group graders: {known}", "grader")
        return None
    group = grader in group_graders
    sample = _sample(data, rows, bad)
    if sample is None:
        return None
    messages = _group_replies(data, sample, bad) if group else _reply(data, str(grader), sample, bad)
    if messages is None:
        return None
    expect = _expect(data, len(messages) if group else None, bad)
    if isinstance(expect, _Invalid):
        return None
    tolerance = data.get("tolerance", DEFAULT_TOLERANCE)
    if (
        isinstance(tolerance, bool)
        or not isinstance(tolerance, (int, float))
        or not 0 <= tolerance < math.inf
    ):
        bad("must be a number >= 0", "tolerance")
        return None
    label = data.get("name", "")
    ids = [f"fixture-{number}-{i}" for i in range(len(messages))] if group else [f"fixture-{number}"]
    return Fixture(
        line=number,
        name=str(label)[:200] if label is not None else "",
        grader=str(grader),
        sample=sample,
        trajectories=tuple(
            Trajectory(trajectory_id=t, messages=list(m)) for t, m in zip(ids, messages, strict=True)
        ),
        expect=expect,
        tolerance=float(tolerance),
        group=group,
    )


def _sample(data: dict[str, Any], rows: list[dict[str, Any]], bad: Any) -> Sample | None:
    if ("row" in data) == ("sample" in data):
        bad("give the sample as exactly one of row (an index into data.train) or sample (a dataset row)")
        return None
    if "row" in data:
        row = data["row"]
        if isinstance(row, bool) or not isinstance(row, int) or not 0 <= row < len(rows):
            bad(f"must be a row index from 0 to {len(rows) - 1} of data.train", "row")
            return None
        sample_dict: Any = rows[row]
        index = row
    else:
        sample_dict, index = data["sample"], 0
    try:
        if not isinstance(sample_dict, dict):
            raise TypeError("a dataset row is an object")
        if "messages" not in sample_dict and isinstance(sample_dict.get("prompt"), str):
            sample_dict = {**sample_dict, "messages": [{"role": "user", "content": sample_dict["prompt"]}]}
        return dataclasses.replace(Sample.from_dict(sample_dict), index=index)
    except (KeyError, TypeError, ValueError) as exc:
        bad(f"is not a dataset row ({exc}): give messages (or prompt) and extra", "sample")
        return None


def _reply(data: dict[str, Any], grader: str, sample: Sample, bad: Any) -> list[list[Any]] | None:
    """A grader's one conversation to score (in a list, as a group grader's are)."""
    if "completions" in data:
        bad(f"is for a group grader; {grader!r} scores one reply: give completion", "completions")
        return None
    if ("completion" in data) == ("messages" in data):
        bad("give the reply as exactly one of completion (a string) or messages (the whole conversation)")
        return None
    if "completion" in data:
        if not isinstance(data["completion"], str):
            bad("must be a string", "completion")
            return None
        return [[*sample.messages, {"role": "assistant", "content": data["completion"]}]]
    messages = data["messages"]
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
        bad("must be a list of messages, each an object with a role", "messages")
        return None
    return [messages]


def _group_replies(data: dict[str, Any], sample: Sample, bad: Any) -> list[list[Any]] | None:
    """A group grader's conversations: the sample's messages and each completion."""
    for key in ("completion", "messages"):
        if key in data:
            bad(f"{data['grader']!r} is a group grader: give the group's replies as completions", key)
            return None
    completions = data.get("completions")
    if (
        not isinstance(completions, list)
        or not 1 <= len(completions) <= MAX_GROUP
        or not all(isinstance(c, str) for c in completions)
    ):
        bad(f"must be a list of 1 to {MAX_GROUP} strings, the group's replies", "completions")
        return None
    return [[*sample.messages, {"role": "assistant", "content": c}] for c in completions]


class _Invalid:
    """What _expect returns once it has named the problem."""


def _is_reward(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _expect(data: dict[str, Any], group_size: int | None, bad: Any) -> Expect | _Invalid:
    """The fixture's expect (a tuple for a group grader's rewards), or _Invalid once named."""
    if "expect" not in data:
        what = (
            "a list of rewards (or null), one per completion,"
            if group_size
            else "a reward, null (unscorable)"
        )
        bad(f"missing: {what} or one of {', '.join(VERDICTS)}", "expect")
        return _Invalid()
    expect = data["expect"]
    if isinstance(expect, str) and expect in VERDICTS:
        return expect
    if group_size is None:
        if expect is None or _is_reward(expect):
            return float(expect) if expect is not None else None
        bad(f"must be a finite number, null or one of {', '.join(VERDICTS)}; got {expect!r}", "expect")
        return _Invalid()
    if not isinstance(expect, list) or not all(e is None or _is_reward(e) for e in expect):
        bad(
            "must be a list of finite numbers or null (one per completion) or one of "
            f"{', '.join(VERDICTS)}; got {expect!r}"[:300],
            "expect",
        )
        return _Invalid()
    if len(expect) != group_size:
        bad(
            f"has {len(expect)} value(s) for {group_size} completion(s): one reward or null per completion",
            "expect",
        )
        return _Invalid()
    return tuple(None if e is None else float(e) for e in expect)


async def run_fixtures(rt: BaseRuntime, job: ValidatedJob, fixtures: list[Fixture]) -> list[FixtureResult]:
    """Deploy the job's plugins in ``rt`` and ask each fixture's grader, one call per fixture."""
    kinds = (Kind.GRADER, Kind.GROUP_GRADER)
    deployed = {jf.spec.name: jf for jf in await deploy_job(rt, job) if jf.spec.kind in kinds}
    return [await _check(deployed[f.grader], f) for f in fixtures]


async def _check(fn: JobFunction, fixture: Fixture) -> FixtureResult:
    if fixture.group:  # as a training step asks a group grader: no one trajectory is its own
        ctx = Context(job_id="fixtures", phase="test", rollout_index=-1, plugin=fixture.grader)
        args: tuple[Any, ...] = (fixture.sample, list(fixture.trajectories))
    else:
        trajectory = fixture.trajectories[0]
        ctx = Context(
            job_id="fixtures", phase="test", trajectory_id=trajectory.trajectory_id, plugin=fixture.grader
        )
        args = (fixture.sample, trajectory)
    try:
        outcome = await fn.invoke(ctx, *args)
    except PluginCallError as exc:
        return FixtureResult(fixture, f"error: {exc.cause}: {exc.message}"[:500], fixture.expect == "error")
    if outcome.status != "success":
        said = f"{outcome.status}: {outcome.reason}" if outcome.reason else outcome.status
        return FixtureResult(fixture, said[:500], fixture.expect == outcome.status)
    if fixture.group:
        values = [None if v is None else float(v) for v in outcome.value]
        expected = fixture.expect
        passed = (
            isinstance(expected, tuple)
            and len(values) == len(expected)
            and all(_close(v, e, fixture.tolerance) for v, e in zip(values, expected, strict=True))
        )
        return FixtureResult(fixture, f"[{', '.join(repr(v) for v in values)}]"[:500], passed)
    value = outcome.value
    if value is None:
        return FixtureResult(fixture, "None", fixture.expect is None)
    got = float(value)
    expect = fixture.expect
    passed = isinstance(expect, float) and abs(got - expect) <= fixture.tolerance
    return FixtureResult(fixture, repr(got), passed)


def _close(got: float | None, expect: float | None, tolerance: float) -> bool:
    if got is None or expect is None:
        return got is expect
    return abs(got - expect) <= tolerance
