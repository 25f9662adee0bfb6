"""``FaultInjection``: make instances, and the services they call, really fail at given rates
(``plugtune test --faas --inject``)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

#: What each fault makes the instance do: sleep past the deadline, exit, allocate past memory_mb,
#: raise, return NaN (graders only).
FAULTS = ("timeout", "eof", "oom", "500", "nan")
#: What each dependency fault makes a connection to a declared dependency meet (drawn per connection,
#: in the ``policy-only`` relay, so the plugin's own client sees it): a 429 with ``Retry-After: 1``,
#: a 503, a refused connection, a service that never answers. Over ``https`` the relay cannot answer
#: inside TLS: a 429 or 5xx is met as unreachable there.
DEPENDENCY_FAULTS = ("dependency-429", "dependency-5xx", "dependency-unreachable", "dependency-hang")


@dataclass(frozen=True)
class FaultInjection:
    """Per-call probabilities of each fault (``FAULTS``), and per-connection probabilities of each
    dependency fault (``DEPENDENCY_FAULTS``), each kind drawn from its own seeded generator."""

    rates: dict[str, float]
    seed: int = 0
    _rng: random.Random = field(init=False, repr=False, compare=False)
    _dependency_rng: random.Random = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        unknown = set(self.rates) - set(FAULTS) - set(DEPENDENCY_FAULTS)
        if unknown:
            known = ", ".join(FAULTS + DEPENDENCY_FAULTS)
            raise ValueError(f"FaultInjection: unknown fault(s) {sorted(unknown)}; use {known}")
        for name, rate in self.rates.items():
            if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate):
                raise ValueError(f"FaultInjection: rate of {name!r} must be a number, got {rate!r}")
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"FaultInjection: rate of {name!r} must be between 0 and 1, got {rate}")
        for kind, names in (("call", FAULTS), ("dependency", DEPENDENCY_FAULTS)):
            if sum(self.rates.get(n, 0.0) for n in names) > 1.0 + 1e-9:
                raise ValueError(f"FaultInjection: the {kind} fault rates add up to more than 1")
        object.__setattr__(self, "_rng", random.Random(self.seed))
        object.__setattr__(self, "_dependency_rng", random.Random(self.seed + 1))

    @property
    def dependency_faults(self) -> bool:
        """Whether any dependency fault has a rate above 0."""
        return any(self.rates.get(n, 0.0) > 0 for n in DEPENDENCY_FAULTS)

    def draw(self) -> str | None:
        """The fault for the next call, or None."""
        return _draw(self._rng, self.rates, FAULTS)

    def draw_dependency(self) -> str | None:
        """The dependency fault for the next connection to a declared dependency, or None."""
        return _draw(self._dependency_rng, self.rates, DEPENDENCY_FAULTS)


def _draw(rng: random.Random, rates: dict[str, float], names: tuple[str, ...]) -> str | None:
    u = rng.random()
    total = 0.0
    for name in names:
        total += rates.get(name, 0.0)
        if u < total:
            return name
    return None
