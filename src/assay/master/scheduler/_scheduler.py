"""The `Scheduler`: agents and their slot allocations, and the greedy placement of requests."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from assay.master.scheduler import _fair_share, _snapshot
from assay.master.scheduler._index import FreeIndex
from assay.master.scheduler._placement import choose_agents, choose_slots, largest_placement
from assay.master.scheduler._types import (
    POLICIES,
    SLOT_TYPES,
    Agent,
    Assignment,
    Decision,
    Limits,
    Placement,
    Policy,
    Request,
    Share,
    SlotType,
    Wait,
)

_NO_LIMITS = Limits()


class Scheduler:
    """Which request holds which slot of which agent; decides where pending requests go.

    Pure: no I/O, clocks, threads or randomness. The caller owns the pending queue and
    the durable record; this object holds only agents and allocations, which `to_json`
    snapshots and `from_json` restores exactly.

    `schedule` is greedy backfill in the policy's order -- (priority, order) for
    "priority", furthest below its weighted share first for "fair_share" (see
    `_fair_share`): a request that does not fit is skipped and later ones may still take
    the free slots. A large request can therefore starve behind a stream of small ones;
    preemption (`choose_victims`, `choose_share_victims`) is the caller's remedy.
    """

    def __init__(self, pool: str | None = None) -> None:
        """`pool`: the resource pool's name, for messages (None: the cluster's only one)."""
        self._pool = pool
        self._agents: dict[str, Agent] = {}
        self._owners: dict[str, dict[int, str]] = {}  # agent id -> slot -> request id
        self._allocations: dict[str, Placement] = {}
        self._group_of: dict[str, str] = {}  # request id -> group, for allocations
        self._held: dict[str, int] = {}  # group -> slots its allocations hold
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
            group = self._group_of.get(request_id, "")
            self.release(request_id)
            rest = tuple(part for part in placement if part[0] != agent_id)
            if keep_other_parts and rest:
                self._hold(request_id, rest, group)
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

    def adopt(self, request_id: str, agent_id: str, slots: Sequence[int], group: str = "") -> None:
        """Record that `request_id` (of `group`) already holds `slots` of `agent_id`.

        For allocations found running when their agent reconnects to a restarted master:
        a gang's parts arrive one agent at a time, each merged into the same allocation.
        """
        held = self._allocations.get(request_id, ())
        if any(a == agent_id for a, _ in held):
            return  # this part is held already
        group = self._group_of.get(request_id, group)
        self.release(request_id)
        merged = tuple(sorted((*held, (agent_id, tuple(slots)))))
        self._hold(request_id, merged, group)

    def release(self, request_id: str) -> bool:
        """Free a request's slots; False if it held none (so a retried release is harmless)."""
        placement = self._allocations.pop(request_id, None)
        if placement is None:
            return False
        group = self._group_of.pop(request_id)
        left = self._held[group] - sum(len(slots) for _, slots in placement)
        if left:
            self._held[group] = left
        else:
            del self._held[group]
        for agent_id, slots in placement:
            owners = self._owners[agent_id]
            for slot in slots:
                del owners[slot]
            for index in self._indexes(self._agents[agent_id]):
                index.change(agent_id, len(slots))
        return True

    def schedule(
        self,
        pending: Sequence[Request],
        *,
        policy: Policy = "priority",
        limits: Limits | None = None,
    ) -> Decision:
        """Place what fits of `pending`, record it as allocated, and return the decision.

        `policy` "priority" considers requests by (priority, order, id); "fair_share" by
        the rule in `_fair_share` (the group furthest below its weighted share first).
        Under both, a request whose group would pass its `max_slots`, or whose user would
        pass `limits.user_slot_quota`, waits. Each request goes to one agent if any has
        room (best fit), else is split equally over the fewest agents that allow it (see
        `choose_agents`). Requests that could not run even on an idle cluster are listed
        in `unschedulable` with the reason (too large, or not splittable equally over the
        enabled agents); they stay the caller's to keep, since agents may join. Every
        request left pending gets a `Wait` in `waiting`, in the order considered.
        """
        self._check_pending(pending)
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        limits = limits if limits is not None else _NO_LIMITS
        held = dict(self._held)  # this round's running count per group
        decision = Decision()
        # Shares matter only when the pending requests want more than is free: otherwise
        # (most rounds of a cluster with room) the round costs nothing per idle group.
        wanted = sum(r.slots for r in pending)
        free = sum(self._index[kind].total_free for kind in {r.slot_type for r in pending})
        if policy == "fair_share" and wanted > free:
            order = self._fair_order(pending, limits, held, decision.shares)
        else:
            order = iter(sorted(pending, key=lambda r: r.rank))
        users = _users_held(held, limits) if limits.user_slot_quota is not None else {}
        free_at_start = {(kind, ""): self._index[kind].total_free for kind in SLOT_TYPES}
        free_at_start.update((key, index.total_free) for key, index in self._labelled.items())
        why_never: dict[tuple[int, SlotType, str], str | None] = {}  # one per size a pass
        room_waits: dict[tuple[int, SlotType, str, int, bool], Wait] = {}
        placed = decision.assignments
        # Both shortcuts are exact: whether a size fits an idle cluster depends on the size
        # alone, and no placement can use more slots than are free. With a long queue on a
        # full cluster they turn each round from a search per request into a lookup.
        for request in order:
            index = self._index_for(request.slot_type, request.label)
            if request.avoid:
                chosen = self._avoiding(request, index, limits, held, users, decision)
                if chosen is None:
                    continue
            elif not index.fits_idle(request.slots):
                size = (request.slots, request.slot_type, request.label)
                if size not in why_never:
                    why_never[size] = self.why_never(*size)
                why = why_never[size] or "cannot be placed"
                decision.unschedulable.append((request.id, why))
                decision.waiting[request.id] = Wait("too_large", why)
                continue
            elif (wait := _over_limit(request, limits, held, users)) is not None:
                decision.waiting[request.id] = wait
                continue
            else:
                chosen = index.choose(request.slots) if request.slots <= index.total_free else None
            if chosen is None:
                # Outside fair share the reason depends on these alone: one per round.
                key = (request.slots, request.slot_type, request.label, index.total_free)
                wait = None if decision.shares else room_waits.get((*key, bool(placed)))
                if wait is None:
                    wait = _no_room(
                        request,
                        index.total_free,
                        free_at_start.get((request.slot_type, request.label), 0),
                        decision,
                        held,
                    )
                    room_waits[(*key, bool(placed))] = wait
                decision.waiting[request.id] = wait
                continue
            placement = tuple((agent_id, self._pick(agent_id, n)) for agent_id, n in chosen)
            self._hold(request.id, placement, request.group)
            held[request.group] = held.get(request.group, 0) + request.slots
            if limits.user_slot_quota is not None:
                user = limits.group(request.group).user
                users[user] = users.get(user, 0) + request.slots
            decision.assignments.append(Assignment(request.id, placement))
        return decision

    def _avoiding(
        self,
        request: Request,
        index: FreeIndex,
        limits: Limits,
        held: Mapping[str, int],
        users: Mapping[str, int],
        decision: Decision,
    ) -> list[tuple[str, int]] | None:
        """Where a request that avoids agents goes now; when nowhere, its wait (or why it
        never fits the agents it may use) is in `decision`."""
        if not index.fits_idle_without(request.slots, request.avoid):
            why = self.why_never(request.slots, request.slot_type, request.label, request.avoid)
            why = why or "cannot be placed"
            decision.unschedulable.append((request.id, why))
            decision.waiting[request.id] = Wait("too_large", why)
            return None
        wait = _over_limit(request, limits, held, users)
        chosen = None if wait else index.choose_without(request.slots, request.avoid)
        if wait is None and chosen is None:
            avoided = ", ".join(sorted(request.avoid))
            wait = Wait(
                "no_free_slots",
                f"needs {_slots(request.slots, request.slot_type)} on agents other than "
                f"{avoided} (its log_policies exclude them); none are free",
            )
        if wait is not None:
            decision.waiting[request.id] = wait
        return chosen

    def held_by_group(self) -> dict[str, int]:
        """Slots held now by each group with an allocation."""
        return {group: n for group, n in self._held.items() if n}

    def group_of(self, request_id: str) -> str:
        """The group an allocation was made for ("" if adopted without one)."""
        return self._group_of.get(request_id, "")

    def _fair_order(
        self,
        pending: Sequence[Request],
        limits: Limits,
        held: dict[str, int],
        shares: dict[str, Share],
    ) -> Iterator[Request]:
        """Work out the groups' shares (into `shares`) and the fair-share order."""
        wanted: dict[str, int] = dict(held)
        for request in pending:
            wanted[request.group] = wanted.get(request.group, 0) + request.slots
        quota = limits.user_slot_quota
        wants: dict[str, tuple[float, int]] = {}
        for group_id, demand in wanted.items():
            group = limits.group(group_id)
            # A group over its cap (lowered live) wants only the cap: the rest is fair game.
            if group.max_slots is not None:
                demand = min(demand, group.max_slots)
            if quota is not None:
                demand = min(demand, quota)
            wants[group_id] = (group.weight, demand)
        # Each slot type is its own pool; requests of one round share one type in practice.
        kinds = {r.slot_type for r in pending} or {"cpu"}
        capacity = sum(self._index[kind].total_capacity for kind in kinds)
        fair = _fair_share.water_fill(capacity, wants)
        goal = _fair_share.targets(fair, held)
        for group_id, (weight, _) in wants.items():
            shares[group_id] = Share(weight, fair[group_id], goal[group_id], held.get(group_id, 0))
        return _fair_share.fair_order(pending, held, goal, lambda g: wants[g][0])

    def why_never(
        self,
        slots: int,
        slot_type: SlotType,
        label: str = "",
        avoid: frozenset[str] = frozenset(),
    ) -> str | None:
        """Why a request of `slots` slots (on agents with `label`, if one is given, and
        not on those it must `avoid`) could not be placed even if every agent were idle,
        or None if it could (it only waits for slots to free up)."""
        index = self._index_for(slot_type, label)
        if index.fits_idle(slots) if not avoid else index.fits_idle_without(slots, avoid):
            return None
        agents = [
            a
            for a in self._agents.values()
            if a.slot_type == slot_type and (not label or a.label == label) and a.id not in avoid
        ]
        capacities = [a.slots for a in agents if a.enabled]
        disabled = len(agents) - len(capacities)
        if not avoid:
            return _why(slots, slot_type, capacities, disabled, label, self._pool)
        avoided = ", ".join(sorted(avoid))
        if not agents:
            return (
                f"needs {_slots(slots, slot_type)}; its log_policies exclude every agent "
                f"that could run it ({avoided}): add an agent, or kill the trial"
            )
        why = _why(slots, slot_type, capacities, disabled, label, self._pool)
        return f"{why} (besides {avoided}, which its log_policies exclude)"

    # -- snapshots -----------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The whole state as JSON-native values; `from_json` restores it exactly."""
        return _snapshot.dump(self._agents, self._allocations, self._group_of)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Scheduler:
        agents, allocations = _snapshot.load(data)
        scheduler = cls()
        for agent in agents:
            scheduler.add_agent(agent)
        for request_id, placement, group in allocations:
            scheduler._hold(request_id, placement, group)
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

    def _pick(self, agent_id: str, count: int) -> tuple[int, ...]:
        """`count` free slots of the agent, from one GPU island where it can (`choose_slots`)."""
        return choose_slots(count, self.free_slots(agent_id), self._agents[agent_id].islands)

    def _hold(self, request_id: str, placement: Placement, group: str = "") -> None:
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
        self._group_of[request_id] = group
        self._held[group] = self._held.get(group, 0) + sum(len(slots) for _, slots in placement)

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


def _slots(count: int, slot_type: str) -> str:
    kind = _KIND_NAMES.get(slot_type, slot_type)
    return f"{count} {kind} slot{'s' if count != 1 else ''}"


def _users_held(held: Mapping[str, int], limits: Limits) -> dict[str, int]:
    users: dict[str, int] = {}
    for group, count in held.items():
        user = limits.group(group).user
        users[user] = users.get(user, 0) + count
    return users


def _over_limit(
    request: Request, limits: Limits, held: Mapping[str, int], users: Mapping[str, int]
) -> Wait | None:
    """The max_slots or quota wait of a request that fits neither; None if it fits both."""
    group = limits.group(request.group)
    have = held.get(request.group, 0)
    if group.max_slots is not None and have + request.slots > group.max_slots:
        return Wait(
            "max_slots",
            f"its experiment holds {have} of its max_slots {group.max_slots} and the trial "
            f"needs {request.slots} more",
        )
    quota = limits.user_slot_quota
    if quota is not None:
        used = users.get(group.user, 0)
        if used + request.slots > quota:
            return Wait(
                "quota",
                f"user {group.user!r} holds {used} slots of the user_slot_quota {quota} and "
                f"the trial needs {request.slots} more",
            )
    return None


def _no_room(
    request: Request, free: int, free_at_start: int, decision: Decision, held: Mapping[str, int]
) -> Wait:
    """Why a request that passed its limits found no placement this round."""
    need = _slots(request.slots, request.slot_type)
    share = decision.shares.get(request.group)
    have = held.get(request.group, 0)
    if share is not None and have >= share.target:
        where = (
            f"at or above its fair share of {share.share:.3g}"
            if have >= share.share
            else f"its fair share of {share.share:.3g} rounds down to {share.target} whole slots"
        )
        return Wait(
            "share",
            f"needs {need}; its experiment holds {have}, {where} (weight {share.weight:g}): "
            "experiments below theirs go first",
        )
    if decision.assignments and request.slots <= free_at_start:
        return Wait(
            "priority",
            f"needs {need}; {free_at_start} were free, but trials considered before it "
            "(higher priority, earlier, or further below their fair share) took them",
        )
    if request.slots <= free:
        return Wait(
            "no_free_slots",
            f"needs {need}; {free} are free, but not {request.slots} split equally over "
            "few enough agents",
        )
    return Wait("no_free_slots", f"needs {need}; {free} free")


_NONE = FreeIndex()  # never written: what a label no agent carries offers


def _why(
    slots: int,
    slot_type: str,
    capacities: Sequence[int],
    disabled: int,
    label: str = "",
    pool: str | None = None,
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
    place = "the cluster" if pool is None else "the pool"  # its name leads the message
    has = f"the agents with label {label!r} have" if label else f"{place} has"
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
