"""Poison rows: a dataset row whose every trajectory failed with the same non-transient cause, in
``poison_after`` different steps, is quarantined: the data cursor passes over it from then on.

A group is a strike against its row when every trajectory of it failed and every failed call on
every one of them (each try) has the same plugin and cause, one of :data:`POISON_CAUSES` (the
row's own fault, as far as the job can tell: the plugin raised, its process died, it ran out of
memory, it returned an invalid reward or reported a failure). A Dependency error, a Timeout (the
machine may have been overloaded), a platform fault or a plugin's Retry never counts. The strike
count and the quarantined set live in the data cursor, so a checkpoint keeps them.

Each quarantine is a step warning whose message (:func:`quarantine_message`) names the data file,
the row's line, the cause and an example trajectory; :func:`parse_quarantine` reads it back from the
job's log (``doctor`` and ``plugtune data quarantine`` list them).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from plugtune.errors import ErrorType
from plugtune.trainer.data import DataCursor
from plugtune.trainer.health import StepWarning
from plugtune.types import TrajectoryRecord

#: The causes of a failed call that can make a row a poison row.
POISON_CAUSES = frozenset({"500", "EOF", "FaaS OOM", "Invalid reward", "Status failure"})

#: The key of a quarantine's step warning starts with this (one warning per row).
WARNING_KEY = "poison_row"


@dataclass(frozen=True)
class RowSource:
    """Where the dataset's rows come from: the file and each row's 1-based line in it."""

    file: str = "the dataset"
    lines: Sequence[int] = ()

    def line_of(self, index: int) -> int:
        return self.lines[index] if index < len(self.lines) else index + 1


@dataclass(frozen=True)
class Quarantined:
    """One quarantined row, as its warning says it."""

    file: str
    line: int
    row: int
    cause: str
    plugin: str
    steps: tuple[int, ...]
    trajectory_id: str

    def to_dict(self) -> dict[str, object]:
        return {
            "file": self.file,
            "line": self.line,
            "row": self.row,
            "cause": self.cause,
            "plugin": self.plugin,
            "steps": list(self.steps),
            "trajectory_id": self.trajectory_id,
        }


@dataclass
class PoisonReport:
    """What one step found: the warnings of rows quarantined by it and its metrics."""

    warnings: list[StepWarning] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)


def poison_cause(group: Sequence[TrajectoryRecord]) -> tuple[str, str] | None:
    """``(plugin, cause)`` when every trajectory of ``group`` failed and every failed call on each
    has that plugin and non-transient cause; None otherwise."""
    found: tuple[str, str] | None = None
    for record in group:
        if record.status != "failed" or not record.errors:
            return None
        for error in record.errors:
            if error.type != ErrorType.CALL_PLUGIN.value or error.cause not in POISON_CAUSES:
                return None
            key = (error.plugin, error.cause)
            if found is None:
                found = key
            elif key != found:
                return None
    return found


def observe(
    cursor: DataCursor,
    step: int,
    groups: Sequence[Sequence[TrajectoryRecord]],
    poison_after: int,
    source: RowSource,
    job_id: str = "",
) -> PoisonReport:
    """Count ``step``'s poisoned groups against their rows and quarantine the rows that reach
    ``poison_after`` (0: off, nothing counted). Metrics: ``data/poison_groups`` and
    ``data/poison_calls`` (the failed calls those groups cost this step) and
    ``data/quarantined_rows`` (rows quarantined so far)."""
    report = PoisonReport()
    if poison_after <= 0:
        return report
    groups_hit = calls = 0
    counted: set[int] = set()
    for group in groups:
        found = poison_cause(group) if group else None
        if found is None:
            continue
        plugin, cause = found
        groups_hit += 1
        calls += sum(len(r.errors) for r in group)
        index = group[0].sample_index
        if index in cursor.quarantined or index in counted:
            continue
        counted.add(index)
        if cursor.strike(index, step, f"{plugin}\t{cause}") < poison_after:
            continue
        if cursor.available <= 1:
            # The last row left is not quarantined: the job goes on failing on it, as it would without.
            continue
        cursor.quarantine(index)
        entry = Quarantined(
            file=source.file,
            line=source.line_of(index),
            row=index,
            cause=cause,
            plugin=plugin,
            steps=cursor.strikes[index][1],
            trajectory_id=group[0].trajectory_id,
        )
        report.warnings.append(
            StepWarning(f"{WARNING_KEY}:{index}", quarantine_message(entry, poison_after, job_id))
        )
    report.metrics = {
        "data/poison_groups": float(groups_hit),
        "data/poison_calls": float(calls),
        "data/quarantined_rows": float(len(cursor.quarantined)),
    }
    return report


def quarantine_message(entry: Quarantined, poison_after: int, job_id: str = "") -> str:
    steps = ", ".join(map(str, entry.steps))
    job = job_id or "JOB"
    return (
        f"Invalid data: {entry.file} line {entry.line} (row {entry.row}) is quarantined: every "
        f"trajectory of it failed with {entry.cause} in {entry.plugin or 'a plugin'} on "
        f"{len(entry.steps)} steps ({steps}); it is no longer sampled (hyperparameters.poison_after: "
        f"{poison_after}) (example trajectory {entry.trajectory_id}). Fix the row, or write the "
        f"dataset without it: plugtune data quarantine {job} --export clean.jsonl"
    )


_MESSAGE = re.compile(
    r"^Invalid data: (?P<file>.+) line (?P<line>\d+) \(row (?P<row>\d+)\) is quarantined: every "
    r"trajectory of it failed with (?P<cause>.+?) in (?P<plugin>.+?) on \d+ steps "
    r"\((?P<steps>[\d, ]+)\); .*?\(example trajectory (?P<trajectory>[^)\s]+)\)\. "
)


def parse_quarantine(message: str) -> Quarantined | None:
    """The quarantined row a job warning names (None: not a quarantine warning)."""
    m = _MESSAGE.match(message)
    if m is None:
        return None
    plugin = m["plugin"]
    return Quarantined(
        file=m["file"],
        line=int(m["line"]),
        row=int(m["row"]),
        cause=m["cause"],
        plugin="" if plugin == "a plugin" else plugin,
        steps=tuple(int(s) for s in m["steps"].split(", ")),
        trajectory_id=m["trajectory"],
    )
