"""The demo task shipped with plugtune: a tiny Llama chat model that adds numbers, badly.

``model/`` is produced by ``scripts/make_demo_model.py``; ``data/`` holds the task's rows and
``plugins/`` its rollout and exact-match grader.
"""

from __future__ import annotations

from pathlib import Path

DEMO_DIR = Path(__file__).resolve().parent
MODEL_DIR = DEMO_DIR / "model"
DATA_DIR = DEMO_DIR / "data"
PLUGINS_DIR = DEMO_DIR / "plugins"
