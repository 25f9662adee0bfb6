"""Query parameters as HTML forms send them (blank = not set), parsed with errors that say what to fix,
and the bounds of path parameters (an id the store cannot hold is a 4xx, never a 500)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated
from urllib.parse import urlencode

from fastapi import Path

from plugtune.web.queries import JobFilter, LogFilter, TrajectoryFilter

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
TRAJECTORY_STATUSES = ("success", "failed", "discard")
PHASES = ("train", "eval")  # eval: data.validation, evaluated during training
MAX_ID = 2**63 - 1  # the store's integers are 64-bit
MAX_PAGE = 10**9
MAX_SEARCH = 200  # characters of a name search (a job's name is at most 200)

JobId = Annotated[int, Path(ge=1, le=MAX_ID, description="the job's id")]
PluginName = Annotated[str, Path(min_length=1, max_length=256, description="the plugin's name")]
RecordId = Annotated[str, Path(min_length=1, max_length=512, description="a trajectory or group id")]
FilePath = Annotated[str, Path(min_length=1, max_length=1024, description="a file's path in the code")]


class BadParameter(ValueError):
    """Raised when a query parameter cannot be used; the message names it and says what is expected."""


def text(raw: str | None) -> str | None:
    value = (raw or "").strip()
    return value or None


def integer(name: str, raw: str | None, *, minimum: int | None = None, maximum: int = MAX_ID) -> int | None:
    value = text(raw)
    if value is None:
        return None
    if len(value) > 40 and value.lstrip("-").isdigit():  # int() of a huge string is slow and useless
        bound = f">= {minimum}" if value.startswith("-") and minimum is not None else f"<= {maximum}"
        raise BadParameter(f"{name} must be {bound}, got a {len(value)}-digit number")
    try:
        number = int(value)
    except ValueError:
        raise BadParameter(f"{name} must be a whole number, got {value[:40]!r}") from None
    if minimum is not None and number < minimum:
        raise BadParameter(f"{name} must be >= {minimum}, got {number}")
    if number > maximum:
        raise BadParameter(f"{name} must be <= {maximum}, got {value[:40]}")
    return number


def number(name: str, raw: str | None) -> float | None:
    value = text(raw)
    if value is None:
        return None
    try:
        parsed = float(value)
    except ValueError:
        raise BadParameter(f"{name} must be a number, got {value!r}") from None
    if parsed != parsed or parsed in (float("inf"), float("-inf")):
        raise BadParameter(f"{name} must be a finite number, got {value!r}")
    return parsed


def choice(name: str, raw: str | None, allowed: tuple[str, ...], *, upper: bool = False) -> str | None:
    value = text(raw)
    if value is None:
        return None
    value = value.upper() if upper else value
    if value not in allowed:
        raise BadParameter(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
    return value


@dataclass(frozen=True)
class JobForm:
    """The jobs list's search as it appears in its URL: name substring, status, error cause."""

    q: str | None = None
    status: str | None = None
    cause: str | None = None

    @classmethod
    def parse(
        cls, q: str | None, status: str | None, cause: str | None, statuses: tuple[str, ...]
    ) -> JobForm:
        name = text(q)
        if name is not None and len(name) > MAX_SEARCH:
            raise BadParameter(f"q must be at most {MAX_SEARCH} characters, got {len(name)}")
        return cls(name, choice("status", status, statuses), text(cause))

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.q, self.status, self.cause))

    def to_filter(self) -> JobFilter:
        return JobFilter(q=self.q, status=self.status, cause=self.cause)

    def query(self, **extra: object) -> str:
        values = {"q": self.q, "status": self.status, "cause": self.cause, **extra}
        return urlencode({k: v for k, v in values.items() if v is not None and v != ""})


@dataclass(frozen=True)
class LogForm:
    """The Logs page's filters as they appear in its URL."""

    plugin: str | None = None
    level: str | None = None
    trajectory: str | None = None
    q: str | None = None

    @classmethod
    def parse(cls, plugin: str | None, level: str | None, trajectory: str | None, q: str | None) -> LogForm:
        return cls(text(plugin), choice("level", level, LEVELS, upper=True), text(trajectory), text(q))

    def to_filter(self) -> LogFilter:
        return LogFilter(plugin=self.plugin, level=self.level, trajectory_id=self.trajectory, text=self.q)

    def query(self, **extra: object) -> str:
        values = {
            "plugin": self.plugin,
            "level": self.level,
            "trajectory": self.trajectory,
            "q": self.q,
            **extra,
        }
        return urlencode({k: v for k, v in values.items() if v is not None and v != ""})


@dataclass(frozen=True)
class TrajectoryForm:
    """The Trajectory analysis page's filters as they appear in its URL."""

    status: str | None = None
    phase: str | None = None
    plugin: str | None = None
    step: int | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    q: str | None = None

    @classmethod
    def parse(
        cls,
        status: str | None,
        plugin: str | None,
        step: str | None,
        min_reward: str | None,
        max_reward: str | None,
        q: str | None,
        phase: str | None = None,
    ) -> TrajectoryForm:
        return cls(
            status=choice("status", status, TRAJECTORY_STATUSES),
            phase=choice("phase", phase, PHASES),
            plugin=text(plugin),
            step=integer("step", step, minimum=0),
            min_reward=number("min_reward", min_reward),
            max_reward=number("max_reward", max_reward),
            q=text(q),
        )

    @property
    def any(self) -> bool:
        return any(v is not None for v in self.__dict__.values())

    def to_filter(self) -> TrajectoryFilter:
        return TrajectoryFilter(
            status=self.status,
            phase=self.phase,
            step=self.step,
            plugin=self.plugin,
            text=self.q,
            min_reward=self.min_reward,
            max_reward=self.max_reward,
        )

    def api_query(self) -> str:
        return self.query()

    def query(self, **extra: object) -> str:
        values = {**self.__dict__, **extra}
        return urlencode({k: v for k, v in values.items() if v is not None and v != ""})
