"""``plugtune data quarantine JOB --export clean.jsonl``: a job's training dataset written without
the rows it quarantined (poison rows, :mod:`plugtune.trainer.poison`; ``report.quarantined_rows``
lists them)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from plugtune.jobs.report import quarantined_rows
from plugtune.store import Store


@dataclass(frozen=True)
class Export:
    source: Path
    target: Path
    lines_kept: int
    lines_dropped: list[int]


def export_clean(store: Store, job_id: int, target: Path, *, force: bool = False) -> Export:
    """Write the job's training dataset to ``target`` without its quarantined lines (every other
    line as it is, blank ones too). Raises ValueError saying why it cannot: the job quarantined no
    row, its dataset file is gone, changed since (a quarantined line is not there), or ``target`` is
    the dataset itself or exists (without ``force``)."""
    rows = quarantined_rows(store, job_id)
    if not rows:
        raise ValueError(f"job {job_id} quarantined no dataset row: there is nothing to leave out")
    files = {r.file for r in rows}
    if len(files) != 1:
        raise ValueError(f"job {job_id}'s quarantined rows name more than one file: {sorted(files)}")
    source = Path(files.pop())
    if not source.is_file():
        raise ValueError(f"{source}: the job's training dataset is not there any more")
    if target.exists() and target.resolve() == source.resolve():
        raise ValueError(f"{target}: this is the job's training dataset; export to another file")
    if target.exists() and not force:
        raise ValueError(f"{target} exists; pass --force to overwrite it")
    text = source.read_bytes().decode("utf-8")
    lines = text.splitlines(keepends=True)  # as the dataset was read: line numbers match
    drop = sorted({r.line for r in rows})
    missing = [n for n in drop if n > len(lines) or not lines[n - 1].strip()]
    if missing:
        raise ValueError(
            f"{source}: line(s) {', '.join(map(str, missing))} that the job quarantined hold no row "
            "now: the file changed since the job read it"
        )
    dropped = set(drop)
    kept = [line for number, line in enumerate(lines, start=1) if number not in dropped]
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    partial.write_text("".join(kept), encoding="utf-8")
    partial.replace(target)
    return Export(source, target, sum(1 for line in kept if line.strip()), drop)
