"""Metric points: plugin resource metrics (plugin = its name) and training metrics (plugin "").

Reads return at most ``max_points`` points per series: a longer series is averaged into equal
time buckets inside the database, so a 7-day chart costs the same to send as a 1-hour one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, Connection, Integer, cast, func, insert, select

from plugtune.store.base import StoreBase
from plugtune.store.database import Database, upsert
from plugtune.store.records import LatestMetric, SeriesPoint
from plugtune.store.schema import metric_points, metric_series
from plugtune.types import MetricPoint

TRAINING = ""  # the plugin name training metrics are stored under
_SERIES_KEY = ["job_id", "plugin", "name"]


def insert_metrics(conn: Connection, db: Database, job_id: int, points: Sequence[MetricPoint]) -> None:
    if not points:
        return
    rows: list[dict[str, Any]] = [
        {
            "job_id": job_id,
            "plugin": p.plugin,
            "name": p.name,
            "time": p.time,
            "step": p.step,
            "value": p.value,
        }
        for p in points
    ]
    conn.execute(insert(metric_points), rows)
    newest: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        key = (row["plugin"], row["name"])
        if key not in newest or row["time"] >= newest[key]["time"]:
            newest[key] = row
    stmt = upsert(db, metric_series, _SERIES_KEY, ["time", "step", "value"], newer_than="time")
    conn.execute(stmt, sorted(newest.values(), key=lambda r: (r["plugin"], r["name"])))


class MetricsTable(StoreBase):
    def add_metrics(self, job_id: int, points: Sequence[MetricPoint]) -> None:
        """Insert points in one transaction (durable on return). Running jobs use StoreWriter."""
        with self._db.write("writing metric points") as conn:
            insert_metrics(conn, self._db, job_id, points)

    def metrics(
        self,
        job_id: int,
        plugin: str = TRAINING,
        names: Sequence[str] | None = None,
        *,
        since: float | None = None,
        until: float | None = None,
        max_points: int = 500,
    ) -> dict[str, list[SeriesPoint]]:
        """Series of one plugin (``""``: training metrics) by name, oldest point first.

        ``since``/``until`` bound the time range (inclusive). A series with more than ``max_points``
        points in the range comes back as ``max_points`` bucket averages (``count`` says how many
        raw points each one stands for).
        """
        if max_points < 2:
            raise ValueError(f"max_points must be >= 2, got {max_points}")
        where = _where(job_id, plugin, names, since, until)
        stats = (
            select(
                metric_points.c.name,
                func.count(),
                func.min(metric_points.c.time),
                func.max(metric_points.c.time),
            )
            .where(*where)
            .group_by(metric_points.c.name)
        )
        out: dict[str, list[SeriesPoint]] = {}
        with self._db.read("reading metrics") as conn:
            for name, count, t0, t1 in conn.execute(stats).all():
                if count <= max_points or t1 <= t0:
                    out[name] = self._raw(conn, where, name)
                else:
                    out[name] = self._bucketed(conn, where, name, t0, _bucket_width(t0, t1, max_points))
        return out

    def metric_names(self, job_id: int, plugin: str = TRAINING) -> list[str]:
        c = metric_series.c
        query = select(c.name).where(c.job_id == job_id, c.plugin == plugin).order_by(c.name)
        with self._db.read("listing metric names") as conn:
            return list(conn.execute(query).scalars())

    def latest_metrics(self, job_ids: Sequence[int], plugin: str | None = None) -> list[LatestMetric]:
        """The newest point of every series of these jobs (of one plugin if given); O(series)."""
        if not job_ids:
            return []
        c = metric_series.c
        query = select(metric_series).where(c.job_id.in_(list(job_ids))).order_by(c.job_id, c.plugin, c.name)
        if plugin is not None:
            query = query.where(c.plugin == plugin)
        with self._db.read("reading the newest metric values") as conn:
            return [
                LatestMetric(
                    job_id=r.job_id, plugin=r.plugin, name=r.name, time=r.time, value=r.value, step=r.step
                )
                for r in conn.execute(query)
            ]

    def _raw(self, conn: Connection, where: list[ColumnElement[bool]], name: str) -> list[SeriesPoint]:
        query = (
            select(metric_points.c.time, metric_points.c.value, metric_points.c.step)
            .where(*where, metric_points.c.name == name)
            .order_by(metric_points.c.time, metric_points.c.id)
        )
        return [SeriesPoint(time=t, value=v, step=s) for t, v, s in conn.execute(query)]

    def _bucketed(
        self, conn: Connection, where: list[ColumnElement[bool]], name: str, t0: float, width: float
    ) -> list[SeriesPoint]:
        offset = (metric_points.c.time - t0) / width
        # Times are >= t0, so truncation is floor; PostgreSQL's CAST rounds, hence floor() there.
        bucket = cast(offset, Integer) if self._db.is_sqlite else cast(func.floor(offset), Integer)
        label = bucket.label("bucket")
        query = (
            select(
                label,
                func.avg(metric_points.c.time),
                func.avg(metric_points.c.value),
                func.max(metric_points.c.step),
                func.count(),
            )
            .where(*where, metric_points.c.name == name)
            .group_by(label)
            .order_by(label)
        )
        return [
            SeriesPoint(time=float(t), value=float(v), step=s, count=int(n))
            for _, t, v, s, n in conn.execute(query)
        ]


def _where(
    job_id: int, plugin: str, names: Sequence[str] | None, since: float | None, until: float | None
) -> list[ColumnElement[bool]]:
    where: list[ColumnElement[bool]] = [metric_points.c.job_id == job_id, metric_points.c.plugin == plugin]
    if names is not None:
        where.append(metric_points.c.name.in_(list(names)))
    if since is not None:
        where.append(metric_points.c.time >= since)
    if until is not None:
        where.append(metric_points.c.time <= until)
    return where


def _bucket_width(t0: float, t1: float, max_points: int) -> float:
    # A hair wider than span/max_points so the last point lands in bucket max_points - 1.
    return (t1 - t0) / max_points * (1 + 1e-9)
