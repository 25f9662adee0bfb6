"""A learning rate that blows the model up says so (issue 24, item 13): at 1e30 one step leaves the
weights near 1e30 and every reward at 0, which passed silently; a usual step does not warn."""

from __future__ import annotations

import math
from pathlib import Path

from plugtune.trainer.health import EXPLODING, exploding_warnings
from tests.trainer.test_grpo import make_trainer


def test_a_weight_or_gradient_norm_past_the_limit_warns_and_usual_values_do_not() -> None:
    [warning] = exploding_warnings(3, {"weights/max_abs": 2e30, "grad_norm": 0.5}, learning_rate=1e30)
    assert warning.key == "exploding"
    assert warning.message.startswith("step 3: the largest trained weight is 2e+30 (above 10000)")
    assert "learning_rate (now 1e+30" in warning.message and "weights/max_abs" in warning.message
    [both] = exploding_warnings(1, {"weights/max_abs": math.inf, "grad_norm": 5e6}, learning_rate=1e-2)
    assert "largest trained weight is inf and the gradient norm before clipping is 5e+06" in both.message
    assert exploding_warnings(1, {"weights/max_abs": math.nan}, learning_rate=1.0)  # NaN is not "fine"
    assert exploding_warnings(1, {"weights/max_abs": 3.2, "grad_norm": 40.0}, learning_rate=1e-5) == []
    assert exploding_warnings(1, {}, learning_rate=1e-5) == []


async def test_a_learning_rate_of_1e30_warns_after_its_first_step(tiny_model_path: Path) -> None:
    trainer = make_trainer(tiny_model_path, steps=2, learning_rate=1e30)
    result = await trainer.step()
    assert result.metrics["weights/max_abs"] > 1e20
    [warning] = [w for w in result.warnings if w.key == "exploding"]
    assert "the largest trained weight is" in warning.message and "(now 1e+30" in warning.message


async def test_a_usual_step_reports_its_largest_weight_without_a_warning(tiny_model_path: Path) -> None:
    trainer = make_trainer(tiny_model_path, steps=2, learning_rate=1e-5)
    result = await trainer.step()
    assert 0 < result.metrics["weights/max_abs"] < EXPLODING
    assert [w for w in result.warnings if w.key == "exploding"] == []
