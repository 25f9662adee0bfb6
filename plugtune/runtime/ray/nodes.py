"""What a Ray node needs to run plugtune's instances, checked on each node before a deploy.

A node needs the driver's Python (major.minor) and Ray version; with Ray installed, its own
dependencies cover what plugtune's node side imports. plugtune itself ships with every actor
(``code.ship_plugtune``); with shipping off, the node must have the driver's plugtune version
installed. The check runs a small task on every live node (each node once per backend); a node
that lacks a piece is a ``DeployFailed``, so a Create faas fault naming the node and the piece,
instead of an actor that dies on the node with an import error.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import sys
from typing import Any

import plugtune
from plugtune.runtime.backend import DeployFailed
from plugtune.runtime.ray import probe
from plugtune.runtime.ray.cluster import first_line
from plugtune.runtime.ray.facts import is_ray_error, setup_reason

#: What an instance's actor and its worker process import on the node.
NODE_MODULES = ["plugtune.runtime.ray.host", "plugtune.runtime.worker.zygote"]
NEEDS = (
    "every Ray node needs the driver's Python ({python}) and Ray (ray[default]=={ray}); "
    "plugtune itself is shipped to the nodes unless ship_plugtune is off"
)


class NodeCheck:
    """Runs ``probe`` once on each live node; ``check()`` raises DeployFailed for any that fails."""

    def __init__(self, ray: Any, runtime_env: dict[str, Any], shipped: bool, timeout_s: float) -> None:
        self.ray = ray
        self.runtime_env = runtime_env  # plugtune's py_modules (when shipped) and the user's env_vars
        self.shipped = shipped
        self.timeout_s = timeout_s
        self.passed: set[str] = set()  # node ids
        ray.cloudpickle.register_pickle_by_value(probe)  # it must run where plugtune is missing
        self.remote = ray.remote(max_calls=1)(probe.probe)

    async def check(self) -> None:
        nodes = await asyncio.to_thread(self.ray.nodes)
        todo = [n for n in nodes if n.get("Alive") and n["NodeID"] not in self.passed]
        problems = await asyncio.gather(*(self._check_node(n) for n in todo))
        failed = [p for p in problems if p]
        if failed:
            needs = NEEDS.format(python=driver_python(), ray=self.ray.__version__)
            raise DeployFailed(f"{'; '.join(failed)} ({needs})")

    async def _check_node(self, node: dict[str, Any]) -> str:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node_id = str(node["NodeID"])
        where = f"Ray node {node.get('NodeManagerAddress', '?')} ({node_id[:12]})"
        options = {
            "num_cpus": 0,
            "max_retries": 0,
            "runtime_env": self.runtime_env,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False),
        }
        try:
            ref = self.remote.options(**options).remote(NODE_MODULES)
            found = await asyncio.wait_for(ref, self.timeout_s)
        except asyncio.TimeoutError:
            return f"{where} did not run plugtune's node check within {self.timeout_s:g} s"
        except Exception as exc:
            if not is_ray_error(exc):
                raise
            import ray.exceptions as rex

            if isinstance(exc, rex.RuntimeEnvSetupError):
                return f"{where} could not set up plugtune's py_modules: {setup_reason(exc)}"
            return f"{where} failed plugtune's node check: {type(exc).__name__}: {first_line(exc)}"
        problems = lacks(where, found, shipped=self.shipped, ray_version=self.ray.__version__)
        if not problems:
            self.passed.add(node_id)
        return "; ".join(problems)


def lacks(where: str, found: dict[str, Any], *, shipped: bool, ray_version: str) -> list[str]:
    """What a node lacks by ``found`` (``probe``'s answer there), each naming the node and the piece."""
    python = driver_python()
    if found["python"].rsplit(".", 1)[0] != python:
        return [f"{where} runs Python {found['python']}, the driver Python {python}"]
    if found["ray"] != ray_version:
        return [f"{where} has Ray {found['ray']}, the driver Ray {ray_version}"]
    problems = []
    for module, missing, error in found["missing"]:
        if missing.split(".")[0] == "plugtune" and not shipped:
            problems.append(
                f"{where} lacks plugtune ({error}): install plugtune=={plugtune.__version__} there, "
                "or let plugtune ship itself (ship_plugtune on)"
            )
        elif missing:
            problems.append(f"{where} lacks the Python module '{missing}' ({install_hint(missing)})")
        else:
            problems.append(f"{where} cannot import {module}: {error}")
    if not problems and not shipped and found["plugtune_version"] != plugtune.__version__:
        problems.append(
            f"{where} has plugtune {found['plugtune_version'] or '?'} ({found['plugtune']}), "
            f"the driver plugtune {plugtune.__version__}"
        )
    return problems


def driver_python() -> str:
    return "{}.{}".format(*sys.version_info[:2])


def install_hint(module: str) -> str:
    """``pip install DIST==VERSION`` as installed on the driver (the module's top-level name else)."""
    top = module.split(".")[0]
    dists = importlib.metadata.packages_distributions().get(top) or [top]
    try:
        return f"pip install {dists[0]}=={importlib.metadata.version(dists[0])}, as on the driver"
    except importlib.metadata.PackageNotFoundError:
        return f"pip install {dists[0]}"
