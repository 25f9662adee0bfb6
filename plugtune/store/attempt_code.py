"""The plugin code each attempt of a job ran (``attempt_code``): what tells the steps of a job retried
with new code (``plugtune jobs retry ID --code DIR``) apart."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import delete, insert, select

from plugtune.store.base import StoreBase, dumps, loads
from plugtune.store.jobs import require_job
from plugtune.store.schema import attempt_code as C  # noqa: N812 - the table, as SQL names it


@dataclass(frozen=True)
class AttemptCode:
    """The code attempt ``attempt`` ran: the set's ``code_hash``, each plugin file's
    (``{file: {"code_hash", "file", "path"}}``) and its ``source`` ("submitted" or the --code folder)."""

    attempt: int
    code_hash: str
    plugins: dict[str, dict[str, Any]] = field(default_factory=dict)
    source: str = ""
    created_at: float = 0.0


class AttemptCodeTable(StoreBase):
    def record_attempt_code(
        self, job_id: int, attempt: int, code_hash: str, plugins: dict[str, dict[str, Any]], source: str
    ) -> None:
        """Record the code attempt ``attempt`` runs (replacing what an earlier call recorded for it)."""
        row = {
            "job_id": job_id,
            "attempt": attempt,
            "code_hash": code_hash,
            "plugins": dumps(plugins),
            "source": source,
            "created_at": self._clock(),
        }
        with self._db.write("recording an attempt's code") as conn:
            require_job(conn, job_id)
            conn.execute(delete(C).where(C.c.job_id == job_id, C.c.attempt == attempt))
            conn.execute(insert(C), row)

    def attempt_code(self, job_id: int) -> list[AttemptCode]:
        """The code of each of the job's attempts that recorded one, oldest attempt first."""
        query = select(C).where(C.c.job_id == job_id).order_by(C.c.attempt)
        with self._db.read("reading attempts' code") as conn:
            return [
                AttemptCode(r.attempt, r.code_hash, loads(r.plugins), r.source, r.created_at)
                for r in conn.execute(query)
            ]
