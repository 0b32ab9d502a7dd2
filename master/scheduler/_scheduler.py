"""The `Scheduler`: agents and their slot allocations, and the greedy placement of requests."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from assay.master.scheduler import _snapshot
from assay.master.scheduler._index import FreeIndex
from assay.master.scheduler._placement import choose_agents, largest_placement
from assay.master.scheduler._types import (
    SLOT_TYPES,
    Agent,
    Assignment,
    Decision,
    Placement,
    Request,
    SlotType,
)


class Scheduler:
    """Which request holds which slot of which agent; decides where pending requests go.

    Pure: no I/O, clocks, threads or randomness. The caller owns the pending queue and
    the durable record; this object holds only agents and allocations, which `to_json`
    snapshots and `from_json` restores exactly.

    `schedule` is plain greedy backfill in (priority, order) order: a request that does
    not fit is skipped and later, lower-priority requests may still take the free slots.
    A large request can therefore starve behind a stream of small ones; preemption will
    address that later.
    """

    def __init__(self) -> None:
        self._agents: dict[str, Agent] = {}
        self._owners: dict[str, dict[int, str]] = {}  # agent id -> slot -> request id
        self._allocations: dict[str, Placement] = {}
        self._index = {kind: FreeIndex() for kind in SLOT_TYPES}  # enabled agents only
        # The same, per agent label, for requests that name one (`Request.label`).
        self._labelled: dict[tuple[SlotType, str], FreeIndex] = {}

    # -- agents --------------------------------------------------------------------------

    @property
    def agents(self) -> tuple[Agent, ...]:
        return tuple(self._agents.values())

    @property
    def has_agents(self) -> bool:
        """Whether any agent is known (`agents` copies them all: not for every round)."""
        return bool(self._agents)

    def add_agent(self, agent: Agent) -> None:
        if agent.id in self._agents:
            raise ValueError(f"duplicate agent id {agent.id!r}: remove the old agent first")
        self._agents[agent.id] = agent
        self._owners[agent.id] = {}
        if agent.enabled:
            for index in self._indexes(agent):
                index.add(agent.id, agent.slots, agent.slots)

    def remove_agent(self, agent_id: str, *, keep_other_parts: bool = False) -> list[str]:
        """Forget an agent; returns the ids of requests that held slots on it, sorted.

        Those requests lose their slots on every agent, so the caller can requeue them --
        or, with `keep_other_parts`, only on this one: their other agents' slots stay held
        until the caller releases them (when those processes are known to be gone).
        """
        evicted = self._holders(agent_id)
        for request_id in evicted:
            placement = self._allocations[request_id]
            self.release(request_id)
            rest = tuple(part for part in placement if part[0] != agent_id)
            if keep_other_parts and rest:
                self._hold(request_id, rest)
        agent = self._agents.pop(agent_id)
        del self._owners[agent_id]
        if agent.enabled:
            for index in self._indexes(agent):
                index.remove(agent_id)
        return evicted

    def set_agent_enabled(self, agent_id: str, enabled: bool, *, drain: bool = True) -> list[str]:
        """Enable or disable placement on an agent; returns the ids of evicted requests.

        Disabling with `drain=True` (the default) lets running allocations finish and
        returns []; with `drain=False` their slots are freed everywhere, as for
        `remove_agent`, and their ids are returned for the caller to requeue.
        """
        evicted = [] if enabled or drain else self._holders(agent_id)
        old = self._agent(agent_id)
        self._agents[agent_id] = dataclasses.replace(old, enabled=enabled)
        for index in self._indexes(old):
            if old.enabled and not enabled:
                index.remove(agent_id)
            elif enabled and not old.enabled:
                index.add(agent_id, old.slots, old.slots - len(self._owners[agent_id]))
        for request_id in evicted:
            self.release(request_id)
        return evicted

    def free_slots(self, agent_id: str) -> tuple[int, ...]:
        """The agent's unallocated slot indices, ascending (also when it is disabled)."""
        agent, owners = self._agent(agent_id), self._owners[agent_id]
        return tuple(s for s in range(agent.slots) if s not in owners)

    # -- allocations ---------------------------------------------------------------------

    @property
    def allocations(self) -> dict[str, Placement]:
        return dict(self._allocations)

    def allocation_of(self, request_id: str) -> Placement | None:
        return self._allocations.get(request_id)

    def adopt(self, request_id: str, agent_id: str, slots: Sequence[int]) -> None:
        """Record that `request_id` already holds `slots` of `agent_id`.

        For allocations found running when their agent reconnects to a restarted master:
        a gang's parts arrive one agent at a time, each merged into the same allocation.
        """
        held = self._allocations.get(request_id, ())
        if any(a == agent_id for a, _ in held):
            return  # this part is held already
        self.release(request_id)
        merged = tuple(sorted((*held, (agent_id, tuple(slots)))))
        self._hold(request_id, merged)

    def release(self, request_id: str) -> bool:
        """Free a request's slots; False if it held none (so a retried release is harmless)."""
        placement = self._allocations.pop(request_id, None)
        if placement is None:
            return False
        for agent_id, slots in placement:
            owners = self._owners[agent_id]
            for slot in slots:
                del owners[slot]
            for index in self._indexes(self._agents[agent_id]):
                index.change(agent_id, len(slots))
        return True

    def schedule(self, pending: Sequence[Request]) -> Decision:
        """Place what fits of `pending`, record it as allocated, and return the decision.

        Requests are considered by (priority, order, id). Each goes to one agent if any
        has room (best fit), else is split equally over the fewest agents that allow it
        (see `choose_agents`). Requests that could not run even on an idle cluster are
        listed in `unschedulable` with the reason (too large, or not splittable equally
        over the enabled agents); they stay the caller's to keep, since agents may join.
        """
        self._check_pending(pending)
        decision = Decision()
        why_never: dict[tuple[int, SlotType, str], str | None] = {}  # one per size a pass
        # Both shortcuts are exact: whether a size fits an idle cluster depends on the size
        # alone, and no placement can use more slots than are free. With a long queue on a
        # full cluster they turn each round from a search per request into a lookup.
        for request in sorted(pending, key=lambda r: r.rank):
            index = self._index_for(request.slot_type, request.label)
            if not index.fits_idle(request.slots):
                size = (request.slots, request.slot_type, request.label)
                if size not in why_never:
                    why_never[size] = self.why_never(*size)
                decision.unschedulable.append((request.id, why_never[size] or "cannot be placed"))
                continue
            if request.slots > index.total_free:
                continue
            chosen = index.choose(request.slots)
            if chosen is None:
                continue
            placement = tuple((agent_id, self._lowest_free(agent_id, n)) for agent_id, n in chosen)
            self._hold(request.id, placement)
            decision.assignments.append(Assignment(request.id, placement))
        return decision

    def why_never(self, slots: int, slot_type: SlotType, label: str = "") -> str | None:
        """Why a request of `slots` slots (on agents with `label`, if one is given) could
        not be placed even if every agent were idle, or None if it could (it only waits
        for slots to free up)."""
        if self._index_for(slot_type, label).fits_idle(slots):
            return None
        agents = [
            a
            for a in self._agents.values()
            if a.slot_type == slot_type and (not label or a.label == label)
        ]
        capacities = [a.slots for a in agents if a.enabled]
        return _why(slots, slot_type, capacities, len(agents) - len(capacities), label)

    # -- snapshots -----------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The whole state as JSON-native values; `from_json` restores it exactly."""
        return _snapshot.dump(self._agents, self._allocations)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Scheduler:
        agents, allocations = _snapshot.load(data)
        scheduler = cls()
        for agent in agents:
            scheduler.add_agent(agent)
        for request_id, placement in allocations:
            scheduler._hold(request_id, placement)
        return scheduler

    # -- internals -----------------------------------------------------------------------

    def _indexes(self, agent: Agent) -> list[FreeIndex]:
        """The free indexes an enabled agent belongs to: its slot type's, and its label's."""
        if not agent.label:
            return [self._index[agent.slot_type]]
        key = (agent.slot_type, agent.label)
        return [self._index[agent.slot_type], self._labelled.setdefault(key, FreeIndex())]

    def _index_for(self, slot_type: SlotType, label: str) -> FreeIndex:
        """The agents a request of this type and label may use (an empty index: none)."""
        if not label:
            return self._index[slot_type]
        return self._labelled.get((slot_type, label)) or _NONE

    def _agent(self, agent_id: str) -> Agent:
        agent = self._agents.get(agent_id)
        if agent is None:
            raise ValueError(f"unknown agent {agent_id!r}")
        return agent

    def _holders(self, agent_id: str) -> list[str]:
        self._agent(agent_id)
        return sorted(set(self._owners[agent_id].values()))

    def _lowest_free(self, agent_id: str, count: int) -> tuple[int, ...]:
        owners = self._owners[agent_id]
        candidates = (s for s in range(self._agents[agent_id].slots) if s not in owners)
        return tuple(itertools.islice(candidates, count))

    def _hold(self, request_id: str, placement: Placement) -> None:
        """Record an allocation, refusing one that would double-book or name no slot."""
        if request_id in self._allocations:
            raise ValueError(f"request {request_id!r} already holds an allocation")
        for agent_id, slots in placement:
            agent, owners = self._agent(agent_id), self._owners[agent_id]
            for slot in slots:
                if not 0 <= slot < agent.slots:
                    raise ValueError(
                        f"slot {slot} of agent {agent_id!r} is outside 0..{agent.slots - 1}"
                    )
                if slot in owners:
                    raise ValueError(
                        f"slot {slot} of agent {agent_id!r} is already held by {owners[slot]!r}"
                    )
        if len({a for a, _ in placement}) != len(placement) or any(
            len(set(slots)) != len(slots) for _, slots in placement
        ):
            raise ValueError(f"allocation {request_id!r} names an agent or slot twice")
        for agent_id, slots in placement:
            self._owners[agent_id].update(dict.fromkeys(slots, request_id))
            for index in self._indexes(self._agents[agent_id]):
                index.change(agent_id, -len(slots))
        self._allocations[request_id] = placement

    def _check_pending(self, pending: Sequence[Request]) -> None:
        seen: set[str] = set()
        for request in pending:
            if request.id in seen:
                raise ValueError(f"request {request.id!r} is pending twice")
            if request.id in self._allocations:
                raise ValueError(
                    f"request {request.id!r} is pending but already holds an allocation; "
                    "release it first"
                )
            seen.add(request.id)


_KIND_NAMES = {"cpu": "CPU", "cuda": "GPU"}
_NONE = FreeIndex()  # never written: what a label no agent carries offers


def _why(
    slots: int, slot_type: str, capacities: Sequence[int], disabled: int, label: str = ""
) -> str:
    """Why `slots` slots of `slot_type` cannot be placed even on an idle cluster, with the
    numbers: what is asked, what the enabled agents have, and what the largest placement is."""
    kind = _KIND_NAMES.get(slot_type, slot_type)
    need = f"needs {slots} {kind} slot{'s' if slots != 1 else ''}"
    who = f"{kind} agent with label {label!r}" if label else f"{kind} agent"
    if not capacities:
        if disabled:
            return f"{need}; every {who} is disabled ({disabled})"
        return f"{need}; no {who} is connected"
    total = sum(capacities)
    agents = f"{len(capacities)} agent{'s' if len(capacities) != 1 else ''}"
    has = f"the agents with label {label!r} have" if label else "the cluster has"
    has = f"{has} {total} ({agents}"
    has += f", {disabled} more disabled)" if disabled else ")"
    if slots > total:
        return f"{need}; {has}"
    # Fewer slots that would fit, the nearest first (a trial's agents give equal shares).
    pairs = [(str(i), c) for i, c in enumerate(capacities)]
    below = next(
        n
        for n in range(min(slots, largest_placement(capacities)), 0, -1)
        if choose_agents(n, pairs) is not None
    )
    return (
        f"{need}; {has}, but a trial's slots are split equally over its agents, which "
        f"{slots} cannot be here ({below} could)"
    )
