"""Dependency budgets shared by every actor of a Ray backend: one ``BudgetKeeper`` actor holds them.

On the local backend every instance's connections to a declared dependency pass one supervisor's
``PolicyBridge``, so one :class:`~plugtune.runtime.budget.Budgets` bounds them all. On Ray each
actor runs a supervisor (and a bridge) of its own on its node: with a budget each, a job's
``concurrency: 4`` would allow 4 per actor. So the driver starts one keeper actor, which holds the
real budgets (``rpm``, ``concurrency``, AIMD on 429s), and each actor's bridge asks it for every
slot (:class:`SharedBudget`: a Ray call per connection opened and one per connection closed).
Each actor's meters go back to the driver with its reports (:class:`DependencyTally`), so a Ray
function has the same ``dependency/<name>/...`` series (the Plugin tab's dependency panel).

What the keeper cannot do from afar: close another actor's idle kept-alive connection for a
connection that waits (``budget.IDLE_S``); a client that keeps idle connections open holds its
slot until it closes them. A keeper that no longer answers lets connections through unbudgeted
(with a log line) rather than failing calls that the dependency itself would answer.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any

from plugtune.runtime.budget import Budgets, DependencyBudget, Holder
from plugtune.runtime.dependencies import Dependency
from plugtune.runtime.meter import DependencyMeter

log = logging.getLogger(__name__)

KEEPER_CALLS = 10_000  # slots waited for at once, over every actor
ANSWER_S = 10.0  # a release, 429 or success the keeper does not take in this long is dropped


class BudgetKeeper:
    """The job's budgets (wrapped with ``ray.remote`` by the driver, an async actor)."""

    def __init__(self) -> None:
        self.budgets = Budgets()

    async def declare(self, dep: Dependency) -> None:
        self.budgets.declare(dep)

    async def acquire(self, target: tuple[str, int]) -> bool:
        budget = self.budgets.get(target)
        if budget is None:
            return False
        await budget.acquire()
        return True

    async def release(self, target: tuple[str, int]) -> None:
        budget = self.budgets.get(target)
        if budget is not None:
            budget.release()

    async def rate_limited(self, target: tuple[str, int]) -> None:
        budget = self.budgets.get(target)
        if budget is not None:
            budget.rate_limited()

    async def succeeded(self, target: tuple[str, int]) -> None:
        budget = self.budgets.get(target)
        if budget is not None:
            budget.succeeded()

    async def usage(self) -> dict[str, dict[str, float | int | None]]:
        return self.budgets.usage()


class SharedBudget(DependencyBudget):
    """One dependency's budget as an actor's bridge sees it: every slot comes from the keeper.
    ``open``/``opened``/``peak`` count this actor's connections (its meters read them)."""

    def __init__(self, keeper: Any, dep: Dependency) -> None:
        super().__init__(dep.name, dep.concurrency, dep.rpm)
        self.keeper = keeper
        self.target = (dep.host, dep.port)
        self.granted = 0  # slots the keeper gave this actor and it has not given back
        self.asking = 0
        self.unbudgeted = False

    @property
    def waiting(self) -> int:
        return self.asking

    async def acquire(self) -> None:
        ref = self.keeper.acquire.remote(self.target)
        self.asking += 1
        try:
            granted = await asyncio.shield(ref)
        except asyncio.CancelledError:
            asyncio.get_running_loop().create_task(self._give_back_when_granted(ref))
            raise
        except Exception as exc:  # noqa: BLE001 - the keeper is gone: let the connection through
            granted = False
            if not self.unbudgeted:
                self.unbudgeted = True
                log.warning("dependency %s: no budget keeper (%s): unbudgeted", self.name, exc)
        finally:
            self.asking -= 1
        self.granted += int(bool(granted))
        self.open += 1
        self.opened += 1
        self.peak = max(self.peak, self.open)

    async def _give_back_when_granted(self, ref: Any) -> None:
        try:
            if await asyncio.wait_for(ref, ANSWER_S * 6):
                self.keeper.release.remote(self.target)
        except Exception:  # noqa: BLE001, S110 - the keeper is gone, and its slots with it
            pass

    def hold(self, holder: Holder) -> None:
        self.holders.add(holder)

    def release(self, holder: Holder | None = None) -> None:
        self.holders.discard(holder)
        self.open = max(0, self.open - 1)
        if self.granted > 0:
            self.granted -= 1
            self.keeper.release.remote(self.target)

    def rate_limited(self) -> None:
        super().rate_limited()  # this actor's view of the limit (its meters); the keeper's holds
        self.keeper.rate_limited.remote(self.target)

    def succeeded(self) -> None:
        if self.limit is not None and self.ceiling is not None and self.limit < self.ceiling:
            self.limit = min(float(self.ceiling), self.limit + 1.0 / max(self.limit, 1.0))
        self.keeper.succeeded.remote(self.target)


class SharedBudgets(Budgets):
    """An actor's budgets, each shared through the keeper (declared there too)."""

    def __init__(self, keeper: Any) -> None:
        super().__init__()
        self.keeper = keeper

    def declare(self, dep: Dependency) -> DependencyBudget:
        key = (dep.host, dep.port)
        budget = self.by_target.get(key)
        if budget is None:
            budget = self.by_target[key] = SharedBudget(self.keeper, dep)
        else:
            budget.tighten(dep.concurrency, dep.rpm)
        self.keeper.declare.remote(dep)  # ordered before this actor's first acquire (same caller)
        return budget


class SummedBudget(DependencyBudget):
    """The driver's view of one dependency's budget across actors (for its meter's gauges)."""

    def __init__(self, name: str) -> None:
        super().__init__(name, None, None)
        self.summed_waiting = 0

    @property
    def waiting(self) -> int:
        return self.summed_waiting


class DependencyTally:
    """The driver's meters of a function's dependencies on Ray: each actor's bridge measures its own
    connections, and its reports hand over what it measured since (``drain``); ``sample()`` then
    gives the same ``dependency/<name>/...`` series a local function's bridge gives, over all actors
    (durations pooled in one reservoir, gauges summed over the actors, ``limit`` the largest)."""

    def __init__(self) -> None:
        self.meters: dict[str, DependencyMeter] = {}
        self.gauges: dict[str, dict[str, tuple[int, int, float | None]]] = {}  # name -> actor -> now

    def add(self, actor: str, drained: dict[str, dict[str, Any]]) -> None:
        for name, got in drained.items():
            meter = self.meters.get(name)
            if meter is None:
                meter = self.meters[name] = DependencyMeter(name, SummedBudget(name))
            meter.opened += int(got["opened"])
            for ms in got["durations_ms"]:
                meter.closed(float(ms) / 1000)
            for cause, count in got["errors"].items():
                meter.errors[cause] += int(count)
            self.gauges.setdefault(name, {})[actor] = (int(got["open"]), int(got["waiting"]), got["limit"])

    def forget(self, actor: str) -> None:
        for by_actor in self.gauges.values():
            by_actor.pop(actor, None)

    def sample(self) -> dict[str, float]:
        values: dict[str, float] = {}
        for name, meter in self.meters.items():
            now = list(self.gauges.get(name, {}).values())
            budget = meter.budget
            assert isinstance(budget, SummedBudget)
            budget.open = sum(g[0] for g in now)
            budget.summed_waiting = sum(g[1] for g in now)
            limits = [g[2] for g in now if g[2] is not None]
            budget.limit = max(limits) if limits else None
            values.update(meter.sample())
        return values


def drain(meters: dict[str, DependencyMeter]) -> dict[str, dict[str, Any]]:
    """What each of an actor's meters measured since the last drain (then a new period there)."""
    out: dict[str, dict[str, Any]] = {}
    for name, meter in meters.items():
        out[name] = {
            "opened": meter.opened,
            "durations_ms": meter.durations_ms,
            "errors": dict(meter.errors),
            "open": meter.budget.open,
            "waiting": meter.budget.waiting,
            "limit": meter.budget.limit,
        }
        meter.opened, meter.seen, meter.durations_ms = 0, 0, []
        meter.errors = collections.Counter()
    return out
