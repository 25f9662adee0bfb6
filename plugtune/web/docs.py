"""``/docs``: the OpenAPI schema as a page rendered here (Swagger UI would need a CDN; this is offline)."""

from __future__ import annotations

from typing import Any

METHODS = ("get", "post", "put", "patch", "delete")


def operations(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """Every operation of an OpenAPI schema: method, path, summary, description and parameters."""
    out = []
    for path, item in schema.get("paths", {}).items():
        for method in METHODS:
            op = item.get(method)
            if op is None:
                continue
            out.append(
                {
                    "id": op.get("operationId", f"{method}-{path}"),
                    "method": method.upper(),
                    "path": path,
                    "summary": op.get("summary", ""),
                    "description": op.get("description", ""),
                    "params": [_param(p) for p in op.get("parameters", [])],
                }
            )
    return out


def _param(p: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": p.get("name", ""),
        "where": p.get("in", ""),
        "type": _type(p.get("schema", {})),
        "required": bool(p.get("required")),
        "description": p.get("description", "") or p.get("schema", {}).get("description", ""),
    }


def _type(schema: dict[str, Any]) -> str:
    if "anyOf" in schema:
        return " | ".join(_type(s) for s in schema["anyOf"])
    return str(schema.get("type", "any"))
