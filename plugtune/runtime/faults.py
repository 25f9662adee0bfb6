"""``FaultInjection``: make instances really fail at given rates (``plugtune test --faas --inject``)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

#: What each fault makes the instance do: sleep past the deadline, exit, allocate past memory_mb,
#: raise, return NaN (graders only).
FAULTS = ("timeout", "eof", "oom", "500", "nan")


@dataclass(frozen=True)
class FaultInjection:
    """Per-call probabilities of each fault, drawn from one seeded generator."""

    rates: dict[str, float]
    seed: int = 0
    _rng: random.Random = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        unknown = set(self.rates) - set(FAULTS)
        if unknown:
            raise ValueError(f"FaultInjection: unknown fault(s) {sorted(unknown)}; use {', '.join(FAULTS)}")
        for name, rate in self.rates.items():
            if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate):
                raise ValueError(f"FaultInjection: rate of {name!r} must be a number, got {rate!r}")
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"FaultInjection: rate of {name!r} must be between 0 and 1, got {rate}")
        if sum(self.rates.values()) > 1.0 + 1e-9:
            raise ValueError("FaultInjection: the rates add up to more than 1")
        object.__setattr__(self, "_rng", random.Random(self.seed))

    def draw(self) -> str | None:
        """The fault for the next call, or None."""
        u = self._rng.random()
        total = 0.0
        for name in FAULTS:
            total += self.rates.get(name, 0.0)
            if u < total:
                return name
        return None
