"""The pure slot scheduler: agents and requests in, assignments out, state as JSON.

`Scheduler.schedule` places pending gang requests (all slots or none) by priority, then
submission order, with best fit on one agent or an equal split across several. It does
no I/O and reads no clock, so the master persists its decisions and tests drive it by
simulation (tests/scheduler/).
"""

from assay.master.scheduler._placement import choose_agents, largest_placement
from assay.master.scheduler._pools import (
    DEFAULT_POOL,
    POOL_SCHEDULERS,
    Pools,
    PoolScheduler,
    PoolSpec,
)
from assay.master.scheduler._preemption import Running, choose_victims
from assay.master.scheduler._scheduler import Scheduler
from assay.master.scheduler._types import (
    DEFAULT_PRIORITY,
    MAX_PRIORITY,
    MIN_PRIORITY,
    SLOT_TYPES,
    Agent,
    Assignment,
    Decision,
    Placement,
    Request,
    SlotType,
)

__all__ = [
    "DEFAULT_POOL",
    "DEFAULT_PRIORITY",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "SLOT_TYPES",
    "Agent",
    "Assignment",
    "Decision",
    "POOL_SCHEDULERS",
    "Placement",
    "PoolScheduler",
    "PoolSpec",
    "Pools",
    "Request",
    "Running",
    "Scheduler",
    "SlotType",
    "choose_agents",
    "choose_victims",
    "largest_placement",
]
