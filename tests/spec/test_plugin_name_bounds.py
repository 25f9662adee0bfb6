"""A plugin's name is part of the names its metrics are stored under (the store keeps 200
characters): a function name too long to be one is refused at its job.yaml line, and a plugin
metric's own name is cut so that the stored name always fits."""

from __future__ import annotations

from pathlib import Path

import pytest

from plugtune.errors import InvalidValueError
from plugtune.jobs.plugin_metrics import STORED_NAME_MAX, PluginMetrics
from plugtune.spec.validation import validate_job

LONG = "grade_" + "x" * 150


def _job(root: Path, grader: str, name: str = "") -> Path:
    (root / "plugins").mkdir(parents=True)
    (root / "plugins/g.py").write_text(
        f"from plugtune import grader\n\n@grader\ndef {LONG}(ctx, sample, trajectory):\n    return 1.0\n"
        "\n@grader\ndef short(ctx, sample, trajectory):\n    return 1.0\n"
    )
    (root / "data").mkdir()
    (root / "data/train.jsonl").write_text('{"messages": [{"role": "user", "content": "x"}]}\n')
    named = f", name: {name}" if name else ""
    job = root / "job.yaml"
    job.write_text(
        "name: j\nmodel: builtin:tiny-chat\ndata: {train: data/train.jsonl}\nplugins:\n"
        f"  graders:\n    - {{entry: plugins/g.py:short}}\n    - {{entry: plugins/g.py:{grader}{named}}}\n"
    )
    return job


def test_a_grader_whose_function_name_is_too_long_to_key_its_metrics_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidValueError) as caught:
        validate_job(_job(tmp_path, LONG), check_model=False)
    [found] = caught.value.problems
    assert (found.line, found.field) == (7, "plugins.graders[1].entry"), found
    assert f"is {len(LONG)} characters, over 100" in found.message and "shorter `name:`" in found.message
    assert validate_job(_job(tmp_path / "b", LONG, name="long_one"), check_model=False)  # its name: is fine


def test_a_plugin_metrics_stored_name_always_fits_the_store() -> None:
    metrics = PluginMetrics()
    plugin = "p" * 100  # the longest plugin name
    metrics.add(plugin, {"m" * 500: 1.0, "short": 2.0})
    for prefix in ("", "eval/"):
        names = metrics.flat(prefix)
        assert names and all(len(name) <= STORED_NAME_MAX for name in names), max(map(len, names))
        assert f"{prefix}metric/{plugin}/short/mean" in names
