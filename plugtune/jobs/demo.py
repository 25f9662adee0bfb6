"""``plugtune demo``: the example project trained end to end, with the reward printed as it rises."""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from pathlib import Path

from plugtune.jobs.control import create_job
from plugtune.jobs.progress import run_with_progress
from plugtune.settings import Settings
from plugtune.store import Store


def demo_job_file() -> Path:
    return Path(str(resources.files("plugtune").joinpath("demo", "job.yaml")))


def run_demo(store: Store, settings: Settings, out: Callable[[str], None]) -> int:
    """Run the demo job; return the process exit code (0 when it succeeded)."""
    job_file = demo_job_file()
    out(f"plugtune demo: GRPO on a tiny chat model learning 2-digit addition ({job_file})")
    job_id, invalid = create_job(store, job_file)
    if invalid is not None:
        out(f"the demo job failed validation: {invalid}")
        return 1
    status = run_with_progress(store, settings, job_id)
    series = store.metrics(job_id, "", ["reward/mean", "loss"]).get("reward/mean", [])
    if series:
        out("\nstep  reward/mean")
        for point in series:
            bar = "#" * round(40 * point.value)
            out(f"{point.step or 0:>4}  {point.value:6.3f}  {bar}")
        first, last = series[0].value, series[-1].value
        k = min(5, len(series))
        early = sum(p.value for p in series[:k]) / k
        late = sum(p.value for p in series[-k:]) / k
        out(
            f"\nreward: first step {first:.3f}, last step {last:.3f}; "
            f"mean of first {k} steps {early:.3f} -> last {k} steps {late:.3f}"
        )
    job = store.get_job(job_id)
    out(
        f"job {job_id}: {status}" + (f" — {job.error.type}: {job.error.message}" if job and job.error else "")
    )
    final = settings.home / "jobs" / str(job_id) / "final"
    if status == "succeeded":
        out(f"trained model: {final}")
    out(f"open the console: plugtune serve, then http://127.0.0.1:8321/jobs/{job_id}")
    return 0 if status == "succeeded" else 1
