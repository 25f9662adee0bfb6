"""``DataCursor``: walks dataset rows in a seeded order, epoch after epoch, and resumes exactly."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any


class DataCursor:
    """Yields row indices in a per-epoch shuffled order that depends only on ``seed``, the epoch and
    the rows the batch that crossed into the epoch already held.

    A batch never holds a row twice unless the dataset has fewer rows than the batch: at an epoch
    boundary the batch takes what is left of the old epoch, then fills up from the new epoch's
    shuffle with rows it does not hold yet; the rows it held come right after them, so every row
    is still drawn once per epoch. ``state()`` / ``restore()`` capture the position, so a resumed
    run sees the same rows next.

    Quarantined rows (poison rows, :mod:`plugtune.trainer.poison`) keep their place in the shuffle
    and are passed over when their turn comes, so the order of the other rows does not change; the
    quarantined set and the strikes that lead to it are part of the state.
    """

    def __init__(self, num_rows: int, seed: int) -> None:
        if num_rows < 1:
            raise ValueError("a DataCursor needs at least one row")
        self.num_rows = num_rows
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self.carried: tuple[int, ...] = ()  # the rows of the batch that crossed into this epoch
        self.fill = 0  # how many new rows of this epoch's shuffle come before the carried ones
        # Replaced, never changed in place: a copy of the cursor (a step's cursor_before) keeps its own.
        self.quarantined: frozenset[int] = frozenset()
        self.strikes: dict[int, tuple[str, tuple[int, ...]]] = {}  # row -> (cause, steps it failed in)
        self._order = self._order_of(0)

    @property
    def available(self) -> int:
        """How many rows are still sampled (not quarantined)."""
        return self.num_rows - len(self.quarantined)

    def strike(self, index: int, step: int, cause: str) -> int:
        """Count that row ``index`` failed with ``cause`` at ``step``; the number of steps it has
        failed in with that cause (a different cause starts the count again)."""
        old_cause, steps = self.strikes.get(index, (cause, ()))
        if old_cause != cause:
            steps = ()
        if step not in steps:
            steps = (*steps, step)
        self.strikes = {**self.strikes, index: (cause, steps)}
        return len(steps)

    def quarantine(self, index: int) -> None:
        """Pass over row ``index`` from now on (a checkpoint keeps it)."""
        if not 0 <= index < self.num_rows:
            raise ValueError(f"row {index} is not a row of this dataset ({self.num_rows} rows)")
        self.quarantined = self.quarantined | {index}

    def _shuffle(self, epoch: int) -> list[int]:
        order = list(range(self.num_rows))
        random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def _order_of(self, epoch: int) -> list[int]:
        order = self._shuffle(epoch)
        if not self.carried:
            return order
        held = set(self.carried)
        fresh = [i for i in order if i not in held]
        return fresh[: self.fill] + [i for i in order if i in held] + fresh[self.fill :]

    def take(self, n: int) -> list[int]:
        """The next ``n`` row indices. At an epoch boundary the batch goes on with the next
        (reshuffled) epoch, first the rows it does not hold yet: no row twice in a batch when the
        dataset has ``n`` rows, and as few repeats as can be when it has fewer. Quarantined rows
        are passed over."""
        available = self.available
        if available < 1:
            raise ValueError(f"all {self.num_rows} rows of the dataset are quarantined: none left to sample")
        out: list[int] = []
        since = 0  # where the rows of the current epoch start in ``out``
        while len(out) < n:
            if self.position >= self.num_rows:
                held = out[since:] if len(out) - since < available else []
                self._start_epoch(held, min(n - len(out), available - len(held)))
                since = len(out)
            index = self._order[self.position]
            self.position += 1
            if index not in self.quarantined:
                out.append(index)
        return out

    def _start_epoch(self, carried: list[int], wanted: int) -> None:
        """Start the next epoch; the batch that crosses into it holds ``carried`` and wants
        ``wanted`` new rows (not quarantined) before them."""
        self.epoch += 1
        self.position = 0
        self.carried, self.fill = tuple(carried), 0
        if carried:
            held = set(carried)
            fresh = [i for i in self._shuffle(self.epoch) if i not in held]
            got = 0
            while got < wanted and self.fill < len(fresh):
                got += fresh[self.fill] not in self.quarantined
                self.fill += 1
        self._order = self._order_of(self.epoch)

    def batch(self, rows: Sequence[dict[str, Any]], n: int) -> list[tuple[int, dict[str, Any]]]:
        """The next ``n`` (index, row) pairs of ``rows``."""
        return [(i, rows[i]) for i in self.take(n)]

    def state(self) -> dict[str, Any]:
        return {
            "num_rows": self.num_rows,
            "seed": self.seed,
            "epoch": self.epoch,
            "position": self.position,
            "carried": list(self.carried),
            "fill": self.fill,
            "quarantined": sorted(self.quarantined),
            "strikes": {str(i): [cause, list(steps)] for i, (cause, steps) in sorted(self.strikes.items())},
        }

    def restore(self, state: dict[str, Any]) -> None:
        if state["num_rows"] != self.num_rows or state["seed"] != self.seed:
            raise ValueError(
                f"checkpoint's data cursor was for {state['num_rows']} rows / seed {state['seed']}, "
                f"this run has {self.num_rows} rows / seed {self.seed}"
            )
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        # A checkpoint written before carried rows were kept has none: its epoch is a plain shuffle.
        self.carried = tuple(int(i) for i in state.get("carried", ()))
        self.fill = int(state.get("fill", 0))
        # Nor quarantined rows or strikes (before poison rows were counted).
        self.quarantined = frozenset(int(i) for i in state.get("quarantined", ()))
        self.strikes = {
            int(i): (str(cause), tuple(int(s) for s in steps))
            for i, (cause, steps) in state.get("strikes", {}).items()
        }
        self._order = self._order_of(self.epoch)
