"""Labelled re-grades: a trajectory's new grade stored beside its original, which stays as trained."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import insert, select

from plugtune.store.base import StoreBase, dumps, loads
from plugtune.store.jobs import require_job
from plugtune.store.schema import regrades as R  # noqa: N812 - the table, as SQL names it


@dataclass(frozen=True)
class RegradeRow:
    """One trajectory's re-grade under ``label``: the graders re-run and what they gave."""

    label: str
    trajectory_id: str
    step: int
    graders: list[str]
    status: str
    reward: float | None
    kind: str
    reward_components: dict[str, float | None] = field(default_factory=dict)
    errors: list[dict[str, Any]] = field(default_factory=list)
    created_at: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "trajectory_id": self.trajectory_id,
            "step": self.step,
            "graders": list(self.graders),
            "status": self.status,
            "reward": self.reward,
            "kind": self.kind,
            "reward_components": dict(self.reward_components),
            "errors": list(self.errors),
            "created_at": self.created_at,
        }


class RegradesTable(StoreBase):
    def add_regrades(self, job_id: int, rows: Sequence[RegradeRow]) -> None:
        """Store ``rows`` (one transaction); the trajectories themselves are not touched."""
        if not rows:
            return
        now = self._clock()
        values = [
            {
                "job_id": job_id,
                "label": r.label,
                "trajectory_id": r.trajectory_id,
                "step": r.step,
                "graders": dumps(r.graders),
                "status": r.status,
                "reward": r.reward,
                "reward_components": dumps(r.reward_components),
                "errors": dumps(r.errors),
                "kind": r.kind,
                "created_at": now,
            }
            for r in rows
        ]
        with self._db.write("storing a re-grade") as conn:
            require_job(conn, job_id)
            conn.execute(insert(R), values)

    def regrades(self, job_id: int, label: str | None = None) -> list[RegradeRow]:
        """The job's stored re-grades (of ``label`` only when given), oldest first."""
        query = select(R).where(R.c.job_id == job_id)
        if label is not None:
            query = query.where(R.c.label == label)
        with self._db.read("reading re-grades") as conn:
            return [
                RegradeRow(
                    label=r.label,
                    trajectory_id=r.trajectory_id,
                    step=r.step,
                    graders=loads(r.graders),
                    status=r.status,
                    reward=r.reward,
                    kind=r.kind,
                    reward_components=loads(r.reward_components),
                    errors=loads(r.errors),
                    created_at=r.created_at,
                )
                for r in conn.execute(query.order_by(R.c.id))
            ]
