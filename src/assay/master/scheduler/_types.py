"""The plain values the scheduler takes and returns; each checks its own fields."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

SlotType = Literal["cpu", "cuda"]
SLOT_TYPES: tuple[SlotType, ...] = ("cpu", "cuda")

Policy = Literal["priority", "fair_share"]
POLICIES: tuple[Policy, ...] = ("priority", "fair_share")

# Why a pending request was left pending in a round (see `Wait`).
WaitKind = Literal["too_large", "max_slots", "quota", "share", "priority", "no_free_slots"]

MIN_PRIORITY = 1
MAX_PRIORITY = 99
DEFAULT_PRIORITY = 42

# ((agent_id, (slot, ...)), ...), sorted by agent id; slots ascending.
Placement = tuple[tuple[str, tuple[int, ...]], ...]


def _check_id(kind: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{kind} id must be a non-empty string, got {value!r}")


def _check_slot_type(kind: str, value: object) -> None:
    if value not in SLOT_TYPES:
        raise ValueError(f"{kind} slot_type must be one of {SLOT_TYPES}, got {value!r}")


def _check_int(what: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{what} must be an integer >= {minimum}, got {value!r}")


@dataclass(frozen=True)
class Agent:
    """A machine offering `slots` slots of one type, indexed 0..slots-1.

    A disabled agent keeps its running allocations but receives no new ones. `label`
    ("" none) is the agent's `agent_label`: requests that name a label go only to agents
    that carry it. `islands[s]` is slot s's GPU island (NVLink, else NUMA node); empty:
    all in island 0. A multi-slot request takes slots of one island where it can.
    """

    id: str
    slots: int
    slot_type: SlotType
    enabled: bool = True
    label: str = ""
    islands: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _check_id("agent", self.id)
        _check_int(f"agent {self.id!r} slots", self.slots, 1)
        _check_slot_type(f"agent {self.id!r}", self.slot_type)
        if not isinstance(self.enabled, bool):
            raise ValueError(f"agent {self.id!r} enabled must be a bool, got {self.enabled!r}")
        if not isinstance(self.label, str):
            raise ValueError(f"agent {self.id!r} label must be a string, got {self.label!r}")
        if self.islands and (
            len(self.islands) != self.slots
            or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in self.islands)
        ):
            raise ValueError(
                f"agent {self.id!r} islands must be {self.slots} integers >= 0 (one a slot), "
                f"got {self.islands!r}"
            )


@dataclass(frozen=True)
class Request:
    """A gang request: `slots` slots of `slot_type`, all at once or not at all.

    Pending requests run by `priority` (1..99, lower first), then by `order`, the
    submission sequence number. `group` is the experiment: its weight, max_slots and
    user come from `Limits.groups`, and fair share divides slots between groups.
    `pool` ("" the default pool) is the resource pool whose scheduler places it (`Pools`);
    `label` ("" any agent) restricts it to agents with that `agent_label`; `avoid` are
    agents it must not be placed on (its trial's `exclude_node` log policies).
    """

    id: str
    slots: int
    slot_type: SlotType
    priority: int = DEFAULT_PRIORITY
    order: int = 0
    group: str = ""
    pool: str = ""
    label: str = ""
    avoid: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        _check_id("request", self.id)
        _check_int(f"request {self.id!r} slots", self.slots, 1)
        _check_slot_type(f"request {self.id!r}", self.slot_type)
        if (
            isinstance(self.priority, bool)
            or not isinstance(self.priority, int)
            or not MIN_PRIORITY <= self.priority <= MAX_PRIORITY
        ):
            raise ValueError(
                f"request {self.id!r} priority must be an integer in "
                f"{MIN_PRIORITY}..{MAX_PRIORITY}, got {self.priority!r}"
            )
        _check_int(f"request {self.id!r} order", self.order, 0)
        if not isinstance(self.group, str):
            raise ValueError(f"request {self.id!r} group must be a string, got {self.group!r}")
        for name in ("pool", "label"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(
                    f"request {self.id!r} {name} must be a string, got {getattr(self, name)!r}"
                )

    @property
    def rank(self) -> tuple[int, int, str]:
        """The key pending requests are considered by; the id only breaks exact ties."""
        return (self.priority, self.order, self.id)


@dataclass(frozen=True)
class Group:
    """A group of requests (an experiment) as the scheduler sees it.

    `weight` (> 0) is its relative share under fair share; `max_slots` caps the slots
    its allocations hold together (None: no cap); `user` owns it, for the user quota.
    """

    weight: float = 1.0
    max_slots: int | None = None
    user: str = ""

    def __post_init__(self) -> None:
        if (
            isinstance(self.weight, bool)
            or not isinstance(self.weight, int | float)
            or not 0 < self.weight < math.inf
        ):
            raise ValueError(f"group weight must be a number > 0, got {self.weight!r}")
        if self.max_slots is not None:
            _check_int("group max_slots", self.max_slots, 1)
        if not isinstance(self.user, str):
            raise ValueError(f"group user must be a string, got {self.user!r}")


DEFAULT_GROUP = Group()


@dataclass(frozen=True)
class Limits:
    """What bounds a round besides free slots: the groups' weights and caps, and the
    slots one user's groups may hold together (`user_slot_quota`, None: no quota).
    A group missing from `groups` has weight 1, no cap and no user."""

    groups: Mapping[str, Group] = field(default_factory=dict)
    user_slot_quota: int | None = None

    def __post_init__(self) -> None:
        if self.user_slot_quota is not None:
            _check_int("user_slot_quota", self.user_slot_quota, 1)

    def group(self, group_id: str) -> Group:
        return self.groups.get(group_id, DEFAULT_GROUP)


@dataclass(frozen=True)
class Wait:
    """Why a request is still pending after a round, in words a user reads.

    `kind`: too_large (no placement even on an idle cluster), max_slots (its group is at
    its cap), quota (its user is at the user quota), share (fair share: its group holds
    its share or more, and slots went to groups below theirs), priority (slots were free
    when the round began but requests considered before it took them), no_free_slots
    (too few free slots, or none split equally over few enough agents).
    """

    kind: WaitKind
    message: str


@dataclass(frozen=True)
class Share:
    """A group's fair share in a round: `share` slots by water filling, `target` that
    share rounded to whole slots (targets add up to the slots handed out), `held` now."""

    weight: float
    share: float
    target: int
    held: int


@dataclass(frozen=True)
class Assignment:
    """Slots given to one request: `placement` is ((agent_id, (slot, ...)), ...)."""

    request_id: str
    placement: Placement

    @property
    def slots(self) -> int:
        return sum(len(slots) for _, slots in self.placement)


@dataclass(frozen=True)
class Decision:
    """What one `Scheduler.schedule` call decided.

    `unschedulable` pairs a request id with why it can never run on the agents there are
    now (it stays pending: a larger agent may join). `waiting` gives every request left
    pending its reason, in the order the round considered them (its queue position);
    `shares` is each group's fair share (fair_share policy only).
    """

    assignments: list[Assignment] = field(default_factory=list)
    unschedulable: list[tuple[str, str]] = field(default_factory=list)
    waiting: dict[str, Wait] = field(default_factory=dict)
    shares: dict[str, Share] = field(default_factory=dict)
