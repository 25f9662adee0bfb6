"""Environment and defaults, read in one place."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Settings:
    """Where plugtune keeps its state and how its services are reached.

    PLUGTUNE_HOME: state folder (default ``.plugtune`` in the working directory).
    PLUGTUNE_DATABASE_URL: SQLAlchemy URL; default SQLite at ``$PLUGTUNE_HOME/plugtune.db``.
    PLUGTUNE_API_TOKEN: bearer token the console and API require when set.
    PLUGTUNE_RETENTION_DAYS: how long an ended plugin's monitoring data is kept (default 7;
    ``plugtune serve --retention-days``).
    PLUGTUNE_MAX_FUNCTIONS / _MAX_INSTANCES / _TOTAL_MEMORY_MB: the quota of each function runtime
    (each job attempt's; defaults 32, 64, 16384; ``plugtune serve --max-functions`` ...).
    PLUGTUNE_RAY_ADDRESS: the Ray cluster (``host:port`` or ``auto``) of jobs whose
    ``plugins.runtime_backend`` is ``ray``; unset: each such job starts a local Ray head.
    PLUGTUNE_ALLOWED_HOSTS: comma-separated names the console answers to besides localhost,
    127.0.0.1, ::1 and the address it is bound to (its Host header; any other is a 400).
    PLUGTUNE_SUBMIT_SECRETS: comma-separated names of variables a job submitted over the API may
    import as ``secrets`` (``plugtune serve --secret``); none by default.
    PLUGTUNE_SHARED_DIRS: folders (separated by ``:``) whose files a job submitted over the API may
    name as data or plugins besides the files it sent (``plugtune serve --shared-dir``); none by default.
    """

    home: Path
    database_url: str
    api_token: str | None
    retention_days: float
    max_functions: int
    max_instances: int
    total_memory_mb: int
    ray_address: str | None = None
    allowed_hosts: tuple[str, ...] = ()
    submit_secrets: tuple[str, ...] = ()
    shared_dirs: tuple[Path, ...] = ()

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Settings:
        env = dict(os.environ if environ is None else environ)
        home = Path(env.get("PLUGTUNE_HOME", ".plugtune")).resolve()
        return cls(
            home=home,
            database_url=env.get("PLUGTUNE_DATABASE_URL") or f"sqlite:///{home / 'plugtune.db'}",
            api_token=env.get("PLUGTUNE_API_TOKEN") or None,
            retention_days=_number(env, "PLUGTUNE_RETENTION_DAYS", 7.0),
            max_functions=int(_number(env, "PLUGTUNE_MAX_FUNCTIONS", 32)),
            max_instances=int(_number(env, "PLUGTUNE_MAX_INSTANCES", 64)),
            total_memory_mb=int(_number(env, "PLUGTUNE_TOTAL_MEMORY_MB", 16_384)),
            ray_address=env.get("PLUGTUNE_RAY_ADDRESS") or None,
            allowed_hosts=tuple(
                h.strip() for h in env.get("PLUGTUNE_ALLOWED_HOSTS", "").split(",") if h.strip()
            ),
            submit_secrets=tuple(
                n.strip() for n in env.get("PLUGTUNE_SUBMIT_SECRETS", "").split(",") if n.strip()
            ),
            shared_dirs=tuple(
                Path(d).resolve() for d in env.get("PLUGTUNE_SHARED_DIRS", "").split(os.pathsep) if d.strip()
            ),
        )


def store_source(environ: dict[str, str] | None = None) -> str:
    """Which setting chose the store's place, in words (for "no store here" messages)."""
    env = dict(os.environ if environ is None else environ)
    if env.get("PLUGTUNE_DATABASE_URL"):
        return "PLUGTUNE_DATABASE_URL names it"
    if "PLUGTUNE_HOME" in env:
        return f"PLUGTUNE_HOME={env['PLUGTUNE_HOME']}"
    return f"PLUGTUNE_HOME is not set, so it is .plugtune in the current folder ({Path.cwd()})"


def _number(env: dict[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} must be a number") from None
    if value <= 0:
        raise ValueError(f"environment variable {name}={raw!r} must be > 0")
    return value
