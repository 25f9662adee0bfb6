"""Build small real jobs for the jobs tests: the demo model, a few rows, plugins from source text."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import yaml

from plugtune.demo import MODEL_DIR

ROLLOUT = """
from plugtune import rollout

@rollout
def answer(ctx, policy, sample):
    reply = policy.chat(sample.messages, temperature=1.0, max_tokens=sample.sampling.max_tokens)
    ctx.logger.info("answered %s", reply["choices"][0]["message"]["content"])
    return None
"""

GRADER = """
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    return 1.0 if trajectory.completion.strip() == sample.extra["answer"] else 0.0
"""

ROWS = [
    {"messages": [{"role": "user", "content": f"What is {a}+{b}?"}], "extra": {"answer": str(a + b)}}
    for a, b in [(1, 2), (3, 4), (12, 30), (5, 5), (20, 21), (7, 8)]
]


def make_job(
    root: Path,
    *,
    rollout: str = ROLLOUT,
    grader: str = GRADER,
    hyper: dict[str, Any] | None = None,
    rollout_runtime: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    rows: list[Any] | None = None,
    grader_weight: float = 1.0,
) -> Path:
    """Write job.yaml, data/train.jsonl and plugins/ under ``root``; return the job.yaml path."""
    (root / "plugins").mkdir(parents=True, exist_ok=True)
    (root / "data").mkdir(exist_ok=True)
    (root / "plugins" / "rollout.py").write_text(textwrap.dedent(rollout))
    (root / "plugins" / "grader.py").write_text(textwrap.dedent(grader))
    lines = [r if isinstance(r, str) else json.dumps(r) for r in (ROWS if rows is None else rows)]
    (root / "data" / "train.jsonl").write_text("\n".join(lines) + "\n")
    spec: dict[str, Any] = {
        "name": root.name,
        "model": str(MODEL_DIR),
        "algorithm": "grpo",
        "hyperparameters": {
            "steps": 2,
            "batch_size": 2,
            "group_size": 2,
            "learning_rate": 1e-3,
            "max_new_tokens": 4,
            "save_every_n_steps": 1,
            **(hyper or {}),
        },
        "data": {"train": "data/train.jsonl"},
        "plugins": {
            "rollout": {
                "entry": "plugins/rollout.py:answer",
                "runtime": {"timeout_s": 30, "max_concurrency": 8, **(rollout_runtime or {})},
            },
            "graders": [{"entry": "plugins/grader.py:exact", "weight": grader_weight}],
        },
        "failure_policy": {"max_attempts": 1, "on_exhausted": "fail_job"},
        "retry": {"platform_delay_s": 0.5, "max_auto_retries": 1},
        **(extra or {}),
    }
    path = root / "job.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path
