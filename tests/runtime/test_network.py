"""Runtime(network=...): what a plugin instance can reach (none, policy-only, any)."""

from __future__ import annotations

import asyncio
import json
import platform
import socket
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from plugtune.demo import MODEL_DIR
from plugtune.errors import Cause, PluginCallError
from plugtune.gateway import PolicyGateway
from plugtune.runtime import LocalRuntime
from plugtune.sdk import Context, Runtime
from tests.runtime.helpers import ctx, entry, eventually, sample, trajectory

POSTGRES = 5432


@pytest.fixture
def listener() -> Iterator[int]:
    """A port on this host's 127.0.0.1 that accepts connections (the test's own service)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield sock.getsockname()[1]


@pytest.fixture(scope="module")
def gateway() -> Iterator[PolicyGateway]:
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR)
    with PolicyGateway(model, AutoTokenizer.from_pretrained(MODEL_DIR)) as gw:
        yield gw


@pytest.fixture
async def rt() -> AsyncIterator[LocalRuntime]:
    async with LocalRuntime() as runtime:
        yield runtime


async def test_none_reaches_no_port_of_the_host(rt: LocalRuntime, listener: int) -> None:
    fn = await rt.deploy(entry("reach.py", "connects"), runtime={"network": "none"})
    with pytest.raises(PluginCallError, match="ConnectionRefusedError") as info:
        await fn.invoke(ctx(), sample(port=listener), trajectory())
    assert info.value.cause == Cause.ERROR_500.value


async def test_any_reaches_the_host(rt: LocalRuntime, listener: int) -> None:
    fn = await rt.deploy(entry("reach.py", "connects"), runtime={"network": "any"})
    assert (await fn.invoke(ctx(), sample(port=listener), trajectory())).value == 1.0
    decorated = await rt.deploy(entry("reach.py", "connects_any"))  # the decorator asks for it
    assert decorated.runtime.network == "any"
    assert (await decorated.invoke(ctx(), sample(port=listener), trajectory())).value == 1.0


async def test_policy_only_is_the_default_and_reaches_no_other_port(rt: LocalRuntime, listener: int) -> None:
    fn = await rt.deploy(entry("reach.py", "connects"))
    assert fn.runtime.network == "policy-only"
    with pytest.raises(
        PluginCallError, match=f"network policy-only: refused a connection to 127.0.0.1:{listener}"
    ):
        await fn.invoke(ctx(), sample(port=listener), trajectory())


def _rollout_logs(out: Any) -> dict[str, str]:
    line = next(x.message for x in out.logs if x.message.startswith("reached "))
    return dict(json.loads(line[len("reached ") :]))


@pytest.mark.parametrize("mode", ["policy-only", "any"])
async def test_rollout_reaches_the_real_gateway(
    rt: LocalRuntime, gateway: PolicyGateway, listener: int, mode: str
) -> None:
    fn = await rt.deploy(entry("reach.py", "asks_policy"), runtime={"network": mode})
    for i in range(3):  # the forwarder serves every call, on kept-alive connections too
        tid = f"t{mode}{i}"
        policy = gateway.open(tid)
        out = await fn.invoke(Context(trajectory_id=tid), policy, sample(ports=[listener, POSTGRES]))
        assert out.status == "success" and any(x.message.startswith("answered ") for x in out.logs)
        assert gateway.take(tid).response_ids  # the gateway recorded the trajectory's tokens
        reached = _rollout_logs(out)
    if mode == "any":
        assert reached[str(listener)] == "reached"
    else:
        assert reached[str(listener)].startswith("refused")
        assert reached[str(POSTGRES)].startswith("refused")


async def test_bridge_refuses_any_other_address_with_a_log_line(
    rt: LocalRuntime, gateway: PolicyGateway, listener: int
) -> None:
    """A plugin that talks to the policy bridge itself gets its policy and nothing else."""
    fn = await rt.deploy(entry("reach.py", "forges_bridge"))
    out = await fn.invoke(ctx(), sample(port=listener), trajectory())
    assert out.value == 0.0
    # the log line may come after the reply: wait for it, then a moment for any second one
    await eventually(lambda: any("refused a connection" in x.message for x in fn.logs()))
    await asyncio.sleep(0.05)
    refused = [x.message for x in fn.logs() if "refused a connection" in x.message]
    assert refused == [
        f"network policy-only: refused a connection to 127.0.0.1:{listener} "
        "(only the policy this function's calls were given and its declared dependencies are reachable: "
        f"declare the service in job.yaml `dependencies:`, e.g. `judge: http://127.0.0.1:{listener}`, "
        "or set `network: any`)"
    ]


def test_runtime_network_is_checked() -> None:
    assert Runtime().network == "policy-only"
    with pytest.raises(ValueError, match="Runtime.network='lan' must be one of: none, policy-only, any"):
        Runtime(network="lan")


NO_NAMESPACES = textwrap.dedent(
    """
    import asyncio, ctypes, struct, sys
    # seccomp: unshare() fails with EPERM, as in a container without CAP_SYS_ADMIN and user namespaces
    NR_UNSHARE, AUDIT_ARCH_X86_64 = 272, 0xC000003E
    def insn(code, jt, jf, k):
        return struct.pack("HBBI", code, jt, jf, k)
    prog = b"".join([
        insn(0x20, 0, 0, 4), insn(0x15, 1, 0, AUDIT_ARCH_X86_64), insn(0x06, 0, 0, 0x7FFF0000),
        insn(0x20, 0, 0, 0), insn(0x15, 0, 1, NR_UNSHARE), insn(0x06, 0, 0, 0x00050000 | 1),
        insn(0x06, 0, 0, 0x7FFF0000),
    ])
    buf = ctypes.create_string_buffer(prog)
    fprog = struct.pack("HxxxxxxQ", len(prog) // 8, ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(38, 1, 0, 0, 0) == 0  # no_new_privs
    assert libc.prctl(22, 2, ctypes.c_char_p(fprog), 0, 0) == 0, ctypes.get_errno()  # SECCOMP_MODE_FILTER
    from plugtune.runtime import LocalRuntime
    from plugtune.errors import PluginCallError
    async def main():
        async with LocalRuntime() as rt:
            for mode in ("none", "policy-only"):
                try:
                    await rt.deploy(sys.argv[1], runtime={"network": mode})
                except PluginCallError as exc:
                    print(mode, "|", exc.cause, "|", exc.message)
            fn = await rt.deploy(sys.argv[1], runtime={"network": "any"})
            print("any | deployed |", fn.runtime.network)
    asyncio.run(main())
    """
)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the seccomp filter is written for x86-64")
def test_a_host_without_namespaces_fails_the_deploy_and_names_the_way_out() -> None:
    done = subprocess.run(
        [sys.executable, "-c", NO_NAMESPACES, entry("reach.py", "connects")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    for mode, line in zip(("none", "policy-only"), lines[:2], strict=True):
        name, cause, message = line.split(" | ")
        assert (name, cause) == (mode, Cause.CREATE_FAULT.value)
        assert f"network: {mode} needs a network namespace of its own" in message
        assert "unshare(CLONE_NEWNET) failed (EPERM" in message
        assert "set `network: any`" in message
    assert lines[2] == "any | deployed | any"
