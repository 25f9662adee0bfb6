"""Trajectories (DESIGN §4): idempotent upserts, summary pages with filters, full records, groups.

Token arrays are packed little-endian bytes (ids int32, mask uint8, logprobs float64): exact,
about a quarter of the JSON size, and never read by list pages.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any, Literal

from sqlalchemy import Connection, Select, func, select

from plugtune.store.base import StoreBase, count_rows, dumps, loads, page_size
from plugtune.store.database import Database, contains_text, upsert
from plugtune.store.records import DamagedRecordError, NotFoundError, TrajectorySummary
from plugtune.store.schema import trajectories as T  # noqa: N812 - the table, as SQL names it
from plugtune.types import DroppedSpan, ErrorRecord, TrajectoryRecord

Order = Literal["newest", "oldest", "reward_asc", "reward_desc"]
PREVIEW_CHARS = 200
_IDS_PER_QUERY = 500  # well under every database's limit on bound parameters
_SUMMARY = [
    T.c.id, T.c.job_id, T.c.trajectory_id, T.c.group_id, T.c.step, T.c.sample_index, T.c.rollout_index,
    T.c.attempt, T.c.policy_version, T.c.status, T.c.phase, T.c.reward, T.c.advantage, T.c.stop_reason,
    T.c.prompt_tokens, T.c.response_tokens, T.c.plugins, T.c.error_cause, T.c.preview, T.c.discard_reason,
]  # fmt: skip
_KEY = ["job_id", "trajectory_id"]
_NOT_UPDATED = {"id", "job_id", "trajectory_id", "created_at"}
_UPDATED = [c.name for c in T.columns if c.name not in _NOT_UPDATED]


def upsert_trajectory_rows(
    conn: Connection, db: Database, job_id: int, records: Sequence[TrajectoryRecord], now: float
) -> None:
    # One statement may not touch a row twice (PostgreSQL refuses), so the last write per id wins here.
    latest = {r.trajectory_id: r for r in records}
    if latest:
        conn.execute(upsert(db, T, _KEY, _UPDATED), [_row(job_id, r, now) for r in latest.values()])


class TrajectoriesTable(StoreBase):
    def upsert_trajectories(self, job_id: int, records: Sequence[TrajectoryRecord]) -> None:
        """Insert or replace trajectories by (job, trajectory_id), in one transaction."""
        with self._db.write("writing trajectories") as conn:
            upsert_trajectory_rows(conn, self._db, job_id, records, self._clock())

    def trajectories(
        self,
        job_id: int,
        *,
        status: str | None = None,
        phase: str | None = None,
        step: int | None = None,
        plugin: str | None = None,
        text: str | None = None,
        min_reward: float | None = None,
        max_reward: float | None = None,
        order: Order = "newest",
        limit: int = 50,
        offset: int = 0,
        before_id: int | None = None,
        after_id: int | None = None,
    ) -> list[TrajectorySummary]:
        """One page of trajectory summaries (no messages, no tokens).

        ``phase`` keeps ``train`` or ``eval`` (held-out) trajectories; ``plugin`` keeps
        trajectories that ran that plugin or hold an error from it; ``text`` is a
        case-insensitive substring of the messages. Page with ``offset``, or for the default
        newest-first order with ``before_id=page[-1].id`` (constant cost however deep). The
        trajectory shown before ``t`` in newest-first order (full-screen "up"):
        ``trajectories(..., order="oldest", after_id=t.id, limit=1)``.
        """
        query = _filtered(
            select(*_SUMMARY), job_id, status, phase, step, plugin, text, min_reward, max_reward
        )
        if before_id is not None:
            query = query.where(T.c.id < before_id)
        if after_id is not None:
            query = query.where(T.c.id > after_id)
        query = query.order_by(*_ORDER[order]).limit(page_size(limit)).offset(offset)
        with self._db.read("listing trajectories") as conn:
            return [_summary(r) for r in conn.execute(query)]

    def count_trajectories(
        self,
        job_id: int,
        *,
        status: str | None = None,
        phase: str | None = None,
        step: int | None = None,
        plugin: str | None = None,
        text: str | None = None,
        min_reward: float | None = None,
        max_reward: float | None = None,
        cap: int | None = None,
    ) -> int:
        """How many trajectories match; with ``cap``, ``min(count, cap)`` in O(cap)."""
        ids = _filtered(select(T.c.id), job_id, status, phase, step, plugin, text, min_reward, max_reward)
        with self._db.read("counting trajectories") as conn:
            return count_rows(conn, ids, cap)

    def trajectory_status_counts(self, job_id: int) -> dict[str, int]:
        query = select(T.c.status, func.count()).where(T.c.job_id == job_id).group_by(T.c.status)
        with self._db.read("counting trajectories") as conn:
            return {status: int(n) for status, n in conn.execute(query)}

    def trajectory_neighbors(
        self,
        job_id: int,
        trajectory_id: str,
        *,
        status: str | None = None,
        phase: str | None = None,
        step: int | None = None,
        plugin: str | None = None,
        text: str | None = None,
        min_reward: float | None = None,
        max_reward: float | None = None,
    ) -> tuple[str | None, str | None]:
        """(newer, older): the trajectory ids just above and below this one in the filtered
        newest-first list (full-screen up/down); None at either end. Two index lookups."""
        filters = (status, phase, step, plugin, text, min_reward, max_reward)
        with self._db.read("finding neighbouring trajectories") as conn:
            row_id = conn.execute(
                select(T.c.id).where(T.c.job_id == job_id, T.c.trajectory_id == trajectory_id)
            ).scalar()
            if row_id is None:
                raise NotFoundError(f"job {job_id} has no trajectory {trajectory_id!r}")
            ids = _filtered(select(T.c.trajectory_id), job_id, *filters)
            newer = conn.execute(ids.where(T.c.id > row_id).order_by(T.c.id.asc()).limit(1)).scalar()
            older = conn.execute(ids.where(T.c.id < row_id).order_by(T.c.id.desc()).limit(1)).scalar()
        return newer, older

    def get_trajectory(self, job_id: int, trajectory_id: str) -> TrajectoryRecord | None:
        query = select(T).where(T.c.job_id == job_id, T.c.trajectory_id == trajectory_id)
        with self._db.read("reading a trajectory") as conn:
            row = conn.execute(query).first()
        return None if row is None else _record(row)

    def trajectory_records(self, job_id: int, trajectory_ids: Sequence[str]) -> list[TrajectoryRecord]:
        """The full records of these trajectories (unknown ids are left out), in no set order."""
        out: list[TrajectoryRecord] = []
        with self._db.read("reading trajectories") as conn:
            for at in range(0, len(trajectory_ids), _IDS_PER_QUERY):
                ids = list(trajectory_ids[at : at + _IDS_PER_QUERY])
                query = select(T).where(T.c.job_id == job_id, T.c.trajectory_id.in_(ids))
                out += [_record(r) for r in conn.execute(query)]
        return out

    def group(self, job_id: int, group_id: str) -> list[TrajectoryRecord]:
        """Every trajectory of one prompt group, by rollout index (for the side-by-side view)."""
        query = (
            select(T)
            .where(T.c.job_id == job_id, T.c.group_id == group_id)
            .order_by(T.c.rollout_index, T.c.attempt, T.c.id)
        )
        with self._db.read("reading a trajectory group") as conn:
            return [_record(r) for r in conn.execute(query)]


_ORDER = {
    "newest": [T.c.id.desc()],
    "oldest": [T.c.id.asc()],
    "reward_asc": [T.c.reward.asc().nulls_last(), T.c.id.asc()],
    "reward_desc": [T.c.reward.desc().nulls_last(), T.c.id.desc()],
}


def _filtered(
    query: Select[Any],
    job_id: int,
    status: str | None,
    phase: str | None,
    step: int | None,
    plugin: str | None,
    text: str | None,
    min_reward: float | None,
    max_reward: float | None,
) -> Select[Any]:
    query = query.where(T.c.job_id == job_id)
    if status is not None:
        query = query.where(T.c.status == status)
    if phase is not None:
        query = query.where(T.c.phase == phase)
    if step is not None:
        query = query.where(T.c.step == step)
    if plugin:
        query = query.where(T.c.plugins.contains(f"|{plugin}|", autoescape=True))
    if text:
        # Messages are stored as JSON: escape the needle the same way so quotes and newlines match.
        needle = dumps(text)[1:-1]
        query = query.where(contains_text(T.c.messages, needle))
    if min_reward is not None:
        query = query.where(T.c.reward >= min_reward)
    if max_reward is not None:
        query = query.where(T.c.reward <= max_reward)
    return query


def _pack(typecode: str, values: Sequence[Any]) -> bytes:
    packed = array(typecode, values)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def _unpack(typecode: str, data: bytes) -> list[Any]:
    values = array(typecode)
    values.frombytes(bytes(data))
    if sys.byteorder == "big":
        values.byteswap()
    return values.tolist()


def _row(job_id: int, r: TrajectoryRecord, now: float) -> dict[str, Any]:
    names = list(r.code_hash) + [e.plugin for e in r.errors if e.plugin and e.plugin not in r.code_hash]
    return {
        "job_id": job_id,
        "trajectory_id": r.trajectory_id,
        "group_id": r.group_id,
        "step": r.step,
        "sample_index": r.sample_index,
        "rollout_index": r.rollout_index,
        "attempt": r.attempt,
        "policy_version": r.policy_version,
        "status": r.status,
        "phase": r.phase,
        "reward": r.reward,
        "advantage": r.advantage,
        "stop_reason": r.stop_reason,
        "discard_reason": r.discard_reason,
        "reward_components": dumps(r.reward_components),
        "messages": dumps(r.messages),
        "tools": dumps(r.tools),
        "prompt_ids": _pack("i", r.prompt_ids),
        "response_ids": _pack("i", r.response_ids),
        "response_mask": bytes(r.response_mask),
        "response_logprobs": _pack("d", r.response_logprobs),
        "trainer_logprobs": _pack("d", r.trainer_logprobs),
        "dropped_spans": dumps([asdict(d) for d in r.dropped_spans]),
        "errors": dumps([e.on_trajectory() for e in r.errors]),
        "metrics": dumps(r.metrics),
        "timing": dumps(r.timing),
        "code_hash": dumps(r.code_hash),
        "prompt_tokens": len(r.prompt_ids),
        "response_tokens": len(r.response_ids),
        "plugins": "|" + "|".join(names) + "|" if names else "",
        # the verdict that ended it: a success keeps its retried tries' errors, but is no error
        "error_cause": r.errors[-1].cause if r.errors and r.status != "success" else "",
        "preview": _preview(r.messages),
        "created_at": now,
        "updated_at": now,
    }


def _preview(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        content = message.get("content")
        if isinstance(content, list):  # OpenAI content parts
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        if content:
            return str(content)[:PREVIEW_CHARS]
    return ""


def _summary(r: Any) -> TrajectorySummary:
    values = dict(r._mapping)
    values["plugins"] = [p for p in values["plugins"].split("|") if p]
    return TrajectorySummary(**values)


def _record(r: Any) -> TrajectoryRecord:
    def read(column: str, decode: Any) -> Any:
        try:
            return decode(getattr(r, column))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise DamagedRecordError(
                f"trajectory {r.trajectory_id!r} cannot be read back: its stored {column} is damaged "
                f"({type(exc).__name__}: {str(exc)[:200]}); the database row was changed outside plugtune"
            ) from exc

    return TrajectoryRecord(
        trajectory_id=r.trajectory_id,
        group_id=r.group_id,
        step=r.step,
        sample_index=r.sample_index,
        rollout_index=r.rollout_index,
        attempt=r.attempt,
        policy_version=r.policy_version,
        prompt_ids=read("prompt_ids", lambda v: _unpack("i", v)),
        response_ids=read("response_ids", lambda v: _unpack("i", v)),
        response_mask=read("response_mask", lambda v: list(bytes(v))),
        response_logprobs=read("response_logprobs", lambda v: _unpack("d", v)),
        messages=read("messages", loads),
        tools=read("tools", loads),
        reward=r.reward,
        reward_components=read("reward_components", loads),
        advantage=r.advantage,
        status=r.status,
        stop_reason=r.stop_reason,
        errors=read("errors", lambda v: [ErrorRecord(**e) for e in loads(v)]),
        metrics=read("metrics", loads),
        timing=read("timing", loads),
        code_hash=read("code_hash", loads),
        phase=r.phase,
        discard_reason=r.discard_reason,
        trainer_logprobs=read("trainer_logprobs", lambda v: _unpack("d", v) if v is not None else []),
        dropped_spans=read("dropped_spans", lambda v: [DroppedSpan(**d) for d in loads(v)] if v else []),
    )
