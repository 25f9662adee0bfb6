"""Declared dependencies: the services a function's plugins call (an LLM judge, an API, a sandbox).

job.yaml ``dependencies:`` (or ``Runtime.deploy(..., dependencies=...)``) names each one:
``name -> URL or host:port``, or ``name -> {url, rpm, concurrency, timeout_s}``. Under
``network: policy-only`` a function reaches the policy gateway and its declared dependencies only
(``plugtune.runtime.worker.network``); a failed call on one is a ``Dependency error`` naming it.
``rpm`` and ``concurrency`` are enforced per dependency for all instances and plugins of a runtime,
on connections, in the supervisor's bridge (``plugtune.runtime.budget``); ``timeout_s`` bounds the
wait for each reply to begin, there too (a ``Dependency error`` / ``timeout`` past it, whatever the
plugin's client waits).
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
SCHEMES = {"http": 80, "https": 443, "ws": 80, "wss": 443}
OPTIONS = ("url", "rpm", "concurrency", "timeout_s")
#: Bounds that catch typos (``rpm: 6000000000``).
LIMITS: dict[str, tuple[float, float]] = {
    "rpm": (1, 10_000_000),
    "concurrency": (1, 100_000),
    "timeout_s": (0.01, 86_400),
}


@dataclass(frozen=True)
class Dependency:
    """One declared service: ``host``/``port`` are where it is reached (its URL's, unchanged)."""

    name: str
    url: str
    host: str
    port: int
    rpm: int | None = None
    concurrency: int | None = None
    timeout_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_target(text: str) -> tuple[str, int]:
    """``(host, port)`` of a URL (``http://judge:8000/v1``) or ``host:port``; raises ValueError
    saying what a valid value looks like."""
    text = text.strip()
    example = "give a URL such as http://127.0.0.1:8000/v1 or https://api.example.com, or host:port"
    if not text:
        raise ValueError(f"the address is empty: {example}")
    if "://" in text:
        parts = urllib.parse.urlsplit(text)
        if parts.scheme not in SCHEMES:
            raise ValueError(f"{text!r} has scheme {parts.scheme!r}; use one of {', '.join(SCHEMES)}")
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"{text!r} has an invalid port: {example}") from None
        if not parts.hostname:
            raise ValueError(f"{text!r} names no host: {example}")
        return parts.hostname, port or SCHEMES[parts.scheme]
    host, sep, port_text = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"{text!r} is neither a URL nor host:port: {example}")
    if "/" in host or " " in host:
        raise ValueError(f"{text!r} is not a valid host:port: {example}")
    return host.lower(), int(port_text)


def parse_dependency(name: str, value: Any) -> Dependency:
    """One entry of ``dependencies:``; raises ValueError naming the field and what to write."""
    if not isinstance(name, str) or not NAME.match(name):
        raise ValueError(
            f"dependency name {name!r} must start with a letter and hold only letters, digits, _ and - "
            "(at most 64)"
        )
    if isinstance(value, str):
        value = {"url": value}
    if not isinstance(value, Mapping):
        raise ValueError(
            f"dependency {name}: give a URL or host:port, or a mapping with url and optional "
            f"rpm, concurrency, timeout_s (got {type(value).__name__})"
        )
    unknown = sorted(set(value) - set(OPTIONS))
    if unknown:
        raise ValueError(
            f"dependency {name}: unknown key(s) {', '.join(map(str, unknown))}; allowed: {', '.join(OPTIONS)}"
        )
    url = value.get("url")
    if not isinstance(url, str):
        raise ValueError(f"dependency {name}: `url` is required (a URL or host:port)")
    try:
        host, port = parse_target(url)
    except ValueError as exc:
        raise ValueError(f"dependency {name}: {exc}") from None
    numbers: dict[str, Any] = {}
    for key, (lo, hi) in LIMITS.items():
        raw = value.get(key)
        if raw is None:
            continue
        whole = key != "timeout_s"
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or (whole and not isinstance(raw, int)):
            kind = "a whole number" if whole else "a number"
            raise ValueError(f"dependency {name}: `{key}` must be {kind}, got {raw!r}")
        if not lo <= raw <= hi:
            raise ValueError(
                f"dependency {name}: `{key}`={raw!r} is outside the allowed range {lo:g}..{hi:g}"
            )
        numbers[key] = raw
    return Dependency(name, url.strip(), host, port, **numbers)


def parse_dependencies(raw: Mapping[str, Any] | None) -> tuple[Dependency, ...]:
    """Every entry of a ``dependencies`` mapping (raises ValueError on the first bad one)."""
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise ValueError(f"dependencies must be a mapping of name -> URL, got {type(raw).__name__}")
    out = tuple(v if isinstance(v, Dependency) else parse_dependency(k, v) for k, v in raw.items())
    seen: dict[tuple[str, int], str] = {}
    for dep in out:
        other = seen.setdefault((dep.host, dep.port), dep.name)
        if other != dep.name:
            raise ValueError(f"dependencies {other} and {dep.name} are both {dep.host}:{dep.port}; keep one")
    return out


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def wire(dependencies: tuple[Dependency, ...]) -> list[list[Any]]:
    """What an instance's config carries: ``[name, host, port]`` per dependency (JSON-safe)."""
    return [[d.name, d.host, d.port] for d in dependencies]
