"""Shared inputs for the pretest tests: the faulty-plugin project and option builders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plugtune.pretest.command import TestOptions
from plugtune.pretest.faas import Injection

FAULTY = Path(__file__).resolve().parents[1] / "fixtures" / "pretest" / "faulty"


def options(job: str | Path, samples: int = 1, **kwargs: Any) -> TestOptions:
    path = job if isinstance(job, Path) else FAULTY / f"{job}.yaml"
    return TestOptions(job_file=str(path), samples=samples, **kwargs)


def injected(faults: str, rate: float = 1.0, seed: int = 0) -> Injection:
    return Injection.parse(faults, rate, seed)


def causes(doc: dict[str, Any]) -> list[str | None]:
    return [c["error"]["cause"] if c["error"] else None for c in doc["calls"]]
