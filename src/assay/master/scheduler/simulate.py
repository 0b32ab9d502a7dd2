"""A seeded simulation of shared pools: requests arrive and finish, each pool's
`Scheduler` places them under its policy, and the invariants are checked every round.

No processes, no clock: one `random.Random(seed)` decides every event, so a failing seed
replays exactly. Checked after every round (any breach raises `InvariantError`):

- no slot is given twice, and every placement names slots its agent has;
- no group holds more than its `max_slots`, no user more than the user quota in a pool;
- every request left pending has a reason, and no placed request has one.

`converge` then keeps every group's queue full and ends the oldest allocation each step
(as trials of equal length do), so that fair share can settle; `SimulationResult.gap`
is the largest |held - share| over the groups of fair-share pools at the end.
With preemption on, fair-share pools stop allocations of groups above their target for
the first request entitled to them, as the master does (here the slots free at once).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from assay.master.scheduler._fair_share import choose_share_victims
from assay.master.scheduler._preemption import Running
from assay.master.scheduler._scheduler import Scheduler
from assay.master.scheduler._types import Agent, Group, Limits, Policy, Request, Share


class InvariantError(AssertionError):
    """The scheduler broke one of the invariants the simulation checks."""


@dataclass(frozen=True)
class SimGroup:
    """An experiment: its pool, its trials' size, and what `Limits` says of it."""

    id: str
    pool: str = "default"
    slots_per_trial: int = 1
    weight: float = 1.0
    max_slots: int | None = None
    user: str = ""


@dataclass(frozen=True)
class SimPool:
    """A pool: its agents' slot counts and its policy."""

    agents: tuple[int, ...]
    policy: Policy = "fair_share"


@dataclass
class SimulationResult:
    rounds: int = 0
    placed: int = 0
    finished: int = 0
    preempted: int = 0
    held: dict[str, dict[str, int]] = field(default_factory=dict)  # pool -> group -> slots
    shares: dict[str, dict[str, Share]] = field(default_factory=dict)  # fair-share pools

    @property
    def gap(self) -> float:
        """The largest |held - share| of any group of a fair-share pool at the end."""
        return max(
            (
                abs(self.held[pool].get(group, 0) - share.share)
                for pool, shares in self.shares.items()
                for group, share in shares.items()
            ),
            default=0.0,
        )


class Simulation:
    """The pools, their pending requests and running allocations."""

    def __init__(
        self,
        seed: int,
        pools: Mapping[str, SimPool],
        groups: Sequence[SimGroup],
        *,
        user_slot_quota: int | None = None,
        preemption: bool = False,
    ) -> None:
        self.rng = random.Random(seed)
        self.pools = dict(pools)
        self.groups = {g.id: g for g in groups}
        self.limits = Limits(
            {g.id: Group(g.weight, g.max_slots, g.user) for g in groups}, user_slot_quota
        )
        self.preemption = preemption
        self.schedulers: dict[str, Scheduler] = {}
        for name, pool in self.pools.items():
            scheduler = Scheduler()
            for i, slots in enumerate(pool.agents):
                scheduler.add_agent(Agent(f"{name}-{i}", slots, "cpu"))
            self.schedulers[name] = scheduler
        self.pending: dict[str, Request] = {}
        self.running: dict[str, tuple[str, int]] = {}  # request id -> (pool, start round)
        self.result = SimulationResult()
        self._next = 0

    # -- events --------------------------------------------------------------------------

    def arrive(self, group_id: str) -> None:
        group = self.groups[group_id]
        self._next += 1
        request = Request(
            f"r{self._next}",
            group.slots_per_trial,
            "cpu",
            order=self._next,
            group=group_id,
            pool=group.pool,
        )
        self.pending[request.id] = request

    def finish(self, request_id: str) -> None:
        pool, _ = self.running.pop(request_id)
        self.schedulers[pool].release(request_id)
        self.result.finished += 1

    def round(self) -> None:
        """One scheduling round in every pool, then fair-share preemption, checked."""
        self.result.rounds += 1
        for name, scheduler in self.schedulers.items():
            mine = [r for r in self.pending.values() if r.pool == name]
            decision = scheduler.schedule(mine, policy=self.pools[name].policy, limits=self.limits)
            placed = {a.request_id for a in decision.assignments}
            for request_id in placed:
                del self.pending[request_id]
                self.running[request_id] = (name, self.result.rounds)
            self.result.placed += len(placed)
            waiting = set(decision.waiting)
            if waiting & placed or waiting != {r.id for r in mine} - placed:
                raise InvariantError(f"pool {name}: reasons do not match what is left pending")
            if decision.shares:
                self.result.shares[name] = decision.shares
            self._check(name)
            if self.preemption and decision.shares:
                self._preempt(name, decision.waiting, decision.shares)
                self._check(name)

    def _preempt(
        self, pool: str, waiting: Mapping[str, object], shares: Mapping[str, Share]
    ) -> None:
        scheduler = self.schedulers[pool]
        goal = {g: s.target for g, s in shares.items()}
        running = [
            Running(r, 0, self.running[r][1], p, scheduler.group_of(r))
            for r, p in scheduler.allocations.items()
        ]
        free = {a.id: len(scheduler.free_slots(a.id)) for a in scheduler.agents}
        for request_id in waiting:
            request = self.pending[request_id]
            victims = choose_share_victims(request, running, free, goal, scheduler.held_by_group())
            if victims:
                for victim in victims:
                    group = scheduler.group_of(victim)
                    size = sum(len(s) for _, s in scheduler.allocations[victim])
                    self.finish(victim)
                    self.result.finished -= 1
                    self.result.preempted += 1
                    self.arrive_again(victim, group, size)
                return

    def arrive_again(self, request_id: str, group: str, size: int) -> None:
        """A preempted request is queued again, keeping its id."""
        self._next += 1
        self.pending[request_id] = Request(
            request_id, size, "cpu", order=self._next, group=group, pool=self.groups[group].pool
        )

    # -- invariants ----------------------------------------------------------------------

    def _check(self, pool: str) -> None:
        scheduler = self.schedulers[pool]
        seen: set[tuple[str, int]] = set()
        capacity = {a.id: a.slots for a in scheduler.agents}
        held: dict[str, int] = {}
        for request_id, placement in scheduler.allocations.items():
            for agent_id, slots in placement:
                for slot in slots:
                    if (agent_id, slot) in seen:
                        raise InvariantError(f"slot {slot} of {agent_id} is given twice")
                    if not 0 <= slot < capacity[agent_id]:
                        raise InvariantError(f"slot {slot} of {agent_id} does not exist")
                    seen.add((agent_id, slot))
            group = scheduler.group_of(request_id)
            held[group] = held.get(group, 0) + sum(len(s) for _, s in placement)
        if held != scheduler.held_by_group():
            raise InvariantError(f"pool {pool}: held {scheduler.held_by_group()} != {held}")
        users: dict[str, int] = {}
        for group_id, count in held.items():
            limit = self.limits.group(group_id)
            if limit.max_slots is not None and count > limit.max_slots:
                raise InvariantError(
                    f"group {group_id} holds {count} slots, past its max_slots {limit.max_slots}"
                )
            users[limit.user] = users.get(limit.user, 0) + count
        quota = self.limits.user_slot_quota
        for user, count in users.items():
            if quota is not None and count > quota:
                raise InvariantError(f"user {user!r} holds {count} slots, past the quota {quota}")
        self.result.held[pool] = held


def simulate(
    seed: int,
    pools: Mapping[str, SimPool],
    groups: Sequence[SimGroup],
    *,
    user_slot_quota: int | None = None,
    preemption: bool = False,
    events: int = 200,
    converge: int = 0,
) -> SimulationResult:
    """`events` random arrivals and finishes, a round after each; then `converge` steps
    of ending the oldest allocation with every group's queue kept full."""
    sim = Simulation(seed, pools, groups, user_slot_quota=user_slot_quota, preemption=preemption)
    ids = sorted(sim.groups)
    for _ in range(events):
        if sim.running and sim.rng.random() < 0.4:
            sim.finish(sim.rng.choice(sorted(sim.running)))
        else:
            sim.arrive(sim.rng.choice(ids))
        sim.round()
    for _ in range(converge):
        for group_id in ids:
            waiting = sum(1 for r in sim.pending.values() if r.group == group_id)
            for _ in range(3 - waiting):
                sim.arrive(group_id)
        if sim.running:
            oldest = min(sim.running, key=lambda r: (sim.running[r][1], r))
            sim.finish(oldest)
        sim.round()
    return sim.result
