"""The agents' protobuf messages to the core's plain values (`assay.master.fleet`,
`assay.master.lifecycle`), and back."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from assay.master.fleet import AgentView, ClusterView, Device, Load, Registration, SlotKind
from assay.master.lifecycle import AgentMessage, KillRun
from assay.master.store import LogLine
from assay.proto import agent_pb2, api_pb2, common_pb2


def slot_kind(slot_type: int) -> SlotKind:
    return "cuda" if slot_type == common_pb2.SLOT_TYPE_CUDA else "cpu"


def slot_type(kind: SlotKind) -> common_pb2.SlotType.ValueType:
    return common_pb2.SLOT_TYPE_CUDA if kind == "cuda" else common_pb2.SLOT_TYPE_CPU


def devices(messages: Iterable[common_pb2.Device]) -> tuple[Device, ...]:
    return tuple(
        Device(d.index, d.name, d.uuid, d.memory_bytes, d.utilization, d.island) for d in messages
    )


def registration(register: agent_pb2.Register, peer_host: str) -> Registration:
    return Registration(
        agent_id=register.agent_id,
        slot_type=slot_kind(register.slot_type),
        devices=devices(register.devices),
        address=register.address or peer_host,
        memory_bytes=register.memory_bytes,
        running_allocations=frozenset(register.running_allocations),
        resource_pool=register.resource_pool,
        agent_label=register.agent_label,
    )


def load(beat: agent_pb2.Heartbeat) -> Load:
    return Load(
        beat.cpu_utilization, beat.memory_used_fraction, devices(beat.devices), beat.stopping
    )


def log_lines(batch: agent_pb2.LogBatch) -> list[LogLine]:
    return [
        LogLine(
            message=line.message,
            rank=line.rank,
            stream=line.stream or "stdout",
            level=line.level or None,
            timestamp=line.timestamp.ToDatetime(dt.UTC) if line.HasField("timestamp") else None,
        )
        for line in batch.lines
    ]


def master_message(message: AgentMessage) -> agent_pb2.MasterMessage:
    if isinstance(message, KillRun):
        return agent_pb2.MasterMessage(
            kill=agent_pb2.KillAllocation(
                allocation_id=message.allocation_id,
                graceful=message.graceful,
                grace_seconds=message.grace_seconds,
            )
        )
    return agent_pb2.MasterMessage(
        start=agent_pb2.StartAllocation(
            allocation_id=message.allocation_id,
            trial_id=message.trial_id,
            run_id=message.run_id,
            experiment_id=message.experiment_id,
            slots=message.slots,
            ranks=message.ranks,
            world_size=message.world_size,
            master_addr=message.master_addr,
            master_port=message.master_port,
            model_definition=message.model_definition,
            config_json=message.config_json,
            checkpoint_uuid=message.checkpoint_uuid,
            checkpoint_location=message.checkpoint_location,
            trial_api=message.trial_api,
            token=message.token,
            hparams_json=message.hparams_json,
            trial_seed=message.trial_seed,
            checkpoint_root=message.checkpoint_root,
            checkpoint_sha256=dict(message.checkpoint_sha256),
        )
    )


def device_message(device: Device, kind: SlotKind) -> common_pb2.Device:
    return common_pb2.Device(
        index=device.index,
        type=slot_type(kind),
        name=device.name,
        uuid=device.uuid,
        memory_bytes=device.memory_bytes,
        utilization=device.utilization,
        island=device.island,
    )


def agent_message(agent: AgentView) -> common_pb2.Agent:
    kind = slot_type(agent.slot_type)
    last = dt.datetime.fromtimestamp(agent.last_heartbeat, dt.UTC)
    message = common_pb2.Agent(
        id=agent.id,
        address=agent.address,
        slot_type=kind,
        devices=[device_message(d, agent.slot_type) for d in agent.devices],
        slots=[
            common_pb2.Slot(
                agent_id=agent.id,
                index=s.index,
                type=kind,
                enabled=s.enabled,
                allocation_id=s.allocation_id,
                trial_id=s.trial_id,
            )
            for s in agent.slots
        ],
        connected=agent.connected,
        enabled=agent.enabled,
        memory_bytes=agent.memory_bytes,
        memory_used_fraction=agent.memory_used_fraction,
        cpu_utilization=agent.cpu_utilization,
        resource_pool=agent.pool,
        agent_label=agent.label,
        draining=agent.draining,
    )
    message.last_heartbeat.FromDatetime(last)
    return message


def pool_messages(view: ClusterView, default: str) -> list[api_pb2.ResourcePool]:
    """The declared pools with their connected agents' slots (by slot type) and queue."""
    out = []
    for pool in view.pools:
        slots = [
            api_pb2.PoolSlots(
                slot_type=slot_type(kind),
                total=total,
                used=used,
                free=total - used,
            )
            for kind, (total, used) in sorted(pool.slots(view).items())
        ]
        out.append(
            api_pb2.ResourcePool(
                name=pool.name,
                description=pool.description,
                scheduler=pool.scheduler,
                agents=pool.agents,
                slots=slots,
                queued_trials=pool.queued,
                default=pool.name == default,
            )
        )
    return out
