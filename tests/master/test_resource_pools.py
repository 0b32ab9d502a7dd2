"""Resource pools on a real master: agents join the pool they name, trials run in the pool
their experiment names (on agents with its label), and nothing crosses a pool's edge."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from assay.errors import PREEMPTED_EXIT_CODE
from assay.master._server import MasterServer
from assay.proto import agent_pb2, agent_pb2_grpc, api_pb2, api_pb2_grpc, common_pb2
from tests.credentials import JOIN_METADATA, authed_channel, master_config
from tests.master.conftest import ScriptedAgent, eventually, experiment_yaml, model_archive

POOLS = [
    {"name": "default", "description": "CPU boxes"},
    {"name": "gpu", "description": "the GPU machines", "scheduler": "fair_share"},
]


@pytest.fixture(scope="module")
def pooled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MasterServer]:
    config = master_config(
        state_dir=tmp_path_factory.mktemp("pools") / "master",
        heartbeat_interval_s=0.5,
        agent_reconnect_wait_s=2.0,
        resource_pools=POOLS,
    )
    server = MasterServer(config)
    server.start()
    yield server
    server.stop(grace=0.5)


@pytest.fixture(scope="module")
def api(pooled: MasterServer) -> Iterator[api_pb2_grpc.ApiStub]:
    channel = authed_channel(f"127.0.0.1:{pooled.port}")
    yield api_pb2_grpc.ApiStub(channel)
    channel.close()


def _create(api: api_pb2_grpc.ApiStub, slots: int = 1, **resources: str) -> int:
    response: api_pb2.CreateExperimentResponse = api.CreateExperiment(
        api_pb2.CreateExperimentRequest(
            config_yaml=experiment_yaml(
                resources={"slots_per_trial": slots, **resources},
                hyperparameters={"global_batch_size": 8 * slots, "lr": 0.1},
            ),
            model_definition=model_archive(),
            activate=True,
        )
    )
    return response.experiment.id


def _kill(api: api_pb2_grpc.ApiStub, experiment_id: int) -> None:
    api.ExperimentAction(
        api_pb2.ExperimentActionRequest(id=experiment_id, action=api_pb2.EXPERIMENT_ACTION_KILL)
    )


def _trial(api: api_pb2_grpc.ApiStub, experiment_id: int) -> common_pb2.Trial:
    response = api.GetExperiment(api_pb2.GetExperimentRequest(id=experiment_id))
    trial: common_pb2.Trial
    [trial] = response.trials
    return trial


def _register(port: int, pool: str) -> grpc.RpcError:
    """Register an agent naming `pool`; the master's refusal."""
    register = agent_pb2.Register(
        agent_id="stray",
        slot_type=common_pb2.SLOT_TYPE_CPU,
        devices=[common_pb2.Device(index=0, type=common_pb2.SLOT_TYPE_CPU)],
        resource_pool=pool,
    )
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = agent_pb2_grpc.AgentServiceStub(channel)
        stream = stub.Connect(
            iter([agent_pb2.AgentMessage(register=register)]), metadata=JOIN_METADATA
        )
        with pytest.raises(grpc.RpcError) as refused:
            list(stream)
    return refused.value


def test_an_agent_naming_an_unknown_pool_is_refused_with_the_pools(pooled: MasterServer) -> None:
    error = _register(pooled.port, "tpu")

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "resource pool 'tpu'" in (error.details() or "")
    assert "one of default, gpu" in (error.details() or "")


def test_an_experiment_naming_an_unknown_pool_is_refused(api: api_pb2_grpc.ApiStub) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        _create(api, resource_pool="tpu")

    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == (
        "resources.resource_pool: this master has no pool named 'tpu': pools are default, gpu"
    )


def test_pools_and_labels_decide_where_trials_run(
    pooled: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    d1 = ScriptedAgent(pooled.port, "d1", slots=1)
    d2 = ScriptedAgent(pooled.port, "d2", slots=1, pool="default")
    g1 = ScriptedAgent(pooled.port, "g1", slots=2, pool="gpu", label="a100")
    # Two slots: g1 alone would be the best fit, but it is in another pool.
    wide = _create(api, 2)
    starts = {d1.next("start").start.allocation_id, d2.next("start").start.allocation_id}
    assert len(starts) == 1
    g1.nothing(0.3)
    # A label no agent of the pool has waits, and says why.
    v100 = _create(api, 1, resource_pool="gpu", agent_label="v100")
    why = "pool gpu: needs 1 CPU slot; no CPU agent with label 'v100' is connected"
    eventually(lambda: _trial(api, v100).waiting == why)
    [queued] = api.GetQueue(api_pb2.GetQueueRequest()).trials
    assert (queued.reason, queued.resource_pool) == (why, "gpu")
    # The label the agent has runs there.
    a100 = _create(api, 2, resource_pool="gpu", agent_label="a100")
    assert g1.next("start").start.trial_id == _trial(api, a100).id
    # The default pool is full: a one-slot trial there waits, although gpu has room.
    waits = _create(api, 1)
    g1.nothing(0.3)
    assert _trial(api, waits).state == common_pb2.TRIAL_STATE_QUEUED

    pools = {p.name: p for p in api.ListResourcePools(api_pb2.ListResourcePoolsRequest()).pools}
    assert (pools["default"].default, pools["gpu"].default) == (True, False)
    assert (pools["gpu"].scheduler, pools["gpu"].description) == ("fair_share", "the GPU machines")
    assert sorted(pools["default"].agents) == ["d1", "d2"]
    [slots] = pools["gpu"].slots
    assert (slots.total, slots.used, slots.free) == (2, 2, 0)
    assert (pools["default"].queued_trials, pools["gpu"].queued_trials) == (1, 1)
    agents = {a.id: a for a in api.ListAgents(api_pb2.ListAgentsRequest()).agents}
    assert (agents["g1"].resource_pool, agents["g1"].agent_label) == ("gpu", "a100")
    assert agents["d1"].resource_pool == "default"
    info = api.GetMasterInfo(api_pb2.GetMasterInfoRequest())
    assert (list(info.resource_pools), info.default_resource_pool) == (
        ["default", "gpu"],
        "default",
    )

    for experiment_id in (wide, v100, a100, waits):
        _kill(api, experiment_id)
    for agent in (d1, d2, g1):
        agent.close()


def test_the_queue_shows_each_trial_the_slot_type_of_its_pool(
    pooled: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    cpu = ScriptedAgent(pooled.port, "q-cpu", slots=1)
    gpu = ScriptedAgent(
        pooled.port, "q-gpu", slots=1, pool="gpu", slot_type=common_pb2.SLOT_TYPE_CUDA
    )
    experiments = [_create(api, 2), _create(api, 2, resource_pool="gpu")]  # too wide: queued
    eventually(lambda: len(api.GetQueue(api_pb2.GetQueueRequest()).trials) == 2)
    queued = {q.resource_pool: q.slot_type for q in api.GetQueue(api_pb2.GetQueueRequest()).trials}
    assert queued == {"default": common_pb2.SLOT_TYPE_CPU, "gpu": common_pb2.SLOT_TYPE_CUDA}
    for experiment_id in experiments:
        _kill(api, experiment_id)
    for agent in (cpu, gpu):
        agent.close()


def test_a_drained_agent_takes_no_new_trial_and_shows_draining(
    pooled: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    agent = ScriptedAgent(pooled.port, "drained", slots=2)
    first = _create(api, 1)
    start = agent.next("start").start
    drained = api.SetAgentEnabled(
        api_pb2.SetAgentEnabledRequest(id="drained", enabled=False, drain=True)
    )
    assert (drained.enabled, drained.draining) == (False, True)
    second = _create(api, 1)
    agent.nothing(0.5)  # a free slot, but draining: nothing new
    agent.exited(start.allocation_id, [0])  # the running trial ends on its own
    eventually(lambda: _trial(api, first).state != common_pb2.TRIAL_STATE_RUNNING)
    assert _trial(api, second).state == common_pb2.TRIAL_STATE_QUEUED
    enabled = api.SetAgentEnabled(api_pb2.SetAgentEnabledRequest(id="drained", enabled=True))
    assert (enabled.enabled, enabled.draining) == (True, False)
    agent.next("start")
    for experiment_id in (first, second):
        _kill(api, experiment_id)
    agent.close()


def test_disabling_without_drain_stops_its_trials_at_a_checkpoint_and_they_go_on_elsewhere(
    pooled: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    agent = ScriptedAgent(pooled.port, "leaving", slots=1)
    experiment_id = _create(api, 1)
    start = agent.next("start").start
    other = ScriptedAgent(pooled.port, "staying", slots=1)
    disabled = api.SetAgentEnabled(api_pb2.SetAgentEnabledRequest(id="leaving", enabled=False))
    assert (disabled.enabled, disabled.draining) == (False, False)
    kill = agent.next("kill").kill
    assert (kill.allocation_id, kill.graceful) == (start.allocation_id, True)
    agent.exited(start.allocation_id, [PREEMPTED_EXIT_CODE])  # checkpointed, then exited
    again = other.next("start").start  # requeued: it resumes on the agent still enabled
    assert again.trial_id == start.trial_id
    assert again.allocation_id != start.allocation_id
    agent.nothing(0.3)
    _kill(api, experiment_id)
    api.SetAgentEnabled(api_pb2.SetAgentEnabledRequest(id="leaving", enabled=True))
    for a in (agent, other):
        a.close()


def test_a_restarted_master_re_adopts_a_trial_into_its_agents_pool(tmp_path: Path) -> None:
    config = master_config(
        state_dir=tmp_path / "m", agent_reconnect_wait_s=3.0, resource_pools=POOLS
    )
    first = MasterServer(config)
    first.start()
    agent = ScriptedAgent(first.port, "g9", slots=1, pool="gpu")
    with authed_channel(f"127.0.0.1:{first.port}") as channel:
        experiment_id = _create(api_pb2_grpc.ApiStub(channel), 1, resource_pool="gpu")
    start = agent.next("start").start
    agent.close()
    first.stop(grace=0.1)
    second = MasterServer(config)
    second.start()
    try:
        again = ScriptedAgent(second.port, "g9", slots=1, running=[start.allocation_id], pool="gpu")
        master = second.master
        eventually(lambda: master.scheduler.allocation_of(str(start.trial_id)) is not None)
        assert master.scheduler.pool_of_request(str(start.trial_id)) == "gpu"
        assert master.fleet.pool_of("g9") == "gpu"
        with authed_channel(f"127.0.0.1:{second.port}") as channel:
            api = api_pb2_grpc.ApiStub(channel)
            assert _trial(api, experiment_id).state == common_pb2.TRIAL_STATE_RUNNING
            _kill(api, experiment_id)
        again.close()
    finally:
        second.stop(grace=0.1)
