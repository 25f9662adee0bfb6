from __future__ import annotations

from pathlib import Path

TASK = Path(__file__).parent / "task"
