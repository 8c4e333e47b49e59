"""Comparison of recomputed scenario outputs with their committed expectations (pure functions)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

MISSING = "<missing>"


class Change(BaseModel):
    path: str
    old: str
    new: str


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted paths to leaf values: {"a": {"b": [1]}} → {"a.b.0": 1}."""
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = ((str(i), v) for i, v in enumerate(value))
    else:
        return {prefix: value}
    out: dict[str, Any] = {}
    for key, child in items:
        out.update(flatten(child, f"{prefix}.{key}" if prefix else str(key)))
    if not out and prefix:
        out[prefix] = value  # an empty list or dict is a value of its own
    return out


def diff(expected: Any, actual: Any) -> list[Change]:
    """Every leaf that differs, was added or was removed, in path order."""
    old, new = flatten(expected), flatten(actual)
    changes = []
    for path in sorted(old.keys() | new.keys()):
        before, after = old.get(path, MISSING), new.get(path, MISSING)
        if before != after or type(before) is not type(after):
            changes.append(Change(path=path, old=_show(before), new=_show(after)))
    return changes


def _show(value: Any) -> str:
    return value if value == MISSING else repr(value)
