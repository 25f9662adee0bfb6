"""What one Ray node has of what plugtune's instances need there: run on the node as a Ray task.

Stdlib only, and sent to the node by value (see ``nodes``): it must run where plugtune, or one of
its dependencies, cannot be imported, to say so.
"""

from __future__ import annotations

from typing import Any


def probe(modules: list[str]) -> dict[str, Any]:
    """This node's Python and Ray versions, where it imports plugtune from and its version, and
    each of ``modules`` that fails to import: ``[module, missing module name, error]``."""
    import importlib
    import os
    import sys

    found: dict[str, Any] = {"python": "{}.{}.{}".format(*sys.version_info[:3]), "missing": []}
    try:
        import ray

        found["ray"] = str(ray.__version__)
        found["ip"] = ray.util.get_node_ip_address()
    except Exception as exc:  # noqa: BLE001 - reported to the driver, which names the node
        found["ray"] = f"unusable: {type(exc).__name__}: {exc}"[:300]
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            found["missing"].append([name, exc.name or name, f"{type(exc).__name__}: {exc}"[:300]])
        except Exception as exc:  # noqa: BLE001 - a module that raises on import is as unusable
            found["missing"].append([name, "", f"{type(exc).__name__}: {exc}"[:300]])
    package = sys.modules.get("plugtune")
    found["plugtune"] = os.path.dirname(package.__file__ or "") if package is not None else ""
    found["plugtune_version"] = getattr(package, "__version__", "") if package is not None else ""
    return found
