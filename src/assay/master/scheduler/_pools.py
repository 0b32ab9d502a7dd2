"""`Pools`: one `Scheduler` per resource pool, and which pool each agent and request is in.

Agents belong to exactly one pool, so a gang placed by one pool's scheduler never spans
pools, and preemption only ever sees one pool's allocations. `Pools` offers the calls the
master makes of a scheduler (agents, allocations, releases) and routes each to the right
pool's `Scheduler`; `schedule` splits the queue by pool. Pure, as `Scheduler` is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from assay.master.scheduler._scheduler import Scheduler
from assay.master.scheduler._types import (
    Agent,
    Decision,
    Limits,
    Placement,
    Request,
    SlotType,
    Wait,
)

PoolScheduler = Literal["priority", "fair_share"]
POOL_SCHEDULERS: tuple[PoolScheduler, ...] = ("priority", "fair_share")
DEFAULT_POOL = "default"


@dataclass(frozen=True)
class PoolSpec:
    """A resource pool as the master's `resource_pools` setting declares it."""

    name: str
    description: str = ""
    scheduler: PoolScheduler = "priority"
    # The pool's own user slot quota, in place of the master's (None: the master's).
    user_slot_quota: int | None = None
    # Whether waiting trials may stop running ones here (at a checkpoint): a fair_share
    # pool for fairness, a priority pool for priority. None: a fair_share pool does, a
    # priority pool as the master's `preemption` says.
    preemption: bool | None = None

    def __post_init__(self) -> None:
        quota = self.user_slot_quota
        if quota is not None and (
            isinstance(quota, bool) or not isinstance(quota, int) or quota < 1
        ):
            raise ValueError(
                f"resource pool {self.name!r}: user_slot_quota must be an integer >= 1, "
                f"got {quota!r}"
            )
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(
                f"a resource pool's name must be a non-empty string, got {self.name!r}"
            )
        if self.preemption is not None and not isinstance(self.preemption, bool):
            raise ValueError(
                f"resource pool {self.name!r}: preemption must be true or false, "
                f"got {self.preemption!r}"
            )
        if self.scheduler not in POOL_SCHEDULERS:
            raise ValueError(
                f"resource pool {self.name!r}: scheduler must be one of "
                f"{', '.join(POOL_SCHEDULERS)}, got {self.scheduler!r}"
            )

    def preempts(self, master_default: bool) -> bool:
        """Whether trials waiting in this pool may stop running ones (at a checkpoint)."""
        if self.preemption is not None:
            return self.preemption
        return self.scheduler == "fair_share" or master_default


class Pools:
    """The pools' schedulers, and which pool holds which agent and which allocation."""

    def __init__(self, specs: Sequence[PoolSpec] = (), default: str = DEFAULT_POOL) -> None:
        specs = tuple(specs) or (PoolSpec(default),)
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            twice = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"resource pool names must be unique: {', '.join(twice)} twice")
        if default not in names:
            raise ValueError(
                f"the default resource pool {default!r} is not declared: pools are "
                f"{', '.join(names)}"
            )
        self.specs: dict[str, PoolSpec] = {s.name: s for s in specs}
        self.default = default
        named = len(specs) > 1  # with one pool, messages speak of the cluster
        self._schedulers = {s.name: Scheduler(s.name if named else None) for s in specs}
        self._agent_pool: dict[str, str] = {}

    # -- pools ---------------------------------------------------------------------------

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.specs)

    def resolve(self, pool: str) -> str:
        """A request's pool ("" is the default pool)."""
        return pool or self.default

    def unknown(self, pool: str) -> str | None:
        """Why `pool` cannot be used, naming the pools there are; None if it exists."""
        if self.resolve(pool) in self.specs:
            return None
        return f"resource pool {pool!r} does not exist: pools are {', '.join(self.specs)}"

    def scheduler(self, pool: str) -> Scheduler:
        return self._schedulers[self.resolve(pool)]

    def kind(self, pool: str) -> PoolScheduler:
        """The scheduling policy the pool is configured with (priority or fair_share)."""
        return self.specs[self.resolve(pool)].scheduler

    def pool_of(self, agent_id: str) -> str | None:
        """The pool of a known agent; None for an agent these schedulers do not hold."""
        return self._agent_pool.get(agent_id)

    def pool_of_request(self, request_id: str) -> str | None:
        """The pool whose scheduler holds the request's allocation, if any."""
        for name, scheduler in self._schedulers.items():
            if scheduler.allocation_of(request_id) is not None:
                return name
        return None

    # -- agents --------------------------------------------------------------------------

    @property
    def agents(self) -> tuple[Agent, ...]:
        return tuple(a for s in self._schedulers.values() for a in s.agents)

    @property
    def has_agents(self) -> bool:
        return bool(self._agent_pool)

    def add_agent(self, agent: Agent, pool: str = "") -> None:
        name = self.resolve(pool)
        problem = self.unknown(name)
        if problem:
            raise ValueError(problem)
        if agent.id in self._agent_pool:
            raise ValueError(f"duplicate agent id {agent.id!r}: remove the old agent first")
        self._schedulers[name].add_agent(agent)
        self._agent_pool[agent.id] = name

    def remove_agent(self, agent_id: str, *, keep_other_parts: bool = False) -> list[str]:
        evicted = self._of(agent_id).remove_agent(agent_id, keep_other_parts=keep_other_parts)
        del self._agent_pool[agent_id]
        return evicted

    def set_agent_enabled(self, agent_id: str, enabled: bool, *, drain: bool = True) -> list[str]:
        return self._of(agent_id).set_agent_enabled(agent_id, enabled, drain=drain)

    def free_slots(self, agent_id: str) -> tuple[int, ...]:
        return self._of(agent_id).free_slots(agent_id)

    # -- allocations ---------------------------------------------------------------------

    @property
    def allocations(self) -> dict[str, Placement]:
        out: dict[str, Placement] = {}
        for scheduler in self._schedulers.values():
            out.update(scheduler.allocations)
        return out

    def allocation_of(self, request_id: str) -> Placement | None:
        for scheduler in self._schedulers.values():
            placement = scheduler.allocation_of(request_id)
            if placement is not None:
                return placement
        return None

    def adopt(self, request_id: str, agent_id: str, slots: Sequence[int], group: str = "") -> None:
        """A running allocation's part (of `group`), re-adopted into its agent's pool."""
        self._of(agent_id).adopt(request_id, agent_id, slots, group)

    def release(self, request_id: str) -> bool:
        """Free the request's slots in every pool (a gang adopted after the pools changed
        may hold parts in two); False if it held none."""
        return any([s.release(request_id) for s in self._schedulers.values()])

    def schedule(self, pending: Sequence[Request], limits: Limits | None = None) -> Decision:
        """Each pool's scheduler places its own requests with the pool's policy (and the
        groups' weights, caps and the user quota of `limits`); a request naming a pool
        that does not exist is unschedulable, with the pools there are."""
        decision = Decision()
        by_pool: dict[str, list[Request]] = {name: [] for name in self._schedulers}
        for request in pending:
            name = self.resolve(request.pool)
            if name in by_pool:
                by_pool[name].append(request)
            else:
                why = self.unknown(name) or ""
                decision.unschedulable.append((request.id, why))
                decision.waiting[request.id] = Wait("too_large", why)
        for name, requests in by_pool.items():
            if not requests:
                continue
            bounds = limits
            quota = self.specs[name].user_slot_quota
            if quota is not None:  # the pool's own quota overrides the master's
                bounds = dataclasses.replace(limits or Limits(), user_slot_quota=quota)
            part = self._schedulers[name].schedule(requests, policy=self.kind(name), limits=bounds)
            decision.assignments.extend(part.assignments)
            decision.shares.update(part.shares)  # an experiment is in one pool only
            decision.waiting.update(
                (request_id, Wait(wait.kind, self._in(name, wait.message)))
                for request_id, wait in part.waiting.items()
            )
            decision.unschedulable.extend(
                (request_id, self._in(name, why)) for request_id, why in part.unschedulable
            )
        return decision

    def why_never(
        self, slots: int, slot_type: SlotType, pool: str = "", label: str = ""
    ) -> str | None:
        problem = self.unknown(pool)
        if problem:
            return problem
        name = self.resolve(pool)
        why = self._schedulers[name].why_never(slots, slot_type, label)
        return None if why is None else self._in(name, why)

    # -- snapshots -----------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """Every pool's spec and scheduler state; `from_json` restores it exactly."""
        return {
            "default": self.default,
            "pools": [
                {
                    "name": spec.name,
                    "description": spec.description,
                    "scheduler": spec.scheduler,
                    "state": self._schedulers[spec.name].to_json(),
                }
                | ({"user_slot_quota": spec.user_slot_quota} if spec.user_slot_quota else {})
                for spec in self.specs.values()
            ],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Pools:
        if not isinstance(data, Mapping) or not isinstance(data.get("pools"), list):
            raise ValueError("pools snapshot must be an object with a 'pools' list")
        items = data["pools"]
        specs = [
            PoolSpec(
                str(i.get("name")),
                str(i.get("description", "")),
                i.get("scheduler"),
                i.get("user_slot_quota"),
            )
            for i in items
        ]
        pools = cls(specs, str(data.get("default", DEFAULT_POOL)))
        for spec, item in zip(specs, items, strict=True):
            scheduler = Scheduler.from_json(item.get("state"))
            pools._schedulers[spec.name] = scheduler
            pools._agent_pool.update(dict.fromkeys((a.id for a in scheduler.agents), spec.name))
        return pools

    # -- internals -----------------------------------------------------------------------

    def _of(self, agent_id: str) -> Scheduler:
        name = self._agent_pool.get(agent_id)
        if name is None:
            raise ValueError(f"unknown agent {agent_id!r}")
        return self._schedulers[name]

    def _in(self, pool: str, why: str) -> str:
        """A reason, naming the pool when there is more than one."""
        return why if len(self._schedulers) == 1 else f"pool {pool}: {why}"
