"""What ``jobs show`` and ``doctor`` print: a job's state and the evidence behind its failure."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from plugtune.jobs.plugin_metrics import latest_stats
from plugtune.store import Store
from plugtune.trainer.poison import Quarantined, parse_quarantine
from plugtune.trainer.tasks import split_task_metric

#: The ``plugin`` of the job's own warnings in its log (no plugin wrote them): the attempt writes
#: them as WARNING lines, ``jobs show`` and the console's job page list them.
JOB_WARNINGS = ""


def job_document(store: Store, job_id: int) -> dict[str, Any]:
    """Everything ``jobs show --json`` prints: the job, its error, attempts, plugins, progress, the
    newest value of every training metric, and ``plugin_metrics``: each plugin's ``ctx.metric``
    names with their mean, min, max and count in the newest step that has them (and that step)."""
    job = store.get_job(job_id)
    if job is None:
        raise LookupError(f"there is no job {job_id}")
    newest = store.latest_metrics([job_id], plugin="")
    latest = {m.name: m.value for m in newest}
    plugins = store.list_plugins(job_id)
    return {
        "id": job.id,
        "name": job.name,
        "status": job.status,
        "created_at": job.created_at,
        "updated_at": job.updated_at,
        "steps_done": job.steps_done,
        "steps_total": job.steps_total,
        "error": job.error.to_dict() if job.error else None,
        "next_retry_at": job.next_retry_at,
        "auto_retries": job.auto_retries,
        "attempts": [a.to_dict() for a in store.list_attempts(job_id)],
        "errors": [e.to_dict() for e in store.list_job_errors(job_id)],
        "plugins": [p.to_dict() for p in plugins],
        "trajectories": store.trajectory_status_counts(job_id),
        "metrics": latest,
        "plugin_metrics": latest_stats(latest, {m.name: m.step for m in newest}, [p.name for p in plugins]),
        "warnings": job_warnings(store, job_id),
        "checkpoint": (c.to_dict() if (c := store.latest_checkpoint(job_id)) else None),
    }


def task_lines(latest: Mapping[str, float]) -> list[str]:
    """A multi-task job's newest step per task, one line each (``jobs show``): its mean reward, failed
    trajectories and calls by cause, and the share of its groups without a gradient and of its
    replies cut at max_new_tokens ([] for a job without tasks)."""
    by_task: dict[str, dict[str, float]] = {}
    for name, value in latest.items():
        found = split_task_metric(name)
        if found is not None:
            by_task.setdefault(found[0], {})[found[1]] = value
    lines = []
    for task, m in sorted(by_task.items()):
        causes = sorted(
            (k.removeprefix("plugin/errors/"), v) for k, v in m.items() if k.startswith("plugin/errors/")
        )
        calls = f" ({', '.join(f'{c} {v:.0f}' for c, v in causes)})" if causes else ""
        lines.append(
            f"task {task}: reward/mean={m.get('reward/mean', math.nan):.4g}, "
            f"failed {m.get('trajectories/failed', 0):.0f} of {m.get('trajectories/total', 0):.0f} "
            f"trajectories{calls}, no-gradient groups {m.get('groups/zero_variance_share', 0):.0%}, "
            f"truncated replies {m.get('response/truncated_share', 0):.0%}"
        )
    return lines


def job_warnings(store: Store, job_id: int, limit: int = 20) -> list[str]:
    """The job's own warnings (off-policy training, dropped tokens, no gradient, cut replies, ...),
    oldest first."""
    lines = store.logs(job_id, plugin=JOB_WARNINGS, level="WARNING", limit=limit)
    return [line.message for line in reversed(lines)]


#: The words every quarantine warning holds (the store's text filter narrows the job's log to them).
_MARK = ") is quarantined: every trajectory of it failed with "


def quarantined_rows(store: Store, job_id: int) -> list[Quarantined]:
    """The rows the job quarantined, in the order it did (one per row, the latest warning's)."""
    found: dict[tuple[str, int], Quarantined] = {}
    for line in store.logs_after(job_id, 0, plugin=JOB_WARNINGS, level="WARNING", text=_MARK):
        entry = parse_quarantine(line.message)
        if entry is not None:
            found[(entry.file, entry.line)] = entry
    return list(found.values())


def doctor_document(store: Store, job_id: int) -> dict[str, Any]:
    """The classified error, the failing plugin's traceback, worst trajectories, metrics around it,
    and the dataset rows the job quarantined (poison rows)."""
    doc = job_document(store, job_id)
    error = doc["error"] or {}
    evidence = error.get("evidence") or {}
    plugin_entry = str(evidence.get("plugin") or "")
    plugin = next(
        (p for p in doc["plugins"] if p["entry"] == plugin_entry or p["name"] == plugin_entry), None
    )
    failed = store.trajectories(job_id, status="failed", limit=5)
    worst = store.trajectories(job_id, status="success", order="reward_asc", limit=5)
    window: dict[str, list[dict[str, Any]]] = {}
    if plugin is not None:
        until = plugin.get("ended_at") or doc["updated_at"]
        for name in ("exec_qps", "latency_ms_p99", "memory_percent", "cpu_percent", "instances"):
            points = store.metrics(job_id, plugin["name"], [name], since=until - 600, until=until + 60)
            window[name] = [p.to_dict() for p in points.get(name, [])][-20:]
    logs = store.logs(job_id, plugin=plugin["name"] if plugin else None, limit=20)
    job = store.get_job(job_id)
    return {
        "dependency": dependency_failure(error, job.spec if job is not None else {}),
        "loss_nan_batch": _loss_nan_batch(store, job_id, evidence),
        "job": {k: doc[k] for k in ("id", "name", "status", "steps_done", "steps_total")},
        "error": error or None,
        "traceback": evidence.get("traceback") or error.get("traceback") or "",
        "plugin": plugin,
        "failed_trajectories": [t.to_dict() for t in failed],
        "lowest_reward_trajectories": [t.to_dict() for t in worst],
        "metrics_window": window,
        "recent_logs": [line.to_dict() for line in reversed(logs)],
        "quarantined_rows": [q.to_dict() for q in quarantined_rows(store, job_id)],
    }


#: What a dependency's failure message starts with (plugtune/runtime/worker/dependency.py): its
#: name when it is declared, and the host:port the request went to.
_DEPENDENCY_MESSAGE = re.compile(
    r"^(?:the dependency (?P<name>[^\s(]+)|a service the plugin calls) \((?P<address>[^)]*)\)"
)
_HTTP_STATUS = re.compile(r"\bHTTP (\d{3})\b")


def dependency_failure(error: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any] | None:
    """The service a job failed on, when its error is a `Dependency error` (owner dependency):
    ``name`` as job.yaml declares it ("" when undeclared), ``address`` (host:port), ``declared``,
    ``cause``, ``status`` (the HTTP status, None when none came back), ``policy`` (the job's
    ``failure_policy.dependency``) and ``what_to_do``: the lines ``doctor`` prints; None otherwise."""
    from plugtune.runtime.dependencies import parse_target
    from plugtune.spec.models import DependencyRetry

    if error.get("owner") != "dependency":
        return None
    evidence = error.get("evidence") or {}
    message = str(error.get("message") or "")
    said = _DEPENDENCY_MESSAGE.match(message)
    name = str(evidence.get("dependency") or (said.group("name") if said and said.group("name") else ""))
    declared_deps = spec.get("dependencies") or {}
    declared = declared_deps.get(name) if name and isinstance(declared_deps, dict) else None
    address = said.group("address") if said else ""
    limits: dict[str, Any] = {}
    if declared is not None:
        url = declared if isinstance(declared, str) else str(declared.get("url") or "")
        limits = {} if isinstance(declared, str) else {k: declared.get(k) for k in ("rpm", "concurrency")}
        try:
            host, port = parse_target(url)
            address = f"{host}:{port}"
        except ValueError:
            pass
    status = _HTTP_STATUS.search(message)
    raw_policy = (spec.get("failure_policy") or {}).get("dependency") or {}
    policy = DependencyRetry.model_validate(raw_policy).model_dump()
    cause = str(error.get("cause") or "")
    who = f"dependency {name}" if name else "the service"
    where = f" at {address}" if address else ""
    todo = [f"check {who}{where}: is it up, and what do its status page and logs say?"]
    if cause == "rate limited":
        budget = ", ".join(f"{k} {v}" for k, v in limits.items() if v is not None) or "none declared"
        todo.append(
            f"its rate limit: the job asked more than it allows; set `rpm`/`concurrency` under "
            f"job.yaml `dependencies: {name or 'NAME'}:` to the service's limit (now: {budget}), or raise "
            "the service's limit"
        )
    if declared is None:
        todo.append(
            "declare it in job.yaml `dependencies:` (name: URL or host:port) so its calls are budgeted "
            "and reported under its name"
        )
    todo.append(
        f"failure_policy.dependency bounds the retries and waits (max_attempts {policy['max_attempts']}, "
        f"max_wait_s {policy['max_wait_s']:g}): raise max_wait_s to ride out a longer outage; the job is "
        "retried automatically (retry:) like a platform error"
    )
    return {
        "name": name,
        "address": address,
        "declared": declared is not None,
        "cause": cause,
        "status": int(status.group(1)) if status else None,
        "policy": policy,
        "what_to_do": todo,
    }


def _loss_nan_batch(store: Store, job_id: int, evidence: dict[str, Any]) -> list[dict[str, Any]]:
    """A Loss nan step's trajectories, the largest rewards (by magnitude) first: the likeliest causes."""
    ids = [str(t) for t in evidence.get("trajectory_ids") or []]
    rewards = {r.trajectory_id: r.reward for r in store.trajectory_records(job_id, ids)} if ids else {}
    batch = [{"trajectory_id": t, "reward": rewards.get(t), "stored": t in rewards} for t in ids]
    return sorted(batch, key=lambda b: -_magnitude(b["reward"]))


def _magnitude(reward: float | None) -> float:
    if reward is None:
        return 0.0
    return math.inf if math.isnan(reward) else abs(reward)
