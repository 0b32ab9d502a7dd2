"""Laying one partial config over another: what `--config`, `--template`, `experiment fork`
(in the CLI) and `experiment continue` (in the master) share."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `top` laid over it: mappings merge key by key, anything else in `top`
    (lists included) replaces what `base` has."""
    merged = dict(base)
    for key, value in top.items():
        below = merged.get(key)
        if isinstance(value, Mapping) and isinstance(below, Mapping):
            merged[key] = merge(below, value)
        else:
            merged[key] = value
    return merged


__all__ = ["merge"]
