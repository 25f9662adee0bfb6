"""How ``ctx.metric`` values become per-step aggregates (issue 24, item 2): the job's caller over
real in-process plugin calls, names that hold ``/``, eval calls, bounds, and the curves they make."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

from fastapi.testclient import TestClient

from plugtune import grader
from plugtune.jobs import plugin_metrics
from plugtune.jobs.caller import PolicyCaller
from plugtune.jobs.plugin_metrics import MAX_NAMES, PluginMetrics
from plugtune.sdk import Context
from plugtune.spec.models import FailurePolicy
from plugtune.store import Store
from plugtune.trainer.testing import InProcessFunction
from plugtune.web import create_app


@grader
def judge(ctx: Context, sample: object, trajectory: object) -> float:
    ctx.metric("tokens/judge", 10 * ctx.rollout_index)
    ctx.metric("nan", math.nan)  # not a number to aggregate: left out
    return 1.0


def test_the_caller_aggregates_each_steps_ctx_metric_per_plugin_and_name() -> None:
    caller = PolicyCaller(FailurePolicy())
    fn = InProcessFunction(judge)

    async def calls() -> None:
        for step, indexes in ((1, (0, 1, 2)), (2, (3,))):
            for i in indexes:
                await caller(fn, Context(step=step, rollout_index=i), None, None)

    asyncio.run(calls())
    first = {p.name: p.value for p in caller.take_counts(1).metric_points(1)}
    assert {k: v for k, v in first.items() if k.startswith("metric/")} == {
        "metric/judge/tokens/judge/mean": 10.0,
        "metric/judge/tokens/judge/min": 0.0,
        "metric/judge/tokens/judge/max": 20.0,
        "metric/judge/tokens/judge/count": 3.0,
    }
    assert first["plugin/calls"] == 3.0
    second = caller.take_counts(2).metric_points(2, prefix="eval/")
    assert {p.name: p.value for p in second}["eval/metric/judge/tokens/judge/mean"] == 30.0
    # a plugin's name (job.yaml's name:) may hold a "/": the job's plugin names split it right
    assert plugin_metrics.parse("metric/judge/v2/tokens/judge/mean", ["judge/v2"]) == (
        "",
        "judge/v2",
        "tokens/judge",
        "mean",
    )
    assert plugin_metrics.parse("eval/metric/judge/v2/x/max", ["judge/v2"]) == (
        "eval/",
        "judge/v2",
        "x",
        "max",
    )
    assert plugin_metrics.parse("plugin/calls") is None and plugin_metrics.parse("metric/a/b/median") is None


def test_a_plugin_that_makes_up_names_is_bounded() -> None:
    found = PluginMetrics()
    for i in range(MAX_NAMES + 10):
        found.add("judge", {f"sample_{i}": 1.0, "x" * 500: 2.0})
    names = found.stats()["judge"]
    assert len(names) == MAX_NAMES and found.dropped["judge"] == 11  # 74 names made up, 63 fit
    assert "x" * plugin_metrics.MAX_NAME_CHARS in names  # a long name is cut, not dropped


def test_the_curves_put_each_plugins_metrics_in_its_section_with_eval_lines(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'plugtune.db'}")
    try:
        job = store.create_job("effects", {"model": "tiny"})
        store.upsert_plugin(job, "answer", "rollout", "plugins/rollout.py:answer")
        store.upsert_plugin(job, "judge/v2", "grader", "plugins/grader.py:judge")
        points = []
        for step in (1, 2):
            found = PluginMetrics()
            found.add("judge/v2", {"tokens/judge": float(step)})
            found.add("judge/v2", {"tokens/judge": float(step + 2)})
            found.add("answer", {"turns": 1.0})
            points += found.points(step) + found.points(step, prefix="eval/")
        store.add_metrics(job, points)
        client = TestClient(create_app(store), base_url="http://127.0.0.1:8321")
        charts = client.get(f"/api/jobs/{job}/curves").json()["charts"]
        own = [c for c in charts if c["section"]]
        assert [(c["section"], c["key"]) for c in own] == [
            ("Plugin answer", "metric:answer:turns"),
            ("Plugin judge/v2", "metric:judge/v2:tokens/judge"),
        ]
        judge_chart = own[1]
        assert judge_chart["title"] == "tokens/judge (2 values in step 2)"
        lines = {s["name"]: s["points"] for s in judge_chart["series"]}
        assert set(lines) == {"mean", "min", "max", "eval/mean", "eval/min", "eval/max"}
        assert lines["max"] == [[1.0, 3.0], [2.0, 4.0]] and lines["mean"] == [[1.0, 2.0], [2.0, 3.0]]
        assert not [c for c in charts if "metric/" in c["key"]]  # no loose chart per stored name
    finally:
        store.close()
