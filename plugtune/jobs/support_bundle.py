"""The support bundle written after the last automatic retry fails: everything to file a ticket."""

from __future__ import annotations

import io
import json
import platform
import sys
import time
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

from plugtune.home import private_dir

PACKAGES = ("plugtune", "torch", "transformers", "tokenizers", "fastapi", "sqlalchemy", "openai")


def versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def write_bundle(
    directory: Path,
    *,
    job: dict[str, Any],
    attempts: list[dict[str, Any]],
    code: dict[str, dict[str, bytes]],
    logs: list[dict[str, Any]],
) -> Path:
    """Write ``support-<job>-<time>.zip`` into ``directory`` and return its path."""
    private_dir(directory)  # a job's code, logs and errors: the home owner's alone
    path = directory / f"support-{job['id']}-{time.strftime('%Y%m%d-%H%M%S')}.zip"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as bundle:
        bundle.writestr("job.json", json.dumps(job, indent=2, default=str))
        bundle.writestr("error.json", json.dumps(job.get("error") or {}, indent=2, default=str))
        bundle.writestr("attempts.json", json.dumps(attempts, indent=2, default=str))
        bundle.writestr("logs.jsonl", "\n".join(json.dumps(line, default=str) for line in logs))
        bundle.writestr("environment.json", json.dumps(versions(), indent=2))
        for code_hash, files in code.items():
            for relpath, content in files.items():
                bundle.writestr(f"code/{code_hash[:12]}/{relpath}", content)
    path.write_bytes(buffer.getvalue())
    return path
