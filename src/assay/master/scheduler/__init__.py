"""The pure slot scheduler: agents and requests in, assignments out, state as JSON.

`Scheduler.schedule` places pending gang requests (all slots or none) by priority, then
submission order (policy "priority"), or by weighted fair share between experiments
(policy "fair_share", see `_fair_share`), within each experiment's max_slots and each
user's slot quota, with best fit on one agent or an equal split across several. It does
no I/O and reads no clock, so the master persists its decisions and tests drive it by
simulation (tests/scheduler/).
"""

from assay.master.scheduler._fair_share import choose_share_victims, targets, water_fill
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
    POLICIES,
    SLOT_TYPES,
    Agent,
    Assignment,
    Decision,
    Group,
    Limits,
    Placement,
    Policy,
    Request,
    Share,
    SlotType,
    Wait,
    WaitKind,
)

__all__ = [
    "Agent",
    "Assignment",
    "DEFAULT_POOL",
    "DEFAULT_PRIORITY",
    "Decision",
    "Group",
    "Limits",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "POLICIES",
    "POOL_SCHEDULERS",
    "Placement",
    "Policy",
    "PoolScheduler",
    "PoolSpec",
    "Pools",
    "Request",
    "Running",
    "SLOT_TYPES",
    "Scheduler",
    "Share",
    "SlotType",
    "Wait",
    "WaitKind",
    "choose_agents",
    "choose_share_victims",
    "choose_victims",
    "largest_placement",
    "targets",
    "water_fill",
]
