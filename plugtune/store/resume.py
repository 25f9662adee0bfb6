"""Forgetting work past a checkpoint, so a resumed attempt never duplicates steps or trajectories."""

from __future__ import annotations

from sqlalchemy import Connection, and_, delete, select

from plugtune.store.base import StoreBase
from plugtune.store.database import Database, upsert
from plugtune.store.schema import checkpoints, metric_points, metric_series, trajectories


class ResumeTable(StoreBase):
    def delete_after_step(self, job_id: int, step: int) -> int:
        """Delete the trajectories, training metric points and checkpoints of steps after ``step``.

        Called when an attempt resumes from the checkpoint of ``step``: those steps run again and
        write their records anew. Plugin resource metrics and log lines are kept (they are
        history, not results). Returns how many trajectories were removed.
        """
        training = and_(metric_points.c.job_id == job_id, metric_points.c.plugin == "")
        with self._db.write("forgetting steps after a checkpoint") as conn:
            removed = conn.execute(
                delete(trajectories).where(trajectories.c.job_id == job_id, trajectories.c.step > step)
            ).rowcount
            conn.execute(delete(metric_points).where(training, metric_points.c.step > step))
            conn.execute(delete(checkpoints).where(checkpoints.c.job_id == job_id, checkpoints.c.step > step))
            _rewind_series(conn, self._db, job_id, step)
        return int(removed or 0)


def _rewind_series(conn: Connection, db: Database, job_id: int, step: int) -> None:
    """Point each training series whose newest point was deleted back at its newest remaining one."""
    s, p = metric_series.c, metric_points.c
    stale_names = conn.execute(
        select(s.name).where(s.job_id == job_id, s.plugin == "", s.step > step)
    ).scalars()
    for name in list(stale_names):
        conn.execute(delete(metric_series).where(s.job_id == job_id, s.plugin == "", s.name == name))
        newest = conn.execute(
            select(p.time, p.step, p.value)
            .where(p.job_id == job_id, p.plugin == "", p.name == name)
            .order_by(p.time.desc(), p.id.desc())
            .limit(1)
        ).first()
        if newest is not None:
            row = {"job_id": job_id, "plugin": "", "name": name, **newest._asdict()}
            conn.execute(
                upsert(db, metric_series, ["job_id", "plugin", "name"], ["time", "step", "value"]), row
            )
