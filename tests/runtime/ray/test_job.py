"""A real job with ``plugins.runtime_backend: ray`` end to end on the two-node cluster: its rollouts
and graders run as Ray actors, and the store and the console show what a local job shows — the
same trajectories, plugin rows, code snapshot, log lines and resource metrics, and for a failing
grader the same failure banner and Plugin tab."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from plugtune.jobs.control import create_job
from plugtune.jobs.scheduler import run_job
from plugtune.runtime.ray import LocalCluster
from plugtune.settings import Settings
from plugtune.store import Store
from plugtune.web import create_app
from tests.jobs.jobkit import make_job

pytestmark = pytest.mark.slow

BASE_URL = "http://127.0.0.1:8321"
CRASHING_GRADER = """
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    ctx.logger.info("grading %s", ctx.sample_id)
    return int(sample.extra["missing_key"])
"""


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cluster: LocalCluster) -> Settings:
    state = tmp_path / "state"
    monkeypatch.setenv("PLUGTUNE_HOME", str(state))
    monkeypatch.setenv("PLUGTUNE_DATABASE_URL", f"sqlite:///{state / 'plugtune.db'}")
    monkeypatch.setenv("PLUGTUNE_RAY_ADDRESS", cluster.address)
    return Settings.from_env()


@pytest.fixture
def store(home: Settings) -> Iterator[Store]:
    opened = Store.open(home.database_url)
    yield opened
    opened.close()


def job_on(root: Path, backend: str, **kwargs: Any) -> Path:
    """The jobs tests' small job (rollouts on half a CPU: each Ray node has one)."""
    path = make_job(root, rollout_runtime={"cpu": 0.5}, **kwargs)
    spec = yaml.safe_load(path.read_text())
    spec["plugins"]["runtime_backend"] = backend
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def run(store: Store, home: Settings, job_file: Path) -> tuple[int, str]:
    job_id, invalid = create_job(store, job_file)
    assert invalid is None, invalid
    return job_id, run_job(store, home, job_id)


def what_the_store_holds(store: Store, job_id: int) -> dict[str, Any]:
    plugins = store.list_plugins(job_id)
    return {
        "trajectories": store.count_trajectories(job_id),
        "plugins": [(p.name, p.role, p.status) for p in plugins],
        "code": {p.name: sorted(store.get_code(p.code_hash)) for p in plugins},
        "answered": bool(store.logs(job_id, plugin="answer", text="answered", limit=1)),
        "metrics": {p.name: set(store.metric_names(job_id, p.name)) for p in plugins},
        "training": "reward/mean" in store.metric_names(job_id),
    }


def test_a_ray_job_writes_what_a_local_job_writes_and_the_console_shows_it(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    local_id, local_status = run(store, home, job_on(tmp_path / "local", "local"))
    ray_id, ray_status = run(store, home, job_on(tmp_path / "ray", "ray"))
    assert (local_status, ray_status) == ("succeeded", "succeeded"), store.get_job(ray_id).error  # type: ignore[union-attr]

    local, on_ray = what_the_store_holds(store, local_id), what_the_store_holds(store, ray_id)
    assert on_ray == local, (on_ray, local)
    assert on_ray["trajectories"] == 2 * 2 * 2 and on_ray["answered"]
    assert {"exec_qps", "memory_percent", "instances", "cpu_percent"} <= on_ray["metrics"]["answer"]
    lines = store.logs(ray_id, plugin="answer", text="answered", limit=50)
    assert all(line.trajectory_id for line in lines)  # each line names its trajectory ...
    assert {line.instance_id.split("-")[0][0] for line in lines} == {"r"}  # ... and its Ray actor
    assert store.logs(ray_id, plugin="answer", text="on Ray", limit=1)  # the runtime says where

    client = TestClient(create_app(store), base_url=BASE_URL)
    for page in ("plugins?plugin=answer", "plugins?plugin=exact", "logs?plugin=answer"):
        html = client.get(f"/jobs/{ray_id}/{page}")
        assert html.status_code == 200, (page, html.text[:500])
    tab = client.get(f"/jobs/{ray_id}/plugins", params={"plugin": "answer"}).text
    assert 'id="plugin-status">completed<' in tab and "def</span> <span" in tab  # the code that ran
    code = client.get(f"/api/jobs/{ray_id}/plugins/answer/code.zip")
    assert (
        code.status_code == 200
        and code.content == client.get(f"/api/jobs/{local_id}/plugins/answer/code.zip").content
    )
    series = client.get(f"/api/jobs/{ray_id}/plugins/answer/metrics").json()
    local_series = client.get(f"/api/jobs/{local_id}/plugins/answer/metrics").json()
    assert sorted(series) == sorted(local_series)
    logs = client.get(f"/api/jobs/{ray_id}/logs", params={"plugin": "answer", "q": "answered"}).json()
    assert logs["items"] and all(item["plugin"] == "answer" for item in logs["items"])


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_a_failing_grader_shows_the_same_banner_and_plugin_tab_on_both_backends(
    tmp_path: Path, store: Store, home: Settings, backend: str
) -> None:
    job_id, status = run(store, home, job_on(tmp_path / "crash", backend, grader=CRASHING_GRADER))
    assert status == "failed"
    job = store.get_job(job_id)
    assert job is not None and job.error is not None
    error = job.error.to_dict()
    assert (error["type"], error["owner"], error["cause"]) == ("Call plugin error", "plugin", "500")
    assert "KeyError" in error["message"] and "Traceback" not in error["message"]
    assert "ray" not in error["message"].lower()
    assert "grader.py" in str(error["evidence"].get("traceback"))

    client = TestClient(create_app(store), base_url=BASE_URL)
    banner = client.get(f"/jobs/{job_id}").text.split('id="failure-banner"')[1].split("</section>")[0]
    assert "Call plugin error" in banner and 'id="failure-owner">plugin<' in banner
    assert f'href="/jobs/{job_id}/plugins?plugin=exact"' in banner
    tab = client.get(f"/jobs/{job_id}/plugins", params={"plugin": "exact"}).text
    assert 'id="plugin-status">failed<' in tab and 'class="failed-line"' in tab  # grader.py's line
    assert store.logs(job_id, plugin="exact", text="grading", limit=1), "the grader's own log lines"
