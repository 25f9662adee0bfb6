"""A snapshot holds only the plugin folder's own regular files: links out of it are refused at deploy."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from plugtune.errors import Cause, PluginCallError
from plugtune.runtime import LocalRuntime
from tests.runtime.helpers import ctx, sample, trajectory

GRADER = "from plugtune import grader\n\n\n@grader\ndef score(ctx, sample, trajectory):\n    return 1.0\n"


def _plugin(tmp_path: Path) -> Path:
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "grader.py").write_text(GRADER)
    return folder


async def test_symlink_out_of_the_folder_is_refused_naming_link_and_target(tmp_path: Path) -> None:
    folder = _plugin(tmp_path)
    (folder / "x.txt").symlink_to("/etc/passwd")
    async with LocalRuntime(state_dir=tmp_path / "state") as rt:
        with pytest.raises(PluginCallError) as info:
            await rt.deploy(f"{folder / 'grader.py'}:score")
    assert info.value.cause == Cause.CREATE_FAULT.value
    says = f"{folder / 'x.txt'}: is a symlink to /etc/passwd, outside the plugin's folder"
    assert says in info.value.message
    assert not list((tmp_path / "state" / "code").glob("*/x.txt"))


async def test_symlinked_folder_out_of_the_plugin_folder_is_refused(tmp_path: Path) -> None:
    folder = _plugin(tmp_path)
    (folder / "etc").symlink_to("/etc", target_is_directory=True)
    async with LocalRuntime(state_dir=tmp_path / "state") as rt:
        with pytest.raises(PluginCallError) as info:
            await rt.deploy(f"{folder / 'grader.py'}:score")
    assert "is a symlink to /etc, outside the plugin's folder" in info.value.message


async def test_symlink_inside_the_folder_is_copied_as_its_target(tmp_path: Path) -> None:
    folder = _plugin(tmp_path)
    (folder / "data").mkdir()
    (folder / "data" / "answers.txt").write_text("42\n")
    (folder / "answers.txt").symlink_to("data/answers.txt")
    (folder / "loop").symlink_to(".", target_is_directory=True)  # a cycle is walked once
    os.mkfifo(folder / "pipe")  # not a regular file: left out
    async with LocalRuntime(state_dir=tmp_path / "state") as rt:
        fn = await rt.deploy(f"{folder / 'grader.py'}:score")
        assert (await fn.invoke(ctx(), sample(), trajectory())).value == 1.0
        code = fn.code()
    assert code["answers.txt"] == code["data/answers.txt"] == b"42\n"
    assert "pipe" not in code and not any(name.startswith("loop/") for name in code)
    assert not (fn.snapshot.root / "answers.txt").is_symlink()
