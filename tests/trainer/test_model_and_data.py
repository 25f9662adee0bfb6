"""Model loading errors name the path; the data cursor is seeded and resumable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from plugtune.errors import InvalidDataError, InvalidValueError
from plugtune.trainer.data import DataCursor
from plugtune.trainer.model import load_model


def test_load_model_gives_eval_float32_model_with_chat_template(tiny_model_path: Path) -> None:
    lm = load_model(tiny_model_path)
    assert not lm.model.training
    assert next(lm.model.parameters()).dtype.is_floating_point
    assert "<|im_start|>assistant" in lm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )


def test_missing_and_non_model_directories_are_named(tmp_path: Path) -> None:
    with pytest.raises(InvalidDataError) as info:
        load_model(tmp_path / "nope")
    assert str(tmp_path / "nope") in str(info.value) and info.value.problems[0].field == "model"
    with pytest.raises(InvalidDataError, match="no config.json"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "not-a-model"}))
    with pytest.raises(InvalidDataError, match="not a loadable Hugging Face causal LM"):
        load_model(tmp_path)


def test_tokenizer_without_chat_template_is_rejected(tiny_model_path: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "m"
    shutil.copytree(tiny_model_path, copy)
    for name in ("chat_template.jinja",):
        (copy / name).unlink(missing_ok=True)
    config = json.loads((copy / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(InvalidValueError, match="no chat template"):
        load_model(copy)


def test_cursor_is_deterministic_covers_each_epoch_and_resumes() -> None:
    a, b = DataCursor(5, seed=3), DataCursor(5, seed=3)
    first = a.take(5)
    assert sorted(first) == [0, 1, 2, 3, 4] and first == b.take(5)
    assert DataCursor(5, seed=4).take(5) != first or DataCursor(5, seed=5).take(5) != first
    a.take(2)
    saved = a.state()
    expected = a.take(7)
    c = DataCursor(5, seed=3)
    c.restore(saved)
    assert c.take(7) == expected
    with pytest.raises(ValueError, match="6 rows"):
        DataCursor(6, seed=3).restore(saved)
