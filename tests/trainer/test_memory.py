from __future__ import annotations

import functools
import json
import subprocess
import sys

import pytest

# Runs in a child: both settings act on the whole process. Steps of a small network, with batch
# sizes that vary as a GRPO step's do, each allocating and freeing the same tensors again.
# "fixed" holds glibc's starting thresholds (128 KiB): left alone, glibc raises them as mapped
# blocks are freed, in an order that varies between runs (900 to 10,000 faults here), so the
# unsettled default is no stable baseline to compare with.
CHILD = """
import ctypes, json, resource, sys
import torch
from plugtune.trainer import memory
if sys.argv[1] == "keep":
    active = memory.keep_freed_memory()
else:
    active = ""
    if sys.argv[1] == "fixed":
        mallopt = ctypes.CDLL("libc.so.6").mallopt
        assert mallopt(memory._M_MMAP_THRESHOLD, 128 << 10) == 1
        assert mallopt(memory._M_TRIM_THRESHOLD, 128 << 10) == 1
torch.set_num_threads(1)
net = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.SiLU(), torch.nn.Linear(1024, 256))
def steps(n):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for i in range(n):
        x = torch.randn(200 + 37 * (i % 5), 256)
        net(x).square().mean().backward()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
steps(10)
faults = steps(40)
print(json.dumps({"faults": faults, "active": active, "frozen": memory.freeze_startup_objects()}))
"""


@functools.cache
def _run(mode: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))  # (cached: each child costs a torch import)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_training_steps_reuse_freed_memory_instead_of_faulting_it_in_again() -> None:
    fixed, kept = _run("fixed"), _run("keep")
    assert fixed["active"] == "" and "kept for reuse" in str(kept["active"])
    assert int(str(fixed["faults"])) > 20_000  # each step maps its larger tensors afresh (~84,000)
    assert int(str(kept["faults"])) < int(str(fixed["faults"])) / 20  # 66 to 543 in 16 runs


def test_start_up_objects_are_frozen_out_of_collections() -> None:
    assert int(str(_run("default")["frozen"])) > 10_000  # torch alone leaves more alive


def test_settling_a_process_for_training_says_what_is_in_effect() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "from plugtune.trainer import memory; print(memory.settle_for_training())"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "start-up objects frozen" in out.stdout
    if sys.platform.startswith("linux"):
        assert "kept for reuse" in out.stdout
