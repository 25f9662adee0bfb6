"""A storm of plugin calls with faults of every kind mixed in, through the real local runtime.

Each call's fault is decided per sample (seeded), so its expected cause is known: the confusion
matrix of injected vs classified cause must be diagonal, every call answered, the runtime still
serving, and nothing leaked (processes, cgroups, temp dirs, fds), the parent's memory flat.
Bounded here; ``make chaos`` runs the long form (PLUGTUNE_CHAOS=long: 10,000 calls).
"""

from __future__ import annotations

import asyncio
import collections
import os
import tempfile
import time
from pathlib import Path

import pytest

from plugtune.runtime import LocalRuntime
from plugtune.runtime.deployment import LocalDeployment
from tests.chaos.harness import (
    EXPECTED,
    NO_ANSWER,
    OK,
    Call,
    cgroup_children,
    cgroup_dirs,
    drive,
    entry,
    format_matrix,
    misclassified,
    plan,
    settled,
    snapshot,
)

LONG = os.environ.get("PLUGTUNE_CHAOS") == "long"
CALLS = int(os.environ.get("PLUGTUNE_CHAOS_CALLS", 10_000 if LONG else 1_200))
FAULT_SHARE = 0.2
SEED = int(os.environ.get("PLUGTUNE_CHAOS_SEED", "12"))
IN_FLIGHT = 3  # per function: its max_instances, so a call waits for an instance only after a crash
ANSWER_S = 60.0  # far past timeout_s (6 s): a call without an answer by then is lost
RSS_GROWTH_MB = 48.0
pytestmark = pytest.mark.timeout(3600 if LONG else 300)


def live_instances(rt: LocalRuntime) -> set[str]:
    """The cgroups of live instances and zygotes (named after them)."""
    ids: set[str] = set()
    for d in rt.backend.deployments:  # type: ignore[union-attr]
        assert isinstance(d, LocalDeployment)
        ids |= {i.id for i in d.instances} | {i.id for i in d.pool.creating}
        ids |= {d.spare.id} if d.spare is not None else set()
        zygote = d.launcher.zygote
        if zygote is not None and zygote.limits is not None and zygote.limits.memory_dir is not None:
            ids.add(zygote.limits.memory_dir.name)  # the zygote's own cgroup, removed with it
    return ids


async def leftover_cgroups(rt: LocalRuntime, within_s: float = 5.0) -> set[str]:
    deadline = time.monotonic() + within_s
    while True:
        left = cgroup_children(rt.backend.limits) - live_instances(rt)  # type: ignore[union-attr]
        if not left or time.monotonic() > deadline:
            return left
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("limits", ["auto", "rlimit"])
async def test_a_storm_of_faults_is_classified_exactly_answered_and_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limits: str
) -> None:
    """The strongest limits this host has (cgroups here), then the rlimit fallback on a quarter as
    many calls (fork bombs included: the process watch holds each instance to its max_pids)."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    kinds = sorted(EXPECTED)
    total = CALLS if limits == "auto" else CALLS // 4
    calls = plan(total, FAULT_SHARE, SEED, kinds, functions=2)
    warmup = len(calls) // 5
    before = snapshot(temp)
    started = time.monotonic()
    async with LocalRuntime(limits=None if limits == "auto" else limits, metrics_period_s=1.0) as rt:
        fns = [await rt.deploy(entry("chaos")), await rt.deploy(entry("chaos_async"))]
        cgroups = cgroup_dirs(rt.backend.limits)  # type: ignore[union-attr]
        results = await drive(fns, calls[:warmup], IN_FLIGHT, ANSWER_S)
        middle = snapshot(temp)
        results += await drive(fns, calls[warmup:], IN_FLIGHT, ANSWER_S)
        end = snapshot(temp)
        after_storm = [Call(total + i, "", i % 2) for i in range(20)]
        serving = await drive(fns, after_storm, IN_FLIGHT, ANSWER_S)
        leaked_cgroups = await leftover_cgroups(rt)
    elapsed = time.monotonic() - started
    after = await settled(before, temp)

    wrong = misclassified(results)
    faults = collections.Counter(c.fault for c in calls if c.fault)
    leaked = {
        "processes": sorted(after.children - before.children),
        "cgroups": sorted(leaked_cgroups) + [str(d) for d in cgroups if d.exists()],
        "temp dirs": sorted(after.temp - before.temp),
        "fds": max(0, after.fds - before.fds),
    }
    report = "\n".join(
        [
            f"chaos: {len(results)} calls in {elapsed:.1f} s (seed {SEED}, limits {rt.limits_mechanism})",
            f"faults: {sum(faults.values())} ({FAULT_SHARE:.0%}): "
            + ", ".join(f"{k} {n}" for k, n in sorted(faults.items())),
            format_matrix(results),
            f"misclassified: {len(wrong)}, lost (no answer): {sum(r.got == NO_ANSWER for r in results)}",
            f"leaked: {leaked}",
            f"parent rss: {before.rss_mb:.0f} MiB before, {middle.rss_mb:.0f} after {warmup} calls, "
            f"{end.rss_mb:.0f} at the end; fds {before.fds} -> {after.fds}",
        ]
        + [f"  {r.call.fault or OK} -> {r.got}: {r.detail}" for r in wrong[:20]]
    )
    print(report)
    assert set(faults) == set(kinds), report
    assert not wrong, report
    assert [r.got for r in serving] == [OK] * len(after_storm), report
    assert not any(leaked.values()), report
    assert end.rss_mb - middle.rss_mb < RSS_GROWTH_MB, report
