"""Rewards to advantages: the weighted sum of grader components and GRPO's group normalisation.

Pure functions on plain Python numbers; ``None`` always means "unscorable", never 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

#: Added to the group standard deviation so a near-constant group cannot blow advantages up.
STD_EPS = 1e-6


def final_reward(components: Mapping[str, float | None], weights: Mapping[str, float]) -> float | None:
    """The trajectory's reward: ``sum(weight[g] * component[g])`` over the graders that scored it.

    A ``None`` component (the grader found the trajectory unscorable) is left out of the sum, as
    TRL does with ``None`` rewards; when every component is ``None`` (or there are none) the reward
    is ``None`` and the trajectory is excluded from its group's statistics. A grader missing
    from ``weights`` has weight 1.0.
    """
    total = 0.0
    scored = False
    for name, value in components.items():
        if value is None:
            continue
        total += weights.get(name, 1.0) * float(value)
        scored = True
    return total if scored else None


def group_advantages(rewards: Sequence[float | None], eps: float = STD_EPS) -> list[float | None]:
    """GRPO advantages of one prompt's group: ``(r - mean) / (std + eps)`` over scorable rewards.

    ``std`` is the population standard deviation of the scorable rewards. Unscorable rewards
    (``None``) are excluded from the mean and std and get advantage ``None`` (no gradient).
    A group whose scorable rewards are all equal (including a group of one) gets zero
    advantages: there is nothing to prefer.
    """
    scorable = [float(r) for r in rewards if r is not None]
    if not scorable:
        return [None for _ in rewards]
    mean = sum(scorable) / len(scorable)
    if max(scorable) == min(scorable):
        return [None if r is None else 0.0 for r in rewards]
    std = math.sqrt(sum((r - mean) ** 2 for r in scorable) / len(scorable))
    return [None if r is None else (float(r) - mean) / (std + eps) for r in rewards]


def summary(values: Sequence[float | None]) -> dict[str, float]:
    """mean / std / min / max / count of the non-None values (NaN stats when there are none)."""
    present = [float(v) for v in values if v is not None]
    if not present:
        nan = float("nan")
        return {"mean": nan, "std": nan, "min": nan, "max": nan, "count": 0.0}
    mean = sum(present) / len(present)
    std = math.sqrt(sum((v - mean) ** 2 for v in present) / len(present))
    return {"mean": mean, "std": std, "min": min(present), "max": max(present), "count": float(len(present))}
