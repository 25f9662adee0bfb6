"""Engine runs: one job for an external engine's training run whose worker processes (verl's Ray
actors: agent loops, reward workers) record it apart. The first process of a run key creates the
job, the others join it; the one that leaves last ends it.

Each joined process is a member row (its pid, host and process start time) so that ``plugtune
serve`` can tell whether the run still has a live process (``scheduler.recover_interrupted``), and
the job's running attempt is handed from a leaving member to one that stays. Several members
report progress: ``advance_steps_done`` only moves ``steps_done`` forward.

The tables are new (created on open, no schema version change); a job recorded before them has no
row, one recorded before the members table has no member rows (serve then reads its attempt's pid).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Column, Connection, Index, Integer, String, Table, delete, insert, select, text, update

from plugtune.store.base import StoreBase, dumps
from plugtune.store.schema import Time, _job_fk, attempts, job_transitions, jobs, metadata

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

engine_run_members = Table(
    "engine_run_members",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_key", String(200), nullable=False),
    _job_fk(),
    Column("pid", Integer, nullable=False),
    Column("host", String(255), nullable=False),
    Column("started", Time, nullable=False),  # the process's start time: a reused pid is another
    Column("joined_at", Time, nullable=False),
)
Index("ix_engine_run_members_key", engine_run_members.c.run_key)
Index("ix_engine_run_members_job", engine_run_members.c.job_id)


@dataclass(frozen=True)
class EngineMember:
    """One process of an engine run: its pid on ``host``, started at ``started`` (epoch seconds,
    as the OS says: ``psutil.Process().create_time()``)."""

    pid: int
    host: str
    started: float
    id: int = 0  # the member row (0: not stored yet)


_JOIN_LOCK = 8322  # PostgreSQL advisory lock: two processes of one run key never both create its job


class EngineRunsTable(StoreBase):
    def join_engine_run(
        self,
        run_key: str,
        name: str,
        spec: dict[str, Any],
        *,
        spec_yaml: str = "",
        member: EngineMember | None = None,
    ) -> tuple[int, bool]:
        """The job of engine run ``run_key``, with the caller counted as one of its members: the
        existing job, or a new one (``queued``) when the key is new; ``(job_id, created)``.
        ``member``: the joining process, recorded so that serve can tell whether the run lives."""
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
                _add_member(conn, run_key, int(found), member, now)
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
            _add_member(conn, run_key, job_id, member, now)
        return job_id, True

    def leave_engine_run(self, run_key: str, member: EngineMember | None = None) -> int:
        """Count the caller out of ``run_key``'s members; how many are left (0: it was the last).
        ``member``: the leaving process (as it joined): its row goes, and the job's running attempt,
        when it was this process's, goes to the member that joined first of those left."""
        with self._db.write("leaving an engine run") as conn:
            conn.execute(
                update(engine_runs)
                .where(engine_runs.c.run_key == run_key, engine_runs.c.members > 0)
                .values(members=engine_runs.c.members - 1)
            )
            if member is not None:
                _drop_member(conn, run_key, member)
            query = select(engine_runs.c.members, engine_runs.c.job_id).where(
                engine_runs.c.run_key == run_key
            )
            row = conn.execute(query).first()
            if member is not None and row is not None:
                _hand_attempt(conn, run_key, int(row.job_id), member)
        return int(row.members) if row is not None else 0

    def drop_engine_run_members(self, run_key: str, gone: list[EngineMember]) -> int | None:
        """Count out members whose processes stopped without leaving (SIGKILL: no exit hooks ran);
        how many members are left, or None when none of ``gone`` was still counted (another process
        dropped them first: that one acts on the count)."""
        ids = [m.id for m in gone if m.id]
        if not ids:
            return None
        with self._db.write("dropping stopped engine run members") as conn:
            mine = engine_run_members.c.run_key == run_key
            dropped = conn.execute(delete(engine_run_members).where(mine, engine_run_members.c.id.in_(ids)))
            if not dropped.rowcount:
                return None
            conn.execute(
                update(engine_runs)
                .where(engine_runs.c.run_key == run_key)
                .values(members=engine_runs.c.members - dropped.rowcount)
            )
            left = conn.execute(
                select(engine_runs.c.members).where(engine_runs.c.run_key == run_key)
            ).scalar()
        return max(0, int(left or 0))

    def engine_run_members(self, run_key: str) -> list[EngineMember]:
        """The processes of ``run_key`` that joined and have not left, first joined first."""
        query = (
            select(engine_run_members)
            .where(engine_run_members.c.run_key == run_key)
            .order_by(engine_run_members.c.id)
        )
        with self._db.read("reading an engine run's members") as conn:
            return [_member(r) for r in conn.execute(query)]

    def advance_steps_done(self, job_id: int, steps_done: int) -> None:
        """Raise the job's ``steps_done`` to ``steps_done``, never lower it (several processes of an
        engine run report their own progress, one behind another)."""
        with self._db.write("updating a job's progress") as conn:
            conn.execute(
                update(jobs)
                .where(jobs.c.id == job_id, jobs.c.steps_done < steps_done)
                .values(steps_done=steps_done, updated_at=self._clock())
            )

    def engine_run(self, run_key: str) -> tuple[int, int, int] | None:
        """``(job_id, members, joined)`` of ``run_key``; None when no process has joined it."""
        query = select(engine_runs.c.job_id, engine_runs.c.members, engine_runs.c.joined).where(
            engine_runs.c.run_key == run_key
        )
        with self._db.read("reading an engine run") as conn:
            row = conn.execute(query).first()
        return None if row is None else (int(row.job_id), int(row.members), int(row.joined))


def _add_member(conn: Connection, run_key: str, job_id: int, member: EngineMember | None, now: float) -> None:
    if member is None:
        return
    row = {"run_key": run_key, "job_id": job_id, "pid": member.pid, "host": member.host[:255]}
    conn.execute(insert(engine_run_members), {**row, "started": member.started, "joined_at": now})


def _drop_member(conn: Connection, run_key: str, member: EngineMember) -> None:
    """Delete one row of ``member`` (a process that joined twice has two)."""
    c = engine_run_members.c
    query = select(c.id).where(c.run_key == run_key, c.pid == member.pid, c.host == member.host[:255])
    found = conn.execute(query.order_by(c.id.desc()).limit(1)).scalar()
    if found is not None:
        conn.execute(delete(engine_run_members).where(c.id == found))


def _hand_attempt(conn: Connection, run_key: str, job_id: int, leaving: EngineMember) -> None:
    """The job's running attempt follows the run's members: from the leaving process (when it held
    it) to the member that joined first of those left."""
    c = engine_run_members.c
    heir = conn.execute(select(c.pid).where(c.run_key == run_key).order_by(c.id).limit(1)).scalar()
    if heir is None:
        return
    conn.execute(
        update(attempts)
        .where(attempts.c.job_id == job_id, attempts.c.status == "running", attempts.c.pid == leaving.pid)
        .values(pid=int(heir))
    )


def _member(row: Any) -> EngineMember:
    return EngineMember(pid=int(row.pid), host=str(row.host), started=float(row.started), id=int(row.id))
