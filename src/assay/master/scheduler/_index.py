"""`FreeIndex`: enabled agents grouped by free slot count, kept up to date as slots move.

`choose_agents` sorts every agent on every call; with a thousand agents and a request
arriving every few milliseconds that sort is most of a scheduling round. The index
holds the same order -- (free count, agent id) -- incrementally, so a placement looks
only at the agents it could use. `choose` returns exactly what `choose_agents` returns
for the same free counts (tests/scheduler checks them against each other).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from assay.master.scheduler._placement import choose_agents, largest_placement


class FreeIndex:
    """Enabled agents of one slot type by free count; ids sorted within each count."""

    def __init__(self) -> None:
        self._levels: dict[int, list[str]] = {}  # free count (> 0) -> agent ids, sorted
        self._free: dict[str, int] = {}  # agent id -> free count
        self._capacity: dict[str, int] = {}  # agent id -> slots
        self.total_free = 0
        self.total_capacity = 0
        self._largest: int | None = None  # cached: these depend on capacities only
        self._possible: dict[int, bool] = {}

    def __len__(self) -> int:
        return len(self._free)

    def add(self, agent_id: str, capacity: int, free: int) -> None:
        self._free[agent_id] = free
        self._capacity[agent_id] = capacity
        self.total_free += free
        self.total_capacity += capacity
        self._forget_capacities()
        self._insert(agent_id, free)

    def remove(self, agent_id: str) -> None:
        free = self._free.pop(agent_id)
        self.total_capacity -= self._capacity.pop(agent_id)
        self.total_free -= free
        self._forget_capacities()
        self._delete(agent_id, free)

    def change(self, agent_id: str, delta: int) -> None:
        """The agent's free count changed by `delta` (a hold or a release)."""
        old = self._free.get(agent_id)
        if old is None:
            return  # disabled agents are not indexed
        self._delete(agent_id, old)
        self._free[agent_id] = old + delta
        self.total_free += delta
        self._insert(agent_id, old + delta)

    def largest(self) -> int:
        """The most slots one request could get on an idle cluster of these agents."""
        if self._largest is None:
            self._largest = largest_placement(self._capacity.values())
        return self._largest

    def fits_idle(self, slots: int) -> bool:
        """Whether `slots` could be placed if every agent were idle (cached per size)."""
        found = self._possible.get(slots)
        if found is None:
            found = self._possible[slots] = slots <= self.largest() and (
                choose_agents(slots, self._capacity.items()) is not None
            )
        return found

    def choose(self, slots: int) -> list[tuple[str, int]] | None:
        """What `choose_agents(slots, ...)` picks from the current free counts."""
        for k in range(1, min(slots, len(self._free)) + 1):
            if slots % k:
                continue
            share = slots // k
            fitting: list[str] = []
            for agent_id in self._ordered_from(share):
                fitting.append(agent_id)
                if len(fitting) == k:
                    return sorted((agent, share) for agent in fitting)
        return None

    def fits_idle_without(self, slots: int, avoid: frozenset[str]) -> bool:
        """Whether `slots` could be placed on the agents but `avoid` if all were idle."""
        capacities = [(a, c) for a, c in self._capacity.items() if a not in avoid]
        return choose_agents(slots, capacities) is not None

    def choose_without(self, slots: int, avoid: frozenset[str]) -> list[tuple[str, int]] | None:
        """What `choose` picks from the agents but `avoid` (a scan of every agent: only
        trials that log_policies steer away from agents ask for it)."""
        return choose_agents(slots, [(a, f) for a, f in self._free.items() if a not in avoid])

    def _forget_capacities(self) -> None:
        self._largest = None
        self._possible.clear()

    def _ordered_from(self, least: int) -> Iterator[str]:
        """Agents with at least `least` free slots, fullest first, then by id."""
        for level in sorted(level for level in self._levels if level >= least):
            yield from self._levels[level]

    def _insert(self, agent_id: str, free: int) -> None:
        if free > 0:
            bisect.insort(self._levels.setdefault(free, []), agent_id)

    def _delete(self, agent_id: str, free: int) -> None:
        if free <= 0:
            return
        ids = self._levels[free]
        del ids[bisect.bisect_left(ids, agent_id)]
        if not ids:
            del self._levels[free]
