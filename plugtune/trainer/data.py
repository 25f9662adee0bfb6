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
    """

    def __init__(self, num_rows: int, seed: int) -> None:
        if num_rows < 1:
            raise ValueError("a DataCursor needs at least one row")
        self.num_rows = num_rows
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self.carried: tuple[int, ...] = ()  # the rows of the batch that crossed into this epoch
        self.fill = 0  # how many new rows that batch took from this epoch
        self._order = self._order_of(0)

    def _order_of(self, epoch: int) -> list[int]:
        order = list(range(self.num_rows))
        random.Random(f"{self.seed}:{epoch}").shuffle(order)
        if not self.carried:
            return order
        held = set(self.carried)
        fresh = [i for i in order if i not in held]
        return fresh[: self.fill] + [i for i in order if i in held] + fresh[self.fill :]

    def take(self, n: int) -> list[int]:
        """The next ``n`` row indices. At an epoch boundary the batch goes on with the next
        (reshuffled) epoch, first the rows it does not hold yet: no row twice in a batch when the
        dataset has ``n`` rows, and as few repeats as can be when it has fewer."""
        out: list[int] = []
        since = 0  # where the rows of the current epoch start in ``out``
        while len(out) < n:
            if self.position >= self.num_rows:
                held = out[since:] if len(out) - since < self.num_rows else []
                self._start_epoch(held, min(n - len(out), self.num_rows - len(held)))
                since = len(out)
            out.append(self._order[self.position])
            self.position += 1
        return out

    def _start_epoch(self, carried: list[int], fill: int) -> None:
        self.epoch += 1
        self.position = 0
        self.carried, self.fill = tuple(carried), fill if carried else 0
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
        self._order = self._order_of(self.epoch)
