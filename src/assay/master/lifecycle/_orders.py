"""What the master tells an agent to do, as plain values: a lifecycle decision orders an
agent's part of a run started (`StartRun`) or stopped (`KillRun`).

The agents' stream turns these into protobuf (`assay.master.wire`); the decisions and
the interpreter never see a wire type.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


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
    # The sha256 of each file of the checkpoint to restore, as recorded (empty: none).
    checkpoint_sha256: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class KillRun:
    """Stop an allocation's processes: at a checkpoint first when `graceful`."""

    allocation_id: str
    graceful: bool
    grace_seconds: int = 0


AgentMessage = StartRun | KillRun
