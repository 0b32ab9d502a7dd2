"""The scheduler's state as JSON-native values (dicts, lists, str, int, bool) and back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from assay.master.scheduler._types import Agent, Placement

VERSION = 1


def dump(
    agents: Mapping[str, Agent],
    allocations: Mapping[str, Placement],
    groups: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Agents and allocations (with their group, if any) in insertion order; only lists,
    so a JSON round trip is exact."""
    groups = groups or {}
    return {
        "version": VERSION,
        "agents": [
            {"id": a.id, "slots": a.slots, "slot_type": a.slot_type, "enabled": a.enabled}
            | ({"label": a.label} if a.label else {})
            | ({"islands": list(a.islands)} if any(a.islands) else {})
            for a in agents.values()
        ],
        "allocations": [
            {
                "request_id": request_id,
                "placement": [[agent_id, list(slots)] for agent_id, slots in placement],
            }
            | ({"group": groups[request_id]} if groups.get(request_id) else {})
            for request_id, placement in allocations.items()
        ],
    }


def load(data: Mapping[str, Any]) -> tuple[list[Agent], list[tuple[str, Placement, str]]]:
    """Parse what `dump` wrote; ValueError says which part is malformed.

    Slot bookkeeping (known agents, indices in range, no slot held twice) is checked by
    the scheduler as it re-applies the allocations.
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"scheduler snapshot must be a JSON object, got {type(data).__name__}")
    if data.get("version") != VERSION:
        raise ValueError(
            f"scheduler snapshot version must be {VERSION}, got {data.get('version')!r}"
        )
    agents = [_agent(item) for item in _list(data, "agents")]
    allocations = [_allocation(item) for item in _list(data, "allocations")]
    return agents, allocations


def _agent(item: object) -> Agent:
    fields = dict(
        _fields(item, "agent", {"id", "slots", "slot_type", "enabled"}, {"label", "islands"})
    )
    islands = fields.get("islands", [])
    if not isinstance(islands, list):
        raise ValueError(f"scheduler snapshot agent islands must be a list, got {islands!r}")
    fields["islands"] = tuple(islands)
    return Agent(**fields)


def _list(data: Mapping[str, Any], key: str) -> list[Any]:
    value = data.get(key)
    if not isinstance(value, list):
        raise ValueError(f"scheduler snapshot {key!r} must be a list, got {value!r}")
    return value


def _fields(
    item: object, kind: str, keys: set[str], optional: frozenset[str] | set[str] = frozenset()
) -> dict[str, Any]:
    if not isinstance(item, dict) or not keys <= set(item) <= keys | optional:
        also = f" (and optionally {sorted(optional)})" if optional else ""
        raise ValueError(
            f"scheduler snapshot {kind} must have exactly {sorted(keys)}{also}: {item!r}"
        )
    return item


def _allocation(item: object) -> tuple[str, Placement, str]:
    fields = _fields(item, "allocation", {"request_id", "placement"}, {"group"})
    group = fields.get("group", "")
    if not isinstance(group, str):
        raise ValueError(f"allocation group must be a string, got {group!r}")
    request_id = fields["request_id"]
    if not isinstance(request_id, str) or not request_id:
        raise ValueError(f"allocation request_id must be a non-empty string, got {request_id!r}")
    placement: list[tuple[str, tuple[int, ...]]] = []
    for part in fields["placement"] if isinstance(fields["placement"], list) else [None]:
        if (
            not isinstance(part, list)
            or len(part) != 2
            or not isinstance(part[0], str)
            or not isinstance(part[1], list)
            or not part[1]
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in part[1])
        ):
            raise ValueError(
                f"allocation {request_id!r} placement parts must be [agent_id, [slot, ...]], "
                f"got {part!r}"
            )
        placement.append((part[0], tuple(part[1])))
    if not placement:
        raise ValueError(f"allocation {request_id!r} has an empty placement")
    return request_id, tuple(placement), group
