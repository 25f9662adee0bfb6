"""The runtime's quota: how many functions, instances and MiB all functions together may use."""

from __future__ import annotations

from dataclasses import dataclass, fields

from plugtune.settings import Settings

#: Upper bounds that catch typos before they reach the machine.
QUOTA_LIMITS = {"max_functions": 100_000, "max_instances": 100_000, "total_memory_mb": 64 << 20}


def how_to_raise(name: str) -> str:
    """How a user raises quota field ``name`` (``max_functions``...), for the message that hits it."""
    option = name.replace("_", "-")
    return f"raise it with `plugtune serve --{option} N` or PLUGTUNE_{name.upper()}; see `plugtune functions`"


class QuotaExceeded(Exception):
    """Creating one more function or instance would go over the runtime's quota."""


@dataclass(frozen=True)
class Quota:
    """Limits for the whole runtime; going over one is a ``Create faas fault``."""

    max_functions: int = 32
    max_instances: int = 64
    total_memory_mb: int = 16_384

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"Quota.{f.name} must be a whole number, got {value!r}")
            if not 1 <= value <= QUOTA_LIMITS[f.name]:
                raise ValueError(
                    f"Quota.{f.name}={value} is outside the allowed range 1..{QUOTA_LIMITS[f.name]}"
                )

    @classmethod
    def from_settings(cls, settings: Settings) -> Quota:
        return cls(settings.max_functions, settings.max_instances, settings.total_memory_mb)


class QuotaLedger:
    """Counts live instances and their memory against a :class:`Quota`."""

    def __init__(self, quota: Quota) -> None:
        self.quota = quota
        self.instances = 0
        self.memory_mb = 0

    def reserve(self, memory_mb: int) -> None:
        q = self.quota
        if self.instances + 1 > q.max_instances:
            raise QuotaExceeded(
                f"quota exceeded: the runtime already runs {self.instances} instances "
                f"(max_instances={q.max_instances}: {how_to_raise('max_instances')})"
            )
        if self.memory_mb + memory_mb > q.total_memory_mb:
            raise QuotaExceeded(
                f"quota exceeded: an instance of {memory_mb} MiB would bring the runtime to "
                f"{self.memory_mb + memory_mb} MiB (total_memory_mb={q.total_memory_mb}: "
                f"{how_to_raise('total_memory_mb')})"
            )
        self.instances += 1
        self.memory_mb += memory_mb

    def release(self, memory_mb: int) -> None:
        self.instances = max(0, self.instances - 1)
        self.memory_mb = max(0, self.memory_mb - memory_mb)
