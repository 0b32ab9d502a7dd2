"""The `resource_pools` setting's kind: a list of {name, description, scheduler,
user_slot_quota, preemption, workspaces} mappings.

In the YAML file it is a list; in ASSAY_RESOURCE_POOLS or --resource-pools the same list
as YAML (or JSON) text, e.g. `[{name: default}, {name: gpu, scheduler: fair_share}]`.

`workspaces` binds a pool to the workspaces it serves (Determined's workspace-pool
bindings): a pool with bindings, from here or made by an administrator at run time
(`assay resource-pool bind`), takes experiments of those workspaces only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml

from assay.common.settings import Kind, SettingsError
from assay.master.scheduler import POOL_SCHEDULERS, PoolSpec

# A workspace's name, as the store takes it (store/_workspaces.py); not imported from
# there, which would load the database layer with the settings.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9 _.-]{0,127}")
_KEYS = ("name", "description", "scheduler", "user_slot_quota", "preemption", "workspaces")


class PoolsError(SettingsError):
    """A pool entry that is not what the setting takes: the message says which and why
    (not a ValueError, which the settings loader words as a plain wrong kind)."""


@dataclass(frozen=True)
class ResourcePools(Kind):
    @property
    def accepts(self) -> str:
        return (
            "a list of {name, description, scheduler: "
            + "|".join(POOL_SCHEDULERS)
            + ", user_slot_quota, preemption, workspaces: [NAME, ...]} mappings"
        )

    @property
    def metavar(self) -> str:
        return "YAML"

    def parse(self, value: object) -> list[dict[str, Any]]:
        if isinstance(value, str):
            try:
                value = yaml.safe_load(value)
            except yaml.YAMLError:
                raise ValueError from None
        if not isinstance(value, list):
            raise ValueError
        return [_pool(i, item) for i, item in enumerate(value)]


def _pool(i: int, item: object) -> dict[str, Any]:
    """One entry, checked and with its defaults filled in."""
    if not isinstance(item, dict):
        raise PoolsError(f"resource_pools[{i}] must be a mapping with a name, got {item!r}")
    unknown = sorted(str(k) for k in item if k not in _KEYS)
    if unknown:
        raise PoolsError(
            f"resource_pools[{i}] has unknown key {unknown[0]!r}: a pool takes {', '.join(_KEYS)}"
        )
    name = item.get("name")
    if not isinstance(name, str) or not name.strip() or name != name.strip():
        raise PoolsError(f"resource_pools[{i}].name must be a non-empty name, got {name!r}")
    description = item.get("description") or ""
    scheduler = item.get("scheduler") or "priority"
    if not isinstance(description, str):
        raise PoolsError(f"resource_pools[{i}].description must be text, got {description!r}")
    if scheduler not in POOL_SCHEDULERS:
        raise PoolsError(
            f"resource_pools[{i}] ({name}): scheduler must be one of "
            f"{', '.join(POOL_SCHEDULERS)}, got {scheduler!r}"
        )
    quota = item.get("user_slot_quota")
    if quota is not None and (isinstance(quota, bool) or not isinstance(quota, int) or quota < 1):
        raise PoolsError(
            f"resource_pools[{i}] ({name}): user_slot_quota must be an integer of at least 1 "
            f"(the slots one user's trials may hold at once in this pool), got {quota!r}"
        )
    preemption = item.get("preemption")
    if preemption is not None and not isinstance(preemption, bool):
        raise PoolsError(
            f"resource_pools[{i}] ({name}): preemption must be true or false (whether "
            f"waiting trials may stop running ones at a checkpoint), got {preemption!r}"
        )
    PoolSpec(name, description, scheduler, quota, preemption)
    entry: dict[str, Any] = {"name": name, "description": description, "scheduler": scheduler}
    if quota is not None:
        entry["user_slot_quota"] = quota
    if preemption is not None:
        entry["preemption"] = preemption
    workspaces = _workspaces(i, name, item.get("workspaces"))
    if workspaces:
        entry["workspaces"] = workspaces
    return entry


def _workspaces(i: int, pool: str, value: object) -> list[str]:
    """A pool's `workspaces`: workspace names, each once."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(w, str) for w in value):
        raise PoolsError(
            f"resource_pools[{i}] ({pool}): workspaces must be a list of workspace names "
            f"(the workspaces whose experiments may use the pool), got {value!r}"
        )
    for name in value:
        if not _NAME.fullmatch(name) or name != name.strip():
            raise PoolsError(
                f"resource_pools[{i}] ({pool}): workspaces: {name!r} is not a workspace "
                "name (1 to 128 letters, digits, spaces, '_', '.' or '-', starting with a "
                "letter or digit)"
            )
    return list(dict.fromkeys(value))


def pool_workspaces(pools: list[dict[str, Any]]) -> dict[str, tuple[str, ...]]:
    """The workspaces the `resource_pools` setting binds each pool to (bound pools only)."""
    return {p["name"]: tuple(p["workspaces"]) for p in pools if p.get("workspaces")}


def spec_keys(pool: dict[str, Any]) -> dict[str, Any]:
    """A `resource_pools` entry without what is not the scheduler's (its bindings)."""
    return {k: v for k, v in pool.items() if k != "workspaces"}
