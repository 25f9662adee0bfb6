from __future__ import annotations

from pathlib import Path

import pytest

from plugtune.trainer.testing import tiny_model_dir


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("tiny-model"), seed=0)
