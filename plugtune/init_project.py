"""``plugtune init DIR``: write a ready project (plugins, data, job.yaml, README) from the template.

The template lives in ``plugtune/project_template``; Python files there end in ``.py.tmpl`` so the
package never imports them. The project's ``job.yaml`` uses ``model: builtin:tiny-chat``, the demo
model packaged with plugtune, so the project works on any machine without a download.
"""

from __future__ import annotations

import re
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

TEMPLATE_NAME = "plugtune-project"
SUFFIX = ".tmpl"
RENAMED_IN = ("job.yaml", "README.md")


class ProjectExistsError(FileExistsError):
    """Raised when the target folder exists and is not empty: init never overwrites files."""


def project_name(text: str) -> str:
    """A valid job name from a folder name: letters, digits, ``.``, ``_`` and ``-``."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-._")[:100]
    return name or TEMPLATE_NAME


def create_project(dest: str | Path, name: str | None = None) -> list[Path]:
    """Write the template project into ``dest`` (new or empty); return the files written."""
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise ProjectExistsError(f"{dest} exists and is not a folder")
    if dest.is_dir() and any(dest.iterdir()):
        raise ProjectExistsError(
            f"{dest} is not empty; plugtune init only writes into a new or empty folder, "
            "so nothing of yours is overwritten"
        )
    job_name = project_name(name or dest.resolve().name)
    written: list[Path] = []
    for relative, source in _template_files(resources.files("plugtune") / "project_template", ()):
        target = dest.joinpath(*relative)
        if target.name.endswith(SUFFIX):
            target = target.with_name(target.name[: -len(SUFFIX)])
        text = source.read_text(encoding="utf-8")
        if target.name in RENAMED_IN:
            text = text.replace(TEMPLATE_NAME, job_name)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        written.append(target)
    return written


def _template_files(
    folder: Traversable, prefix: tuple[str, ...]
) -> list[tuple[tuple[str, ...], Traversable]]:
    out: list[tuple[tuple[str, ...], Traversable]] = []
    for item in sorted(folder.iterdir(), key=lambda t: t.name):
        if item.name.startswith((".", "__")) or item.name.endswith(".pyc"):
            continue
        if item.is_dir():
            out.extend(_template_files(item, (*prefix, item.name)))
        else:
            out.append(((*prefix, item.name), item))
    return out
