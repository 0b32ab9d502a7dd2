"""What the master knows of its agents, and what it tells them, as plain values.

The agent servicer turns the agents' protobuf messages into these and these into
protobuf (`_servicers.py`); the core and its lifecycles never see a wire type.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

SlotKind = Literal["cpu", "cuda"]


@dataclass(frozen=True)
class Device:
    """One slot's device as its agent describes it."""

    index: int
    name: str = ""
    uuid: str = ""
    memory_bytes: int = 0
    utilization: float = 0.0  # 0-1, last sample


@dataclass(frozen=True)
class Registration:
    """An agent (re)connecting: what it offers and what it still runs."""

    agent_id: str
    slot_type: SlotKind
    devices: tuple[Device, ...]
    address: str = ""
    memory_bytes: int = 0
    running_allocations: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Load:
    """A heartbeat's samples."""

    cpu_utilization: float = 0.0
    memory_used_fraction: float = 0.0
    devices: tuple[Device, ...] = ()


@dataclass(frozen=True)
class StartRun:
    """Start one agent's part of an allocation: one process per slot."""

    allocation_id: str
    trial_id: int
    run_id: int
    experiment_id: int
    slots: tuple[int, ...]
    ranks: tuple[int, ...]
    world_size: int
    master_addr: str
    master_port: int
    model_definition: bytes
    config_json: str
    checkpoint_uuid: str
    checkpoint_location: str
    trial_api: str
    token: str
    hparams_json: str
    trial_seed: int
    checkpoint_root: str


@dataclass(frozen=True)
class KillRun:
    """Stop an allocation's processes: at a checkpoint first when `graceful`."""

    allocation_id: str
    graceful: bool
    grace_seconds: int = 0


AgentMessage = StartRun | KillRun


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
    last_heartbeat: float = field(default_factory=time.time)
    cpu_utilization: float = 0.0
    memory_used_fraction: float = 0.0
    disconnected_at: float | None = None  # monotonic; its slots wait for it until the window


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


@dataclass(frozen=True)
class QueuedView:
    trial_id: int
    experiment_id: int
    experiment_name: str
    priority: int
    slots: int


@dataclass(frozen=True)
class ClusterView:
    """A snapshot of the cluster for the read-only RPCs (taken under the lock once)."""

    cluster_id: str
    slot_type: SlotKind  # what queued trials ask for
    agents: tuple[AgentView, ...]
    queue: tuple[QueuedView, ...]  # in the order they will be placed

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
