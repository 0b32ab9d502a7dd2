"""What the master knows of its agents, and what it shows of them, as plain values.

The agent servicer turns the agents' protobuf messages into these and these into
protobuf (`assay.master.wire`); the core and its lifecycles never see a wire type. What
the master tells an agent to do is the lifecycle's (`StartRun`, `KillRun`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

from assay.master.lifecycle import AgentMessage

if TYPE_CHECKING:
    from assay.master.lifecycle import TrialState
    from assay.master.scheduler import Request

SlotKind = Literal["cpu", "cuda"]


@dataclass(frozen=True)
class Device:
    """One slot's device as its agent describes it."""

    index: int
    name: str = ""
    uuid: str = ""
    memory_bytes: int = 0
    utilization: float = 0.0  # 0-1, last sample
    island: int = 0  # GPUs joined by NVLink (else on one NUMA node) share one


@dataclass(frozen=True)
class Registration:
    """An agent (re)connecting: what it offers and what it still runs."""

    agent_id: str
    slot_type: SlotKind
    devices: tuple[Device, ...]
    address: str = ""
    memory_bytes: int = 0
    running_allocations: frozenset[str] = frozenset()
    resource_pool: str = ""  # "" the master's default pool
    agent_label: str = ""


@dataclass(frozen=True)
class Load:
    """A heartbeat's samples."""

    cpu_utilization: float = 0.0
    memory_used_fraction: float = 0.0
    devices: tuple[Device, ...] = ()
    stopping: bool = False  # the agent is shutting down: place nothing more on it


class Outbox(Protocol):
    """Where an agent's messages wait for its stream (None: close the stream)."""

    def put(self, message: AgentMessage | None) -> None: ...


@dataclass
class AgentHandle:
    """A connected (or recently disconnected) agent and the stream to it."""

    id: str
    slot_type: SlotKind
    slots: int
    address: str
    devices: Sequence[Device]
    memory_bytes: int
    outbox: Outbox
    connected: bool = True
    enabled: bool = True
    draining: bool = False  # disabled with --drain: its running trials finish
    # It said it is shutting down: nothing more is placed on it (its registration is not
    # disabled; the agent's next registration places on it again).
    stopping: bool = False
    pool: str = ""
    label: str = ""
    last_heartbeat: float = field(default_factory=time.time)
    cpu_utilization: float = 0.0
    memory_used_fraction: float = 0.0
    disconnected_at: float | None = None  # monotonic; its slots wait for it until the window
    # The credential issued at this registration, until the agent is told it ("" none).
    credential: str = field(default="", repr=False)


@dataclass(frozen=True)
class SlotView:
    index: int
    enabled: bool
    allocation_id: str  # "" when free
    trial_id: int  # 0 when free


@dataclass(frozen=True)
class AgentView:
    """An agent as the read-only RPCs show it (a copy: safe outside the lock)."""

    id: str
    address: str
    slot_type: SlotKind
    devices: tuple[Device, ...]
    slots: tuple[SlotView, ...]
    connected: bool
    enabled: bool
    last_heartbeat: float  # seconds since the epoch
    memory_bytes: int
    memory_used_fraction: float
    cpu_utilization: float
    pool: str = ""
    label: str = ""
    draining: bool = False


@dataclass(frozen=True)
class PoolView:
    """A resource pool as `assay resource-pool list` shows it."""

    name: str
    description: str
    scheduler: str
    agents: tuple[str, ...]  # connected agents' ids
    queued: int  # trials waiting for this pool

    def slots(self, view: ClusterView) -> dict[SlotKind, tuple[int, int]]:
        """Slot type -> (total, used) over the pool's connected agents."""
        out: dict[SlotKind, tuple[int, int]] = {}
        for agent in view.connected:
            if agent.pool == self.name:
                total, used = out.get(agent.slot_type, (0, 0))
                busy = sum(1 for s in agent.slots if s.trial_id)
                out[agent.slot_type] = (total + len(agent.slots), used + busy)
        return out


@dataclass(frozen=True)
class QueuedView:
    trial_id: int
    experiment_id: int
    experiment_name: str
    priority: int
    slots: int
    # Why it cannot be placed even on an idle cluster ("" when it waits for free slots).
    reason: str = ""
    pool: str = ""
    # Its place in its pool's queue as the last round considered it (1 first), and why
    # it waits (`Wait.kind`, and in words).
    position: int = 0
    wait_kind: str = ""
    waiting: str = ""
    slot_type: SlotKind = "cpu"  # what it asks for: its pool's kind of slot


@dataclass(frozen=True)
class ClusterView:
    """A snapshot of the cluster for the read-only RPCs (taken under the lock once)."""

    cluster_id: str
    slot_type: SlotKind  # what queued trials ask for
    agents: tuple[AgentView, ...]
    queue: tuple[QueuedView, ...]  # in the order they will be placed
    pools: tuple[PoolView, ...] = ()

    @property
    def connected(self) -> tuple[AgentView, ...]:
        return tuple(a for a in self.agents if a.connected)

    @property
    def slots(self) -> int:
        return sum(len(a.slots) for a in self.connected)

    @property
    def free_slots(self) -> int:
        """Slots no trial holds, disabled agents' included."""
        return sum(1 for a in self.connected for s in a.slots if not s.trial_id)


def cluster_view(
    cluster_id: str,
    slot_type: SlotKind,
    agents: Iterable[AgentHandle],
    allocations: Mapping[str, tuple[tuple[str, tuple[int, ...]], ...]],
    allocation_of_trial: Mapping[int, str],
    queue: Iterable[tuple[Request, TrialState]],
    experiment_names: Mapping[int, str],
    reasons: Mapping[int, str],
    pools: Sequence[tuple[str, str, str]] = (),
    default_pool: str = "",
    waits: Mapping[int, tuple[str, str]] | None = None,
) -> ClusterView:
    """The snapshot `Master.cluster_view` takes under its lock (`allocations`: the
    scheduler's placements by request id, which is the trial id; `pools`: (name,
    description, scheduler) of each declared pool)."""
    owners: dict[tuple[str, int], int] = {}
    for request_id, placement in allocations.items():
        for agent_id, slots in placement:
            for slot in slots:
                owners[agent_id, slot] = int(request_id)

    def slot_of(agent: AgentHandle, index: int) -> SlotView:
        trial_id = owners.get((agent.id, index), 0)
        allocation_id = allocation_of_trial.get(trial_id, "") if trial_id else ""
        return SlotView(index, agent.enabled, allocation_id, trial_id)

    views = tuple(
        AgentView(
            id=a.id,
            address=a.address,
            slot_type=a.slot_type,
            devices=tuple(a.devices),
            slots=tuple(slot_of(a, i) for i in range(a.slots)),
            connected=a.connected,
            enabled=a.enabled,
            last_heartbeat=a.last_heartbeat,
            memory_bytes=a.memory_bytes,
            memory_used_fraction=a.memory_used_fraction,
            cpu_utilization=a.cpu_utilization,
            pool=a.pool,
            label=a.label,
            draining=a.draining and not a.enabled,
        )
        for a in sorted(agents, key=lambda a: a.id)
    )
    waits = waits or {}
    places: dict[str, int] = {}  # pool -> trials seen so far: `queue` is in placing order

    def place(pool: str) -> int:
        places[pool] = places.get(pool, 0) + 1
        return places[pool]

    queued = tuple(
        QueuedView(
            trial.id,
            trial.experiment_id,
            experiment_names.get(trial.experiment_id, ""),
            request.priority,
            request.slots,
            reasons.get(trial.id, ""),
            request.pool or default_pool,
            place(request.pool or default_pool),
            *waits.get(trial.id, ("", "")),
            slot_type=request.slot_type,
        )
        for request, trial in queue
    )
    pool_views = tuple(
        PoolView(
            name,
            description,
            scheduler,
            tuple(a.id for a in views if a.connected and a.pool == name),
            sum(1 for q in queued if q.pool == name),
        )
        for name, description, scheduler in pools
    )
    return ClusterView(cluster_id, slot_type, views, queued, pool_views)
