"""Poison rows in the console and the API: a job's quarantined dataset rows, by file and line, with
the cause, the steps, an example trajectory and the export command; none for a job without."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient

from plugtune.store import Store
from plugtune.trainer.poison import Quarantined, quarantine_message
from plugtune.types import LogLine
from tests.web.seed import Seeded

ROW = Quarantined(
    file="/data/<b>train</b>.jsonl",
    line=4,
    row=2,
    cause="500",
    plugin="exact",
    steps=(2, 5),
    trajectory_id="s5-g0-r0",
)


def _poisoned(store: Store) -> int:
    job = store.create_job("poisoned", {"model": "tiny"})
    store.add_logs(
        job,
        [
            LogLine(time.time(), "WARNING", "", quarantine_message(ROW, 2, str(job)), source="trainer"),
            LogLine(time.time(), "WARNING", "", "an unrelated warning", source="trainer"),
        ],
    )
    return job


def test_the_api_lists_a_jobs_quarantined_rows(client: TestClient, store: Store, seeded: Seeded) -> None:
    job = _poisoned(store)
    got = client.get(f"/api/jobs/{job}/quarantine")
    assert got.status_code == 200, got.text
    assert got.json() == {
        "rows": [
            {
                "file": "/data/<b>train</b>.jsonl",
                "line": 4,
                "row": 2,
                "cause": "500",
                "plugin": "exact",
                "steps": [2, 5],
                "trajectory_id": "s5-g0-r0",
            }
        ],
        "export_command": f"plugtune data quarantine {job} --export clean.jsonl",
    }
    assert client.get(f"/api/jobs/{seeded.done_job}/quarantine").json()["rows"] == []
    assert client.get("/api/jobs/999999/quarantine").status_code == 404


def test_the_job_page_has_a_data_section_only_when_rows_were_quarantined(
    client: TestClient, store: Store, seeded: Seeded
) -> None:
    job = _poisoned(store)
    page = client.get(f"/jobs/{job}").text
    assert 'id="job-data"' in page
    assert "1 dataset row quarantined (Invalid data)" in page
    assert "/data/&lt;b&gt;train&lt;/b&gt;.jsonl:4" in page and "<b>train</b>" not in page  # escaped
    assert f'href="/jobs/{job}/trajectories?t=s5-g0-r0"' in page
    assert f"plugtune data quarantine {job} --export clean.jsonl" in page
    assert 'id="job-data"' not in client.get(f"/jobs/{seeded.done_job}").text
