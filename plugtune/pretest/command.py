"""What ``plugtune test`` does, behind the thin CLI wrapper: validate, run, build the report document."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.text import Text

from plugtune.errors import DataError, PlatformError, PluginCallError
from plugtune.gateway.sampling import JobSampling
from plugtune.pretest.faas import Injection, default_concurrency, run_faas
from plugtune.pretest.local import run_local
from plugtune.pretest.policy import PolicyChoice
from plugtune.pretest.progress import LiveProgress
from plugtune.pretest.report import document, dumps, render_error, render_faas, render_local
from plugtune.pretest.summary import demand, dependency_demand
from plugtune.pretest.trial import TrialResult, group_size_of
from plugtune.spec.validation import ValidatedJob, read_dataset, validate_job

WIDE = 150  # a report piped to a file is not cut at 80 columns
UNSANDBOXED_AS_ROOT = (
    "plugtune test: warning: the plugins run in this process as root, UNSANDBOXED "
    "(`plugtune test --faas` runs them in the function runtime's sandbox)"
)


@dataclass(frozen=True)
class TestOptions:
    """The options of ``plugtune test`` (see its ``--help``)."""

    job_file: str = "job.yaml"
    samples: int = 4
    policy_url: str = ""
    api_key: str = ""
    model: str = ""
    concurrency: int = 0  # 0: batch_size × group_size (``--faas`` only)
    injection: Injection | None = None
    backend: str = ""  # ``--faas``: local or ray; "": job.yaml's plugins.runtime_backend


def load_job(job_file: str, *, check_model: bool = True) -> tuple[ValidatedJob, list[dict[str, Any]]]:
    """The validated job and its training rows; raises ``DataError`` listing every problem.

    ``check_model=False`` (with ``--policy-url``) skips the check that the model folder exists."""
    job = validate_job(job_file, check_model=check_model)
    return job, read_dataset(job.train_path)


def policy_of(job: ValidatedJob, options: TestOptions) -> PolicyChoice:
    h = job.spec.hyperparameters
    sampling = JobSampling(h.temperature, h.top_p, h.max_new_tokens)
    return PolicyChoice(job.model_dir, options.policy_url, options.api_key, options.model, sampling)


def header(job: ValidatedJob, policy: PolicyChoice) -> dict[str, Any]:
    return {"job": {"name": job.spec.name, "file": str(job.job_file)}, "policy": policy.describe()}


def deploy_failed(mode: str, head: dict[str, Any], error: PluginCallError) -> dict[str, Any]:
    """The document when a plugin could not even be deployed (Create faas fault)."""
    return {
        **{"mode": mode, **head},
        "calls": [],
        "summary": {"ok": False, "calls": 0, "failed_calls": 0},
        "error": error.to_dict(),
    }


def local_test(options: TestOptions) -> dict[str, Any]:
    """Run ``plugtune test`` and return its JSON document (``summary.ok`` says whether it passed)."""
    job, rows = load_job(options.job_file, check_model=not options.policy_url)
    policy = policy_of(job, options)
    head = header(job, policy)
    try:
        inject_for = options.injection.for_plugin if options.injection else None
        result = asyncio.run(run_local(job, rows, options.samples, policy, inject_for))
    except PluginCallError as exc:
        return deploy_failed("local", head, exc)
    extra = {
        "samples": options.samples,
        "injection": options.injection.to_dict() if options.injection else None,
    }
    return document("local", result, head, extra)


def faas_test(options: TestOptions, progress: Any = None) -> dict[str, Any]:
    """Run ``plugtune test --faas``; ``progress`` (a LiveProgress factory taking the total) shows calls."""
    job, rows = load_job(options.job_file, check_model=not options.policy_url)
    policy = policy_of(job, options)
    head = header(job, policy)
    concurrency = options.concurrency or default_concurrency(job)
    rollouts = options.samples * group_size_of(job)
    live = progress(rollouts) if progress is not None else None
    on_call = live.on_call if live is not None else None
    try:
        if live is not None:
            with live:
                result, limits = _run_faas(job, rows, options, concurrency, policy, on_call)
        else:
            result, limits = _run_faas(job, rows, options, concurrency, policy, on_call)
    except PluginCallError as exc:
        return deploy_failed("faas", head, exc)
    config = job.spec.hyperparameters
    driven = min(concurrency, rollouts)
    pace = demand(
        config.batch_size, config.group_size, result.functions[0], result.calls, result.wall_s, driven
    )
    pace["dependencies"] = dependency_demand(
        result.dependencies, len(result.trajectories), pace["needed_qps"]
    )
    extra = {
        "samples": options.samples,
        "concurrency": concurrency,
        "limits": limits,
        "injection": options.injection.to_dict() if options.injection else None,
        "demand": pace,
    }
    return document("faas", result, head, extra)


def _run_faas(
    job: ValidatedJob,
    rows: list[dict[str, Any]],
    options: TestOptions,
    concurrency: int,
    policy: PolicyChoice,
    on_call: Any,
) -> tuple[TrialResult, str]:
    return asyncio.run(
        run_faas(
            job,
            rows,
            options.samples,
            concurrency,
            policy,
            options.injection,
            on_call,
            backend=options.backend,
        )
    )


def exit_code(doc: dict[str, Any]) -> int:
    return 0 if doc["summary"].get("ok") else 1


def test_command(options: TestOptions, *, faas: bool, as_json: bool) -> int:
    """``plugtune test``: print the report (or one JSON document) and return the exit status.

    0: every call succeeded; 1: a call failed (the report says why); 2: the job itself is invalid."""
    out = Console(highlight=False, soft_wrap=True)
    if not out.is_terminal:
        out.width = WIDE
    err = Console(stderr=True, highlight=False)
    if not faas and os.geteuid() == 0:
        err.print(Text(UNSANDBOXED_AS_ROOT, style="yellow"))
    try:
        if faas:
            progress = None if as_json else (lambda total: LiveProgress(total, err))
            doc = faas_test(options, progress)
        else:
            doc = local_test(options)
    except DataError as exc:
        err.print(Text(f"plugtune test: {exc.type}: {exc.message}"))
        return 2
    except PlatformError as exc:  # the policy could not be served
        err.print(Text(f"plugtune test: {exc.message}"))
        return 2
    if as_json:
        out.out(dumps(doc), highlight=False)
    elif doc.get("error"):
        out.print(Text(f"plugtune test: {doc['job']['name']} — a plugin could not be deployed", style="bold"))
        render_error(out, doc["error"])
    elif faas:
        render_faas(out, doc)
    else:
        render_local(out, doc)
    return exit_code(doc)


def fixtures_command(job_file: str, expect: str, *, faas: bool, as_json: bool) -> int:
    """``plugtune test --expect FILE``: each fixture's grader call, a pass/fail table (or one JSON
    document) and the exit status: 0 every fixture passed, 1 one did not, 2 the job or file is invalid."""
    from pathlib import Path

    from rich.table import Table

    from plugtune.pretest.fixtures import read_fixtures, run_fixtures
    from plugtune.runtime import InProcessRuntime, LocalRuntime

    out = Console(highlight=False, soft_wrap=True)
    if not out.is_terminal:
        out.width = WIDE
    err = Console(stderr=True, highlight=False, soft_wrap=True)  # a problem's line stays whole
    if not faas and os.geteuid() == 0:
        err.print(Text(UNSANDBOXED_AS_ROOT, style="yellow"))
    try:
        job, rows = load_job(job_file, check_model=False)
        fixtures = read_fixtures(Path(expect), job, rows)
    except DataError as exc:
        err.print(Text(f"plugtune test: {exc.type}: {exc.message}"))
        return 2

    async def run() -> Any:
        runtime = LocalRuntime() if faas else InProcessRuntime()
        async with runtime as rt:
            return await run_fixtures(rt, job, fixtures)

    try:
        results = asyncio.run(run())
    except PluginCallError as exc:  # a plugin could not be deployed
        if as_json:
            out.out(
                dumps({"fixtures": [], "error": exc.to_dict(), "summary": {"ok": False}}), highlight=False
            )
        else:
            render_error(out, exc.to_dict())
        return 1
    passed = sum(r.passed for r in results)
    if as_json:
        summary = {"ok": passed == len(results), "fixtures": len(results), "passed": passed}
        out.out(dumps({"fixtures": [r.to_dict() for r in results], "summary": summary}), highlight=False)
    else:
        table = Table(title=f"{job.spec.name}: grader fixtures from {expect}")
        for column in ("line", "name", "grader", "expected", "got", ""):
            table.add_column(column, overflow="fold")
        for r in results:
            f = r.fixture
            verdict = Text("pass", style="green") if r.passed else Text("FAIL", style="bold red")
            expected = _expected(f.expect, f.tolerance)
            table.add_row(str(f.line), Text(f.name), f.grader, expected, Text(r.got), verdict)
        out.print(table)
        out.print(f"{passed} of {len(results)} fixtures passed")
    return 0 if passed == len(results) else 1


def _expected(expect: float | str | None | tuple[float | None, ...], tolerance: float) -> str:
    """A fixture's expect as the table shows it: "1.0 ± 1e-06", "[1.0, None] ± 1e-06", "None", "retry"."""
    if expect is None:
        return "None"
    if isinstance(expect, float):
        return f"{expect!r} ± {tolerance:g}"
    if isinstance(expect, tuple):
        return f"[{', '.join(repr(e) for e in expect)}] ± {tolerance:g}"
    return expect
