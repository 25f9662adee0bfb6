"""The Plugin tab's default range, the plugin's lifetime, for a plugin that never started."""

from __future__ import annotations

from pathlib import Path

from plugtune.store import Store
from plugtune.web import charts


def test_a_plugin_that_never_deployed_has_no_hour_long_lifetime(tmp_path: Path) -> None:
    """A grader that failed to deploy (or whose job ended first) never ran: its lifetime is the
    moment it ended, with the usual margin, not the hour before it."""
    store = Store.open(f"sqlite:///{tmp_path / 'plugtune.db'}")
    job_id = store.create_job("never-deployed", {})
    store.upsert_plugin(job_id, "exact", "grader", "plugins/graders.py:exact")
    store.set_plugin_status(job_id, "exact", "failed", failure_reason="Create faas fault", at=1_000_000.0)
    plugin = next(p for p in store.list_plugins(job_id) if p.name == "exact")
    assert plugin.started_at is None and plugin.ended_at == 1_000_000.0
    start, end = charts.window(charts.LIFETIME, None, None, plugin)
    assert start < 1_000_000.0 < end and end - start <= 2 * charts.MIN_MARGIN_S
    store.close()
