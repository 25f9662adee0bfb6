"""A job's ``env`` in the caller's own process, for the in-process runtime: set while the plugins'
code runs there and put back after, with the function runtime's rules for what it may set."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from plugtune.runtime.backend import DeployFailed
from plugtune.runtime.worker.zygote import is_loader_variable


class SharedEnviron:
    """The functions' ``env`` (job.yaml ``env:``/``secrets:``) in this process while their code runs
    here (the import, ``setup()``, ``async def`` calls), put back as it was once none runs: the
    caller keeps its own environment. A sync call sets it in its forked child only."""

    def __init__(self) -> None:
        self.holders: dict[str, int] = {}
        self.saved: dict[str, str | None] = {}
        self.values: dict[str, str] = {}  # what each name was given: every function must agree

    def check(self, env: Mapping[str, str]) -> None:
        """DeployFailed when ``env`` gives a name another value than a function deployed before."""
        clash = sorted(k for k, v in env.items() if self.values.get(k, v) != v)
        if clash:
            raise DeployFailed(
                f"env: {', '.join(clash)} differs from another function's: in-process, every function "
                "shares this process's environment; give them the same env, or use the function "
                "runtime (`plugtune test --faas`)"
            )
        self.values.update(env)

    @contextmanager
    def held(self, env: Mapping[str, str]) -> Iterator[None]:
        for name, value in env.items():
            if not self.holders.get(name):
                self.saved[name] = os.environ.get(name)
            self.holders[name] = self.holders.get(name, 0) + 1
            os.environ[name] = value
        try:
            yield
        finally:
            for name in env:
                self.holders[name] -= 1
                if self.holders[name] == 0:
                    del self.holders[name]
                    old = self.saved.pop(name)
                    if old is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = old


def function_env(env: Mapping[str, str]) -> dict[str, str]:
    """What a function's ``env`` sets, as the function runtime's worker applies it: never HOME,
    TMPDIR or PLUGTUNE_*; DeployFailed naming loader and interpreter variables (LD_*, PYTHON*)."""
    refused = sorted(name for name in env if is_loader_variable(name))
    if refused:
        raise DeployFailed(
            f"env: {', '.join(refused)} refused: loader and interpreter variables (LD_*, PYTHON*, "
            "MALLOC_*, GCONV_PATH, GLIBC_TUNABLES, ...) change how the platform's own processes run; "
            "remove them from job.yaml env:/secrets: (or deploy(env=...)) and set what the plugin "
            "needs in its own code"
        )
    return {
        k: str(v) for k, v in env.items() if k not in ("HOME", "TMPDIR") and not k.startswith("PLUGTUNE_")
    }
