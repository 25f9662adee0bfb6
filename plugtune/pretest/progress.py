"""The live progress display of ``plugtune test --faas`` (on stderr; never in ``--json`` mode)."""

from __future__ import annotations

from collections import Counter
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from plugtune.pretest.calls import CallRecord


class LiveProgress:
    """Counts finished rollouts against the total, and calls and errors by cause, as they come."""

    def __init__(self, total_rollouts: int, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.progress = Progress(
            TextColumn("rollouts"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        )
        self.task = self.progress.add_task(
            "rollouts", total=total_rollouts, detail="· starting: deploying plugins, loading the policy"
        )
        self.calls = 0
        self.errors: Counter[str] = Counter()

    def __enter__(self) -> LiveProgress:
        self.progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.progress.stop()

    def on_call(self, record: CallRecord) -> None:
        self.calls += 1
        if record.error is not None:
            self.errors[record.error.cause] += 1
        advance = 1 if record.kind == "rollout" else 0
        causes = ", ".join(f"{cause} {n}" for cause, n in self.errors.most_common())
        detail = f"· {self.calls} calls · {sum(self.errors.values())} errors"
        detail += f" ({causes})" if causes else ""
        self.progress.update(self.task, advance=advance, detail=detail)
