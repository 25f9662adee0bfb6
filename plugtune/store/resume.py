"""Forgetting work past a checkpoint, so a resumed attempt never duplicates steps or trajectories."""

from __future__ import annotations

from sqlalchemy import and_, delete, select

from plugtune.store.base import StoreBase
from plugtune.store.schema import checkpoints, metric_points, metric_series, trajectories


class ResumeTable(StoreBase):
    def delete_after_step(self, job_id: int, step: int) -> int:
        """Delete the trajectories, training metric points and checkpoints of steps after ``step``.

        Called when an attempt resumes from the checkpoint of ``step``: those steps run again and
        write their records anew. Returns how many trajectories were removed.
        """
        training = and_(metric_points.c.job_id == job_id, metric_points.c.plugin == "")
        with self._db.write("forgetting steps after a checkpoint") as conn:
            removed = conn.execute(
                delete(trajectories).where(trajectories.c.job_id == job_id, trajectories.c.step > step)
            ).rowcount
            conn.execute(delete(metric_points).where(training, metric_points.c.step > step))
            conn.execute(delete(checkpoints).where(checkpoints.c.job_id == job_id, checkpoints.c.step > step))
            stale = select(metric_series.c.name).where(
                metric_series.c.job_id == job_id, metric_series.c.plugin == "", metric_series.c.step > step
            )
            conn.execute(
                delete(metric_series).where(
                    metric_series.c.job_id == job_id,
                    metric_series.c.plugin == "",
                    metric_series.c.name.in_(stale.scalar_subquery()),
                )
            )
        return int(removed or 0)
