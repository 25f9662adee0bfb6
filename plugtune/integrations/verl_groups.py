"""verl's prompt groups under ``failure_policy.group``, and their advantages for the signal checks.

verl runs one agent loop per trajectory, all of a batch's at once on its worker's event loop; a
group (one prompt's ``rollout.n`` trajectories, verl's ``uid``) is judged once all of it has been
rolled out and graded: ``GroupGate`` holds each trajectory until its group is complete, then
settles the group as plugtune's trainer does (``settle_group``: a plugin's discard drops it whole,
else the rule). A group verl split across its agent-loop workers can never complete in this
process: when every trajectory in flight here waits at the gate, the groups still open are settled
with the trajectories they have.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from plugtune.trainer.draft import GroupRule, TrajectoryDraft, settle_group
from plugtune.types import TrajectoryRecord

log = logging.getLogger(__name__)


@dataclass
class _Group:
    size: int
    done: asyncio.Future[bool]
    drafts: list[TrajectoryDraft] = field(default_factory=list)


class GroupGate:
    """Holds trajectories until their group is complete; one per process and job (one event loop)."""

    def __init__(self, rule: GroupRule) -> None:
        self.rule = rule
        self._open: dict[str, _Group] = {}
        self._running = 0  # trajectories entered and not yet at the gate
        self.split_groups = 0  # groups settled incomplete (verl split them across workers)

    def enter(self) -> None:
        """A trajectory of a gated group starts (it will ``settle`` or ``leave``)."""
        self._running += 1

    def leave(self) -> None:
        """A trajectory that entered ends without a draft (its run raised)."""
        self._running -= 1
        self._release_if_idle()

    async def settle(self, key: str, size: int, draft: TrajectoryDraft) -> bool:
        """Wait for the rest of ``draft``'s group (``key``, ``size`` trajectories) and settle it;
        True when the group was dropped (none of it trains)."""
        self._running -= 1
        group = self._open.get(key)
        if group is None:
            group = self._open[key] = _Group(size, asyncio.get_running_loop().create_future())
        group.drafts.append(draft)
        if len(group.drafts) >= group.size:
            self._close(key)
        self._release_if_idle()  # the last one in flight: no open group can grow any more
        return await asyncio.shield(group.done)

    def _release_if_idle(self) -> None:
        if self._running > 0:
            return
        for key in list(self._open):
            group = self._open[key]
            self.split_groups += 1
            log.warning(
                "verl group %s: %d of its %d trajectories reached this worker (verl split the group "
                "across agent-loop workers); failure_policy.group judged those",
                key,
                len(group.drafts),
                group.size,
            )
            self._close(key)

    def _close(self, key: str) -> None:
        group = self._open.pop(key)
        dropped = settle_group(group.drafts, self.rule)
        if not group.done.done():
            group.done.set_result(dropped)


def with_advantages(records: Sequence[TrajectoryRecord]) -> list[TrajectoryRecord]:
    """``records`` with each trained trajectory's advantage (its reward less its group's mean, as
    GRPO's before scaling) and None for the others: what the signal checks read to tell groups with
    no gradient. verl computes its own advantages; these are for the checks only."""
    groups: dict[str, list[TrajectoryRecord]] = {}
    for r in records:
        if r.status == "success" and r.reward is not None:
            groups.setdefault(r.group_id, []).append(r)
    means = {g: sum(float(r.reward or 0.0) for r in rs) / len(rs) for g, rs in groups.items()}
    out = []
    for r in records:
        trained = r.status == "success" and r.reward is not None
        advantage = float(r.reward or 0.0) - means[r.group_id] if trained else None
        out.append(dataclasses.replace(r, advantage=advantage))
    return out
