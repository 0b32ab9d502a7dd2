"""Usage records on a master with resource pools: each part of a gang is charged to its
agent's pool, and the admins' report gives each pool's capacity from its connected slots
since each agent joined."""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import select

from assay.master._server import MasterServer
from assay.master.store._models import SlotUsage
from assay.proto import api_pb2, api_pb2_grpc
from tests.credentials import authed_channel, master_config
from tests.master.conftest import ScriptedAgent, eventually, experiment_yaml, model_archive

POOLS = [{"name": "default"}, {"name": "gpu", "scheduler": "fair_share"}]


def _create(api: api_pb2_grpc.ApiStub, slots: int, pool: str = "") -> int:
    resources: dict[str, object] = {"slots_per_trial": slots}
    if pool:
        resources["resource_pool"] = pool
    response = api.CreateExperiment(
        api_pb2.CreateExperimentRequest(
            config_yaml=experiment_yaml(
                resources=resources,
                hyperparameters={"global_batch_size": 8 * slots, "lr": 0.1},
            ),
            model_definition=model_archive(),
            activate=True,
        )
    )
    experiment_id: int = response.experiment.id
    return experiment_id


def test_each_part_is_charged_to_its_agents_pool(tmp_path: Path) -> None:
    config = master_config(
        state_dir=tmp_path / "master", agent_reconnect_wait_s=2.0, resource_pools=POOLS
    )
    began = time.monotonic()
    server = MasterServer(config)
    server.start()
    agents = [
        ScriptedAgent(server.port, "d1", slots=1),
        ScriptedAgent(server.port, "d2", slots=1),
        ScriptedAgent(server.port, "g1", slots=2, pool="gpu"),
    ]
    d1, d2, g1 = agents
    channel = authed_channel(f"127.0.0.1:{server.port}")
    try:
        api = api_pb2_grpc.ApiStub(channel)
        gang = _create(api, 2)  # one slot on each default agent
        on_gpu = _create(api, 2, pool="gpu")
        started = {d1.next("start").start.allocation_id, d2.next("start").start.allocation_id}
        [gang_allocation] = started
        gpu_allocation = g1.next("start").start.allocation_id
        for agent, allocation in ((d1, gang_allocation), (d2, gang_allocation)):
            agent.exited(allocation, [0])
        g1.exited(gpu_allocation, [0])

        def rows() -> list[tuple[str, str, str, int, int, bool]]:
            with server.master.store.read() as s:
                found = s.execute(select(SlotUsage).order_by(SlotUsage.agent_id)).scalars()
                return [
                    (
                        r.allocation_id,
                        r.agent_id,
                        r.pool,
                        r.experiment_id,
                        r.slots,
                        r.ended_at is None,
                    )
                    for r in found
                    if r.allocation_id in (gang_allocation, gpu_allocation)
                ]

        eventually(lambda: len(rows()) == 3 and not any(r[5] for r in rows()))
        assert rows() == [
            (gang_allocation, "d1", "default", gang, 1, False),
            (gang_allocation, "d2", "default", gang, 1, False),
            (gpu_allocation, "g1", "gpu", on_gpu, 2, False),
        ]
        report = api.GetUsage(api_pb2.GetUsageRequest(by="pool"))
        assert {g.key for g in report.groups} == {"default", "gpu"}
        # Capacity: the connected slots of each pool (2 and 2), each from its agent's first
        # join (moments ago, not the 30 days of the window) to now.
        capacity = {p.pool: p.capacity_slot_seconds for p in report.pools}
        most = 2 * (time.monotonic() - began)
        assert 0 < capacity["default"] <= most
        assert 0 < capacity["gpu"] <= most
        for experiment_id in (gang, on_gpu):
            api.ExperimentAction(
                api_pb2.ExperimentActionRequest(
                    id=experiment_id, action=api_pb2.EXPERIMENT_ACTION_KILL
                )
            )
    finally:
        channel.close()
        for agent in agents:
            agent.close()
        server.stop(grace=0.5)
