"""``DataCursor``: walks dataset rows in a seeded order, epoch after epoch, and resumes exactly."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any


class DataCursor:
    """Yields row indices in a per-epoch shuffled order that depends only on ``seed`` and the epoch.

    ``state()`` / ``restore()`` capture the position, so a resumed run sees the same rows next.
    """

    def __init__(self, num_rows: int, seed: int) -> None:
        if num_rows < 1:
            raise ValueError("a DataCursor needs at least one row")
        self.num_rows = num_rows
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order = self._order_of(0)

    def _order_of(self, epoch: int) -> list[int]:
        order = list(range(self.num_rows))
        random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def take(self, n: int) -> list[int]:
        """The next ``n`` row indices, starting a new (reshuffled) epoch when one runs out."""
        out: list[int] = []
        while len(out) < n:
            if self.position >= self.num_rows:
                self.epoch += 1
                self.position = 0
                self._order = self._order_of(self.epoch)
            out.append(self._order[self.position])
            self.position += 1
        return out

    def batch(self, rows: Sequence[dict[str, Any]], n: int) -> list[tuple[int, dict[str, Any]]]:
        """The next ``n`` (index, row) pairs of ``rows``."""
        return [(i, rows[i]) for i in self.take(n)]

    def state(self) -> dict[str, int]:
        return {"num_rows": self.num_rows, "seed": self.seed, "epoch": self.epoch, "position": self.position}

    def restore(self, state: dict[str, int]) -> None:
        if state["num_rows"] != self.num_rows or state["seed"] != self.seed:
            raise ValueError(
                f"checkpoint's data cursor was for {state['num_rows']} rows / seed {state['seed']}, "
                f"this run has {self.num_rows} rows / seed {self.seed}"
            )
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._order = self._order_of(self.epoch)
