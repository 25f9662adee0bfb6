"""Running one call inside an instance: decode, run (or inject a fault), encode the reply."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
import urllib.parse
from typing import Any

from plugtune.runtime.protocol import (
    CANCELLED,
    ERR,
    MEMORY,
    OK,
    POLICY_REFUSED,
    RAISED,
    decode_args,
    decode_context,
    dependency_kind,
    encode_result,
    encode_status,
)
from plugtune.runtime.worker.channel import CURRENT_CALL, Channel
from plugtune.runtime.worker.dependency import find
from plugtune.runtime.worker.loader import Plugin, signal_error_in, user_traceback
from plugtune.runtime.worker.network import PolicyForwarder
from plugtune.runtime.worker.sandbox import limit_hint, limit_kind
from plugtune.sdk import Discard, Kind, Retry

INJECTED_EXIT_CODE = 71


class CallRunner:
    """Runs calls of one plugin and sends each reply on the channel (from any thread)."""

    def __init__(self, plugin: Plugin, channel: Channel, code_root: str, memory_mb: int) -> None:
        self.plugin = plugin
        self.kind = plugin.spec.kind
        self.channel = channel
        self.code_root = code_root
        self.memory_mb = memory_mb
        self.logger = logging.getLogger(f"plugtune.plugin.{plugin.spec.name}")
        self.forwarder: PolicyForwarder | None = None  # network policy-only: the way to the policy
        self.declared: dict[tuple[str, int], str] = {}  # (host, port) -> declared dependency's name
        self.policy: set[tuple[str, int]] = set()  # where this instance's rollouts reach their policy

    def _decode(self, args_raw: list[Any]) -> tuple[Any, Any]:
        if self.forwarder is not None and self.kind is Kind.ROLLOUT:
            args_raw[0]["base_url"] = self.forwarder.route(args_raw[0]["base_url"])
        if self.kind is Kind.ROLLOUT and len(self.policy) < 64:
            self.policy.add(_address(str(args_raw[0].get("base_url") or "")))
        return decode_args(self.kind, args_raw)

    def run_sync(self, call_id: str, ctx_raw: list[Any], args_raw: list[Any], fault: str | None) -> None:
        ctx = decode_context(ctx_raw, self.logger)
        token = CURRENT_CALL.set((call_id, ctx.trajectory_id))
        try:
            args = self._decode(args_raw)
            value = self._sync_fault(fault, ctx, args) if fault else self.plugin.function(ctx, *args)
            reply = [OK, call_id, encode_result(value), ctx.metrics]
        except BaseException as exc:  # noqa: BLE001 - every failure is reported, by kind
            reply = self._failure(call_id, exc, ctx.metrics)
        finally:
            CURRENT_CALL.reset(token)
        self.channel.send(reply)

    async def run_async(
        self, call_id: str, ctx_raw: list[Any], args_raw: list[Any], fault: str | None, alone: Any = None
    ) -> None:
        ctx = decode_context(ctx_raw, self.logger)
        CURRENT_CALL.set((call_id, ctx.trajectory_id))  # the task has its own context
        try:
            args = self._decode(args_raw)
            if fault:
                value = await self._async_fault(fault, ctx, args)
            else:
                value = await self.plugin.function(ctx, *args)
            reply = [OK, call_id, encode_result(value), ctx.metrics]
        except BaseException as exc:  # noqa: BLE001
            reply = self._failure(call_id, exc, ctx.metrics)
        self.channel.queue(reply, asyncio.get_running_loop(), alone() if alone is not None else False)

    def _failure(self, call_id: str, exc: BaseException, metrics: dict[str, float]) -> list[Any]:
        if isinstance(exc, Retry):
            return [OK, call_id, self._retry_status(exc), metrics]
        if isinstance(exc, Discard):
            return [OK, call_id, encode_status("discard", exc.reason), metrics]
        if isinstance(exc, asyncio.CancelledError):
            return [ERR, call_id, CANCELLED, "cancelled by the runtime", "", metrics]
        if isinstance(exc, (SystemExit, KeyboardInterrupt)):
            self._exit_like(exc)
        kind = MEMORY if isinstance(exc, MemoryError) else (limit_kind(exc) or RAISED)
        message = f"{type(exc).__name__}: {exc}" + _signal_hint(exc) + limit_hint(exc)
        if kind == RAISED:
            try:
                finding = find(exc, self.code_root, self.declared, self.policy)
            except Exception:  # noqa: BLE001 - reading a strange exception must not lose the failure
                finding = None
            if finding is not None and finding.policy_refused:
                kind = POLICY_REFUSED
                if "network policy-only" not in message:  # a client that hid the cause's text
                    message = f"{message} — {finding.message()}"
            elif finding is not None:
                kind = dependency_kind(finding.cause, finding.dependency, finding.retry_after_s())
                message = finding.message()
        return [ERR, call_id, kind, message, user_traceback(exc, self.code_root), metrics]

    def _retry_status(self, exc: BaseException) -> dict[str, Any]:
        """A plugin's ``Retry``; raised on a dependency's failure (``raise Retry(...)`` in the
        ``except`` block, or ``from`` it), it carries that dependency's cause, name and Retry-After,
        so the job's caller backs off as it does for a Dependency error."""
        status = encode_status("retry", exc.reason)  # type: ignore[attr-defined]
        try:
            finding = find(exc, self.code_root, self.declared, self.policy)
        except Exception:  # noqa: BLE001 - reading a strange exception must not lose the status
            finding = None
        if finding is not None and not finding.policy_refused:
            status["dependency"] = {
                "cause": finding.cause,
                "name": finding.dependency,
                "retry_after_s": finding.retry_after_s(),
                "message": finding.message(),
            }
        return status

    def _exit_like(self, exc: BaseException) -> None:
        """``sys.exit`` in plugin code ends the instance, as it would any Python process."""
        code = exc.code if isinstance(exc, SystemExit) else 130
        status = code if isinstance(code, int) else 1
        self.channel.log("WARNING", f"plugin called sys.exit({code!r}); the instance exits", "runtime")
        _flush_std()
        os._exit(status)

    def _sync_fault(self, fault: str, ctx: Any, args: tuple[Any, Any]) -> Any:
        self.channel.log("WARNING", f"injecting fault {fault!r} (FaultInjection)", "runtime")
        if fault == "timeout":
            time.sleep(ctx.remaining_s + 1.0)
        elif fault == "eof":
            _flush_std()
            os._exit(INJECTED_EXIT_CODE)
        elif fault == "oom":
            allocate_past(self.memory_mb)
        elif fault == "500":
            raise RuntimeError("injected fault: 500 (FaultInjection)")
        elif fault == "nan":
            return self._nan(args)
        return self.plugin.function(ctx, *args)

    async def _async_fault(self, fault: str, ctx: Any, args: tuple[Any, Any]) -> Any:
        if fault == "timeout":
            self.channel.log("WARNING", "injecting fault 'timeout' (FaultInjection)", "runtime")
            await asyncio.sleep(ctx.remaining_s + 1.0)
            return await self.plugin.function(ctx, *args)
        if fault == "oom":  # off the event loop: its watchdog would blame this frame, not the plugin
            self.channel.log("WARNING", "injecting fault 'oom' (FaultInjection)", "runtime")
            await asyncio.to_thread(allocate_past, self.memory_mb)
        if fault in ("eof", "500", "nan"):
            return self._sync_fault(fault, ctx, args)
        return await self.plugin.function(ctx, *args)

    def _nan(self, args: tuple[Any, Any]) -> Any:
        if self.kind is Kind.GROUP_GRADER:
            return [float("nan")] * len(args[1])
        if self.kind is Kind.GRADER:
            return float("nan")
        return None  # a rollout has no reward to poison


def _address(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        port = 0
    return (parts.hostname or "").lower(), port


def _signal_hint(exc: BaseException) -> str:
    found = signal_error_in(exc)
    if found is None or threading.current_thread() is threading.main_thread():
        return ""
    cause = "" if found is exc else f"; the error's cause: {type(found).__name__}: {found}"
    return (
        " (this sync plugin has max_concurrency > 1, so its calls run on pool threads, where Python"
        " cannot install signal handlers, e.g. signal-based timeouts such as math-verify's: set"
        " max_concurrency: 1 in its Runtime so that every call runs on the instance's main thread,"
        f" and scale with max_instances instead{cause})"
    )


def allocate_past(limit_mb: int) -> None:
    """Really allocate (and touch) more than ``limit_mb``, the way a leaking plugin does."""
    hold = []
    for _ in range((limit_mb * 2 + 256) // 8 + 1):
        hold.append(b"\x01" * (8 << 20))
    time.sleep(2.0)  # a supervisor-side watchdog kills an instance that is over its limit
    raise MemoryError(f"allocated {len(hold) * 8} MiB past memory_mb={limit_mb} without being stopped")


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001, S110 - exiting anyway
            pass
