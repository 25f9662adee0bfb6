from __future__ import annotations

import pytest

from plugtune.store import NotFoundError, Store
from plugtune.store.plugins import PURGE_CHUNK
from plugtune.types import LogLine, MetricPoint

DAY = 86_400.0


def _declare(store: Store, job_id: int) -> None:
    store.upsert_plugin(job_id, "exact", "grader", "plugins/grader.py:exact", code_hash="g1")
    store.upsert_plugin(
        job_id, "solve", "rollout", "plugins/rollout.py:solve", code_hash="r1", runtime={"timeout_s": 60}
    )


def test_plugins_are_declared_waiting_and_listed_rollout_first(store: Store, job_id: int) -> None:
    _declare(store, job_id)
    solve, exact = store.list_plugins(job_id)
    assert (solve.name, solve.role, solve.status, solve.runtime) == (
        "solve",
        "rollout",
        "waiting",
        {"timeout_s": 60},
    )
    assert (exact.name, exact.role, exact.code_hash) == ("exact", "grader", "g1")
    assert not solve.monitoring_expired and solve.started_at is None


def test_upsert_updates_code_and_keeps_status(store: Store, job_id: int) -> None:
    _declare(store, job_id)
    store.set_plugin_status(job_id, "solve", "running")
    store.upsert_plugin(job_id, "solve", "rollout", "plugins/rollout.py:solve", code_hash="r2")
    plugin = store.get_plugin(job_id, "solve")
    assert plugin is not None and (plugin.code_hash, plugin.status) == ("r2", "running")
    assert len(store.list_plugins(job_id)) == 2
    with pytest.raises(ValueError):
        store.upsert_plugin(job_id, "x", "judge", "a.py:x")


def test_status_lifecycle_stamps_times_and_failure_reason(store: Store, job_id: int) -> None:
    _declare(store, job_id)
    store.set_plugin_status(job_id, "solve", "running", at=1000.0)
    store.set_plugin_status(
        job_id, "solve", "failed", failure_reason="Timeout: call exceeded 60 s", at=1500.0
    )
    plugin = store.get_plugin(job_id, "solve")
    assert plugin is not None
    assert (plugin.status, plugin.failure_reason) == ("failed", "Timeout: call exceeded 60 s")
    assert (plugin.started_at, plugin.ended_at, plugin.retention_expires_at) == (
        1000.0,
        1500.0,
        1500.0 + 7 * DAY,
    )
    store.set_plugin_status(job_id, "solve", "running", at=2000.0)  # a retry starts it again
    plugin = store.get_plugin(job_id, "solve")
    assert plugin is not None and (plugin.started_at, plugin.ended_at, plugin.failure_reason) == (
        1000.0,
        None,
        "",
    )
    with pytest.raises(NotFoundError, match="no plugin 'nope'"):
        store.set_plugin_status(job_id, "nope", "running")
    with pytest.raises(ValueError):
        store.set_plugin_status(job_id, "solve", "sleeping")


def test_code_is_stored_once_per_hash(store: Store) -> None:
    files = {"plugins/rollout.py": b"def solve(ctx):\n    return None\n", "plugins/util.py": "é\n".encode()}
    store.put_code("abc123", files)
    store.put_code("abc123", {"plugins/rollout.py": b"something else"})  # same hash: kept as first stored
    assert store.get_code("abc123") == files
    assert list(store.get_code("abc123")) == sorted(files)
    assert store.get_code("unknown") == {}
    with pytest.raises(ValueError):
        store.put_code("", files)


def _monitor(store: Store, job_id: int, plugin: str, n: int) -> None:
    store.add_logs(
        job_id,
        [LogLine(time=float(i), level="INFO", plugin=plugin, message=f"{plugin} {i}") for i in range(n)],
    )
    store.add_metrics(
        job_id, [MetricPoint(time=float(i), plugin=plugin, name="cpu_percent", value=1.0) for i in range(n)]
    )


def test_purge_expired_deletes_only_ended_plugins_past_retention(store: Store, job_id: int) -> None:
    _declare(store, job_id)
    _monitor(store, job_id, "solve", PURGE_CHUNK + 7)  # more than one delete chunk
    _monitor(store, job_id, "exact", 10)
    store.set_plugin_status(job_id, "solve", "running", at=0.0)
    store.set_plugin_status(job_id, "solve", "completed", at=100.0)
    store.set_plugin_status(job_id, "exact", "running", at=0.0)  # still running: never purged

    assert store.purge_expired(now=100.0 + 7 * DAY - 1) == 0
    assert store.count_logs(job_id, plugin="solve") == PURGE_CHUNK + 7

    assert store.purge_expired(now=100.0 + 7 * DAY) == 1
    assert store.count_logs(job_id, plugin="solve") == 0
    assert store.metrics(job_id, "solve") == {} and store.metric_names(job_id, "solve") == []
    assert store.metric_names(job_id, "exact") == ["cpu_percent"]
    assert store.plugin_monitoring_expired(job_id, "solve")
    assert [p.monitoring_expired for p in store.list_plugins(job_id)] == [True, False]
    assert (
        store.count_logs(job_id, plugin="exact") == 10
        and len(store.metrics(job_id, "exact")["cpu_percent"]) == 10
    )
    assert not store.plugin_monitoring_expired(job_id, "exact")
    assert store.purge_expired(now=100.0 + 30 * DAY) == 0  # already purged


def test_retention_days_comes_from_open(target: object, job_id: int, store: Store) -> None:
    from .conftest import Target

    assert isinstance(target, Target)
    short = Store.open(target.url, schema=target.schema, retention_days=0.5)
    short.upsert_plugin(job_id, "solve", "rollout", "r.py:solve")
    short.set_plugin_status(job_id, "solve", "completed", at=0.0)
    assert short.purge_expired(now=0.5 * DAY) == 1
    short.close()


def test_list_order_is_role_then_name(store: Store, job_id: int) -> None:
    for name, role in [
        ("zeta", "grader"),
        ("rank", "group_grader"),
        ("alpha", "grader"),
        ("solve", "rollout"),
    ]:
        store.upsert_plugin(job_id, name, role, f"p.py:{name}")
    assert [p.name for p in store.list_plugins(job_id)] == ["solve", "alpha", "zeta", "rank"]
