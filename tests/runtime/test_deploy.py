"""Deploying: code snapshots, bad input as clear Create faas faults, quota, setup()."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from plugtune.errors import Cause, PluginCallError
from plugtune.runtime import LocalRuntime, Quota
from plugtune.sdk import Kind, Runtime
from tests.runtime.helpers import FIXTURES, ctx, entry, sample, trajectory


async def test_snapshot_is_content_addressed_and_kept(tmp_path: Path) -> None:
    src = tmp_path / "plugin"
    src.mkdir()
    (src / "grader.py").write_text(
        "from plugtune import grader\nfrom helper import VALUE\n\n\n"
        "@grader\ndef score(ctx, sample, trajectory):\n    return VALUE\n"
    )
    (src / "helper.py").write_text("VALUE = 0.25\n")
    state = tmp_path / "state"
    async with LocalRuntime(state_dir=state) as rt:
        fn = await rt.deploy(f"{src / 'grader.py'}:score")
        assert (await fn.invoke(ctx(), sample(), trajectory())).value == 0.25
        code = fn.code()
        assert set(code) == {"grader.py", "helper.py"} and code["helper.py"] == b"VALUE = 0.25\n"
        assert (state / "code" / fn.code_hash / "grader.py").exists()
        (src / "helper.py").write_text("VALUE = 0.5\n")  # editing the source does not change what runs
        assert (await fn.invoke(ctx(), sample(), trajectory())).value == 0.25
        again = await rt.deploy(f"{src / 'grader.py'}:score")
        assert again.code_hash != fn.code_hash
        assert (await again.invoke(ctx(), sample(), trajectory())).value == 0.5
    assert (state / "code" / fn.code_hash / "helper.py").read_text() == "VALUE = 0.25\n"


async def test_spec_and_runtime_override() -> None:
    async with LocalRuntime() as rt:
        fn = await rt.deploy(entry("basic.py", "exact"))
        assert fn.spec.kind is Kind.GRADER and fn.spec.name == "exact" and not fn.spec.is_async
        assert fn.runtime.memory_mb == 256 and fn.status == "running"
        override = Runtime(memory_mb=128, timeout_s=2, max_concurrency=2)
        fn2 = await rt.deploy(entry("basic.py", "exact"), runtime=override)
        assert fn2.runtime == override
        await fn2.close()
        assert fn2.status == "closed"


BAD_ENTRIES = [
    ("missing.py", "score", "no such file"),
    ("syntax_error.py", "score", "syntax_error.py:5: syntax error"),
    ("import_error.py", "score", "ModuleNotFoundError: No module named 'plugtune_no_such_module'"),
    ("bad_signature.py", "score", "@grader score: takes 2 positional arguments"),
    ("basic.py", "not_a_plugin", "basic.py:not_a_plugin: is not a plugin; decorate it"),
    ("basic.py", "nope", "has no function named 'nope'"),
    ("setup_fails.py", "score", "setup() failed: RuntimeError: could not load the judge model"),
]


@pytest.mark.parametrize(
    ("file", "function", "says"), BAD_ENTRIES, ids=[b[0] + ":" + b[1] for b in BAD_ENTRIES]
)
async def test_bad_plugin_is_create_fault_naming_the_problem(file: str, function: str, says: str) -> None:
    async with LocalRuntime() as rt:
        with pytest.raises(PluginCallError) as info:
            await rt.deploy(entry(file, function))
        error = info.value
        assert error.cause == Cause.CREATE_FAULT.value
        assert says in error.message, error.message
        assert file in error.plugin
        good = await rt.deploy(entry("basic.py", "noop"))  # the runtime keeps serving
        assert (await good.invoke(ctx(), sample(), trajectory())).value == 0.0


async def test_the_name_the_job_gives_a_plugin_names_its_errors_from_the_runtime() -> None:
    async with LocalRuntime() as rt:
        with pytest.raises(PluginCallError) as info:
            await rt.deploy(entry("syntax_error.py", "score"), name="judge")
        assert info.value.cause == Cause.CREATE_FAULT.value and info.value.plugin == "judge"
        with pytest.raises(PluginCallError) as info:
            await rt.deploy("no-colon-here", name="judge")
        assert info.value.plugin == "judge"
        named = await rt.deploy(entry("faults.py", "raises"), name="judge")
        with pytest.raises(PluginCallError) as info:
            await named.invoke(ctx(), sample(fail=True), trajectory())
        assert (info.value.cause, info.value.plugin) == (Cause.ERROR_500.value, "judge")
        assert info.value.record().evidence["plugin"] == "judge"
        unnamed = await rt.deploy(entry("faults.py", "raises"))  # no name: its entry
        with pytest.raises(PluginCallError) as info:
            await unnamed.invoke(ctx(), sample(fail=True), trajectory())
        assert info.value.plugin == entry("faults.py", "raises")


@pytest.mark.parametrize(
    ("file", "where", "module"),
    [
        (
            "import_error.py",
            "import_error.py:1: importing the plugin module failed",
            "plugtune_no_such_module",
        ),
        ("setup_missing_package.py", "setup_missing_package.py:5: setup() failed", "plugtune_no_such_judge"),
    ],
)
async def test_a_missing_package_says_where_to_install_it(file: str, where: str, module: str) -> None:
    async with LocalRuntime() as rt:
        with pytest.raises(PluginCallError) as info:
            await rt.deploy(entry(file, "score"))
    error = info.value
    assert error.cause == Cause.CREATE_FAULT.value
    assert error.message.startswith(where), error.message
    assert f"No module named '{module}" in error.message
    assert f"`{sys.executable} -m pip install {module}`" in error.message


async def test_import_error_and_failing_setup_point_at_the_user_line() -> None:
    async with LocalRuntime() as rt:
        with pytest.raises(PluginCallError) as info:
            await rt.deploy(entry("import_error.py", "score"))
        assert info.value.traceback.splitlines()[0].startswith("import_error.py:1")
        with pytest.raises(PluginCallError) as info:
            await rt.deploy(entry("setup_fails.py", "score"))
        assert info.value.traceback.splitlines()[0] == "setup_fails.py:8 in setup"
        assert any("setting up" in line.message for line in info.value.logs)


async def test_setup_runs_once_per_instance() -> None:
    async with LocalRuntime() as rt:
        fn = await rt.deploy(entry("setup_ok.py", "score"))
        assert (await fn.invoke(ctx(), sample(), trajectory())).value == 0.75


async def test_malformed_entries_and_limits_are_clear_errors() -> None:
    async with LocalRuntime() as rt:
        for bad in ("no_colon.py", f"{FIXTURES / 'basic.py'}:", f"{FIXTURES / 'basic.py'}:not-ident"):
            with pytest.raises(PluginCallError, match="must look like 'path/to/file.py:function'"):
                await rt.deploy(bad)
        with pytest.raises(PluginCallError, match="more than this machine has"):
            await rt.deploy(entry("basic.py", "noop"), runtime=Runtime(memory_mb=200_000))
        with pytest.raises(TypeError, match="env must be a dict"):
            await rt.deploy(entry("basic.py", "noop"), env={"A": 1})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="outside the allowed range"):
        Runtime(memory_mb=-5)
    with pytest.raises(ValueError, match="Quota.max_instances"):
        Quota(max_instances=0)
    with pytest.raises(ValueError, match="limits="):
        LocalRuntime(limits="docker")


async def test_quota_exceeded_is_create_fault_and_others_keep_working() -> None:
    async with LocalRuntime(quota=Quota(max_functions=1, max_instances=4, total_memory_mb=600)) as rt:
        fn = await rt.deploy(entry("basic.py", "exact"))
        with pytest.raises(PluginCallError, match="max_functions=1") as info:
            await rt.deploy(entry("basic.py", "noop"))
        assert info.value.cause == Cause.CREATE_FAULT.value
        assert (await fn.invoke(ctx(), sample(), trajectory())).value == 1.0
    async with LocalRuntime(quota=Quota(total_memory_mb=300)) as rt:
        fn = await rt.deploy(entry("basic.py", "exact"))  # one 256 MiB instance fits
        with pytest.raises(PluginCallError, match="total_memory_mb=300") as info:
            await rt.deploy(entry("basic.py", "noop"), runtime=Runtime(memory_mb=128))
        assert info.value.cause == Cause.CREATE_FAULT.value
        assert (await fn.invoke(ctx(), sample(), trajectory())).value == 1.0


async def test_env_reaches_the_plugin() -> None:
    async with LocalRuntime() as rt:
        fn = await rt.deploy(entry("basic.py", "reads_env"), env={"REWARD_VALUE": "0.125"})
        assert (await fn.invoke(ctx(), sample(), trajectory())).value == 0.125


async def test_instance_quota_spares_yield_then_create_fault() -> None:
    async with LocalRuntime(quota=Quota(max_instances=2)) as rt:
        first = await rt.deploy(entry("basic.py", "exact"))  # 1 instance + maybe its spare
        second = await rt.deploy(entry("basic.py", "noop"))  # takes the spare's slot if needed
        with pytest.raises(PluginCallError, match="max_instances=2") as info:
            await rt.deploy(entry("basic.py", "unscorable"))
        assert info.value.cause == Cause.CREATE_FAULT.value
        assert (await first.invoke(ctx(), sample(), trajectory())).value == 1.0
        assert (await second.invoke(ctx(), sample(), trajectory())).value == 0.0


async def test_a_spare_still_starting_gives_its_quota_slot_to_a_serving_instance() -> None:
    async with LocalRuntime(quota=Quota(max_instances=2)) as rt:
        slow = await rt.deploy(entry("slow_start.py", "score"))  # its spare now takes 0.8 s to start
        fast = await rt.deploy(entry("basic.py", "noop"))  # needs the slot the starting spare holds
        assert (await fast.invoke(ctx(), sample(), trajectory())).value == 0.0
        assert (await slow.invoke(ctx(), sample(), trajectory())).value == 1.0


@pytest.mark.parametrize(
    ("file", "says"),
    [
        ("slow_import.py", "importing the plugin took longer than 1 s"),
        ("slow_setup.py", "not ready within 1 s"),
    ],
)
async def test_stuck_import_or_setup_is_a_create_fault_not_a_hang(file: str, says: str) -> None:
    async with LocalRuntime(start_timeout_s=1.0) as rt:
        with pytest.raises(PluginCallError, match=says) as info:
            await rt.deploy(entry(file, "score"))
        assert info.value.cause == Cause.CREATE_FAULT.value
