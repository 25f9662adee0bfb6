"""Engine runs: one job for an external engine's training run whose worker processes (verl's Ray
actors: agent loops, reward workers) record it apart. The first process of a run key creates the
job, the others join it; the one that leaves last ends it.

The table is new (created on open, no schema version change); a job recorded before it has no row.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Column, Index, Integer, String, Table, insert, select, text, update

from plugtune.store.base import StoreBase, dumps
from plugtune.store.schema import Time, _job_fk, job_transitions, jobs, metadata

engine_runs = Table(
    "engine_runs",
    metadata,
    Column("run_key", String(200), primary_key=True),
    _job_fk(),
    Column("members", Integer, nullable=False, default=0),  # processes joined and not left
    Column("joined", Integer, nullable=False, default=0),  # processes that ever joined
    Column("created_at", Time, nullable=False),
)
Index("ix_engine_runs_job", engine_runs.c.job_id)

_JOIN_LOCK = 8322  # PostgreSQL advisory lock: two processes of one run key never both create its job


class EngineRunsTable(StoreBase):
    def join_engine_run(
        self, run_key: str, name: str, spec: dict[str, Any], *, spec_yaml: str = ""
    ) -> tuple[int, bool]:
        """The job of engine run ``run_key``, with the caller counted as one of its members: the
        existing job, or a new one (``queued``) when the key is new; ``(job_id, created)``."""
        if not run_key or len(run_key) > 200:
            raise ValueError(f"a run key is 1 to 200 characters, not {len(run_key)}: {run_key[:80]!r}")
        now = self._clock()
        with self._db.write("joining an engine run") as conn:
            if not self._db.is_sqlite:  # (SQLite: BEGIN IMMEDIATE already serializes writers)
                conn.execute(text(f"SELECT pg_advisory_xact_lock({_JOIN_LOCK})"))
            mine = engine_runs.c.run_key == run_key
            found = conn.execute(select(engine_runs.c.job_id).where(mine)).scalar()
            if found is not None:
                conn.execute(
                    update(engine_runs)
                    .where(engine_runs.c.run_key == run_key)
                    .values(members=engine_runs.c.members + 1, joined=engine_runs.c.joined + 1)
                )
                return int(found), False
            row: dict[str, Any] = {"name": name, "spec": dumps(spec), "spec_yaml": spec_yaml}
            row.update(status="queued", created_at=now, updated_at=now, steps_done=0, steps_total=0)
            row.update(auto_retries=0)
            job_id = int(conn.execute(insert(jobs).returning(jobs.c.id), row).scalar_one())
            transition = {"from_status": None, "to_status": "queued", "time": now, "reason": "created"}
            conn.execute(insert(job_transitions), {"job_id": job_id, **transition})
            conn.execute(
                insert(engine_runs),
                {"run_key": run_key, "job_id": job_id, "members": 1, "joined": 1, "created_at": now},
            )
        return job_id, True

    def leave_engine_run(self, run_key: str) -> int:
        """Count the caller out of ``run_key``'s members; how many are left (0: it was the last)."""
        with self._db.write("leaving an engine run") as conn:
            conn.execute(
                update(engine_runs)
                .where(engine_runs.c.run_key == run_key, engine_runs.c.members > 0)
                .values(members=engine_runs.c.members - 1)
            )
            query = select(engine_runs.c.members).where(engine_runs.c.run_key == run_key)
            left = conn.execute(query).scalar()
        return int(left or 0)

    def engine_run(self, run_key: str) -> tuple[int, int, int] | None:
        """``(job_id, members, joined)`` of ``run_key``; None when no process has joined it."""
        query = select(engine_runs.c.job_id, engine_runs.c.members, engine_runs.c.joined).where(
            engine_runs.c.run_key == run_key
        )
        with self._db.read("reading an engine run") as conn:
            row = conn.execute(query).first()
        return None if row is None else (int(row.job_id), int(row.members), int(row.joined))
