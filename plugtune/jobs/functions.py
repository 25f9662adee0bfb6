"""The functions in use on this machine: each one's job, limits and memory, the quota and its use,
and what runtimes that were killed left behind (``plugtune functions``, ``/api/functions``, the
console's Functions page).

Each job attempt runs its own function runtime in its own process, so no process holds them all.
What is true across processes is read from where the attempts put it:

* the store: every attempt records its plugins (``waiting`` while they deploy, ``running`` with their
  effective runtime limits once deployed; ended when the attempt ends, or when the supervisor
  settles an attempt that died) and samples their instance count and memory every few seconds
  (the newest sample is shown, with its time);
* the machine (:mod:`plugtune.runtime.leftovers`): uid leases under ``/run/plugtune/uids`` and
  instance cgroups, both naming the runtime process that made them. One whose process is gone is a
  leftover of a killed attempt: its function's processes (a daemon a plugin started) may still run.
  The attempt's pid names the job (the store keeps each attempt's pid). A running attempt's leases
  also give each of its functions' processes (zygote, instances, what they started) and their
  resident memory; without root there is no uid per function, and so no such list.

The quota holds each runtime (each attempt, each ``plugtune test --faas``) on its own; it is the
settings of this process (``plugtune serve --max-functions/--max-instances/--total-memory-mb``, or
PLUGTUNE_MAX_FUNCTIONS / _MAX_INSTANCES / _TOTAL_MEMORY_MB), which the attempts it starts inherit.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from plugtune.runtime import leftovers
from plugtune.runtime.quota import Quota
from plugtune.runtime.sandbox import group_of
from plugtune.settings import Settings
from plugtune.spec.plugin_names import named_entries
from plugtune.store import Store
from plugtune.store.records import Attempt, Job, Plugin

#: The newest samples of a plugin that say how many instances it runs and how full the fullest is.
INSTANCES, MEMORY_PERCENT = "instances", "memory_percent"


@dataclass(frozen=True)
class FunctionProcess:
    """One process of a function now: its zygote, an instance, or a process an instance started."""

    pid: int
    role: str  # "zygote" | "instance" | "started by it"
    rss_mb: float


@dataclass(frozen=True)
class FunctionInUse:
    """A plugin of a running job that its attempt deploys or runs, as the store has it."""

    job_id: int
    job_name: str
    job_status: str
    attempt: int | None
    attempt_pid: int | None
    attempt_alive: bool  # False: the attempt's process is gone (the supervisor settles it)
    plugin: str
    role: str
    status: str  # waiting (deploying) | running
    entry: str
    limits: dict[str, Any]  # the effective runtime limits (empty until it is deployed)
    instances: int | None  # newest sample; None: not sampled yet
    memory_mb: int | None  # limit per instance
    memory_used_mb: float | None  # the fullest instance's use at the newest sample
    memory_reserved_mb: int  # what the quota counts: instances x memory_mb
    sampled_at: float | None
    processes: list[FunctionProcess] = field(default_factory=list)  # root only (a uid per function)


@dataclass(frozen=True)
class RuntimeUse:
    """How much of the quota one attempt's runtime uses (as last sampled)."""

    job_id: int
    attempt: int | None
    functions: int
    instances: int
    memory_reserved_mb: int


@dataclass(frozen=True)
class Leftover:
    """A uid lease or cgroup a killed runtime left, with the job whose attempt held it if known."""

    kind: str  # "uid lease" | "cgroup"
    what: str  # "uid 1234567" | the cgroup's path
    holder_pid: int
    job_id: int | None
    job_status: str
    attempt: int | None
    processes: tuple[int, ...]


@dataclass(frozen=True)
class FunctionsView:
    quota: dict[str, int]
    quota_scope: str
    retention_days: float
    functions: list[FunctionInUse]
    use: list[RuntimeUse]
    leftovers: list[Leftover]
    live_leases: int  # uid leases of runtimes that run now (this machine)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


QUOTA_SCOPE = (
    "each function runtime (one per job attempt) on its own: functions deployed at once, instances "
    "running at once, and the memory_mb of those instances together"
)


def functions_view(store: Store, settings: Settings) -> FunctionsView:
    """Every function in use (store) and every leftover of a killed runtime (machine), with the quota."""
    quota = Quota.from_settings(settings)
    found_plugins = store.plugins_in_use()
    every = {j: store.get_job(j) for j in sorted({p.job_id for p in found_plugins})}
    jobs = {j: job for j, job in every.items() if job is not None and job.status == "running"}
    plugins = [p for p in found_plugins if p.job_id in jobs]  # a queued job's wait for its next attempt
    running_attempts = {j: _running(store.list_attempts(j)) for j in jobs}
    latest = _latest(store, list(jobs))
    found = leftovers.find()
    state = settings.home / "runtime"
    rows = []
    for job_id, job in jobs.items():
        attempt = running_attempts[job_id]  # None: being started (its plugins wait to deploy)
        its = {p.name: p for p in plugins if p.job_id == job_id}
        named = _processes_by_plugin(found, attempt, job, its, state)
        rows += [_row(p, job, attempt, latest, named.get(p.name, [])) for p in its.values()]
    return FunctionsView(
        quota={
            "max_functions": quota.max_functions,
            "max_instances": quota.max_instances,
            "total_memory_mb": quota.total_memory_mb,
        },
        quota_scope=QUOTA_SCOPE,
        retention_days=settings.retention_days,
        functions=rows,
        use=_use(rows),
        leftovers=_leftovers(store, found),
        live_leases=sum(1 for lease in found.leases if lease.holder_alive),
        notes=_notes(rows),
    )


def _row(
    p: Plugin,
    job: Job,
    attempt: Attempt | None,
    latest: dict[tuple[int, str, str], tuple[float, float]],
    processes: list[leftovers.FunctionProcess],
) -> FunctionInUse:
    instances = latest.get((p.job_id, p.name, INSTANCES))
    percent = latest.get((p.job_id, p.name, MEMORY_PERCENT))
    memory_mb = int(p.runtime["memory_mb"]) if "memory_mb" in p.runtime else None
    count = int(instances[0]) if instances is not None else None
    return FunctionInUse(
        job_id=p.job_id,
        job_name=job.name,
        job_status=job.status,
        attempt=attempt.number if attempt else None,
        attempt_pid=attempt.pid if attempt else None,
        attempt_alive=bool(attempt and attempt.pid and leftovers.is_alive(attempt.pid)),
        plugin=p.name,
        role=p.role,
        status=p.status,
        entry=p.entry,
        limits=dict(p.runtime),
        instances=count,
        memory_mb=memory_mb,
        memory_used_mb=round(percent[0] * memory_mb / 100, 1) if percent and memory_mb else None,
        memory_reserved_mb=(count or 0) * (memory_mb or 0),
        sampled_at=instances[1] if instances is not None else None,
        processes=_roles(processes, attempt.pid if attempt else None),
    )


def _processes_by_plugin(
    found: leftovers.Leftovers, attempt: Attempt | None, job: Job, plugins: dict[str, Plugin], state: Path
) -> dict[str, list[leftovers.FunctionProcess]]:
    """Each plugin's processes (root only: a uid per function). An attempt deploys its plugins one
    after another in job.yaml's order (rollout, graders, group graders), leasing each one's uid as it
    does, so the attempt's leases by time are its plugins in that order; a uid is named only when its
    processes run with that plugin's snapshot gid (so a wrong guess names nothing)."""
    if attempt is None or not attempt.pid:
        return {}
    leased = sorted((x for x in found.leases if x.holder == attempt.pid), key=lambda x: x.leased_at_ns)
    order = [e.name for e in named_entries(job.spec.get("plugins"), {})]
    if not leased or len(leased) > len(order):
        return {}
    procs = leftovers.processes_of({x.uid for x in leased})
    out = {}
    for name, lease in zip(order, leased, strict=False):  # the first ones, while it deploys
        plugin = plugins.get(name)
        mine = [x for x in procs if x.uid == lease.uid]
        gid = group_of(state / "code" / plugin.code_hash) if plugin and plugin.code_hash else None
        if mine and all(x.gid == gid for x in mine):
            out[name] = mine
    return out


def _roles(processes: list[leftovers.FunctionProcess], runtime_pid: int | None) -> list[FunctionProcess]:
    """Each process as its function's zygote (started by the attempt's runtime), an instance (forked
    by the zygote) or a process one of them started (a daemon, a subprocess)."""
    zygotes = {p.pid for p in processes if p.ppid == runtime_pid}
    return [
        FunctionProcess(
            pid=p.pid,
            role="zygote" if p.pid in zygotes else "instance" if p.ppid in zygotes else "started by it",
            rss_mb=p.rss_mb,
        )
        for p in processes
    ]


def end_stale(store: Store) -> tuple[list[Leftover], leftovers.Ended]:
    """End what killed runtimes left (their functions' processes, uid leases and cgroups); returns
    what was found (with its jobs) and what was ended. Runtimes that still run are not touched."""
    found = leftovers.find()
    return _leftovers(store, found), leftovers.end(found)


def _running(attempts: list[Attempt]) -> Attempt | None:
    running = [a for a in attempts if a.status == "running"]
    return running[-1] if running else None


def _latest(store: Store, job_ids: list[int]) -> dict[tuple[int, str, str], tuple[float, float]]:
    out = {}
    for m in store.latest_metrics(job_ids):
        if m.plugin and m.name in (INSTANCES, MEMORY_PERCENT):
            out[(m.job_id, m.plugin, m.name)] = (m.value, m.time)
    return out


def _use(rows: list[FunctionInUse]) -> list[RuntimeUse]:
    by_attempt: dict[tuple[int, int | None], list[FunctionInUse]] = {}
    for row in rows:
        by_attempt.setdefault((row.job_id, row.attempt), []).append(row)
    return [
        RuntimeUse(
            job_id=job_id,
            attempt=attempt,
            functions=sum(1 for r in group if r.status == "running"),
            instances=sum(r.instances or 0 for r in group),
            memory_reserved_mb=sum(r.memory_reserved_mb for r in group),
        )
        for (job_id, attempt), group in sorted(by_attempt.items(), key=lambda kv: kv[0][0])
    ]


def _leftovers(store: Store, found: leftovers.Leftovers) -> list[Leftover]:
    holders = sorted({lease.holder for lease in found.stale_leases} | {c.holder for c in found.cgroups})
    attempts = {a.pid: a for a in store.attempts_of_pids(holders)}  # the newest attempt of a pid wins
    jobs = {a.job_id: store.get_job(a.job_id) for a in attempts.values()}

    def leftover(kind: str, what: str, holder: int, processes: tuple[int, ...]) -> Leftover:
        attempt = attempts.get(holder)
        job = jobs.get(attempt.job_id) if attempt else None
        return Leftover(
            kind=kind,
            what=what,
            holder_pid=holder,
            job_id=attempt.job_id if attempt else None,
            job_status=job.status if job else "",
            attempt=attempt.number if attempt else None,
            processes=processes,
        )

    out = [leftover("uid lease", f"uid {x.uid}", x.holder, x.processes) for x in found.stale_leases]
    out += [leftover("cgroup", str(c.path), c.holder, c.processes) for c in found.cgroups]
    return out


def _notes(rows: list[FunctionInUse]) -> list[str]:
    gone = sorted({(r.job_id, r.attempt_pid) for r in rows if not r.attempt_alive and r.attempt_pid})
    return [
        f"job {job_id}: its attempt's process (pid {pid}) is gone; its plugins are settled when the "
        "server that supervises it next looks (or restarts)"
        for job_id, pid in gone
    ]
