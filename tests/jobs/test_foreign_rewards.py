"""PT405 (issue 24, item 13): a TRL- or verl-shaped reward function that job.yaml names as a grader
is recognised, and the @grader that the finding's fix spells out, pasted as it is, lints clean and
grades a real job."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
import yaml

from plugtune.jobs.control import create_job
from plugtune.jobs.scheduler import run_job
from plugtune.lint import lint_paths
from plugtune.settings import Settings
from plugtune.store import Store
from tests.jobs.jobkit import ROWS, make_job

pytestmark = pytest.mark.slow

FOREIGN = """
def accuracy_reward(prompts, completions, answer, **kwargs):
    return [float(c.strip() == a) + 0.1 * len(c) for c, a in zip(completions, answer, strict=True)]


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    assert data_source == "arith" and extra_info["ground_truth"] == ground_truth
    return float(solution_str.strip() == ground_truth) + 0.01 * len(solution_str)
"""


def _pasted_fix(fix: str) -> str:
    """The grader the fix spells out (`@grader def name(...): return ...`) as module source."""
    code = re.search(r"add `(@grader def .+?)`(?: \(|, then)", fix)
    assert code, fix
    head, body = code[1].removeprefix("@grader ").split(": return ", 1)
    return f"@grader\n{head}:\n    return {body}\n"


def test_the_fix_of_a_trl_and_a_verl_reward_function_grades_a_real_job(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    rows = [
        {**r, "extra": {**r["extra"], "data_source": "arith", "ground_truth": r["extra"]["answer"]}}
        for r in ROWS
    ]
    job_file = make_job(tmp_path / "p", grader=FOREIGN, rows=rows, hyper={"steps": 1, "max_new_tokens": 8})
    spec = yaml.safe_load(job_file.read_text())
    spec["plugins"]["graders"] = [
        {"entry": "plugins/grader.py:accuracy_reward"},
        {"entry": "plugins/grader.py:compute_score"},
    ]
    job_file.write_text(yaml.safe_dump(spec, sort_keys=False))

    findings = lint_paths([tmp_path / "p"]).findings
    assert [(f.rule, f.line) for f in findings] == [("PT405", 2), ("PT405", 6)], findings
    trl, verl = findings
    assert "is a TRL reward function" in trl.message and "job.yaml names it" in trl.message
    assert "is a verl reward function" in verl.message and "@grader" not in trl.message
    grader_py = tmp_path / "p" / "plugins" / "grader.py"
    pasted = "\n".join(_pasted_fix(f.fix) for f in findings)
    grader_py.write_text("from plugtune import grader\n" + textwrap.dedent(FOREIGN) + "\n\n" + pasted)
    spec["plugins"]["graders"] = [
        {"entry": "plugins/grader.py:grade_accuracy_reward"},
        {"entry": "plugins/grader.py:grade_compute_score"},
    ]
    job_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    assert lint_paths([tmp_path / "p"]).findings == []

    job_id, invalid = create_job(store, job_file)
    assert invalid is None, invalid
    assert run_job(store, home, job_id, wait_for_retries=False) == "succeeded", store.get_job(job_id)
    scored = store.trajectories(job_id, limit=50)
    assert scored and all(t.status == "success" and t.reward is not None and t.reward > 0 for t in scored)
