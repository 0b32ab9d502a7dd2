"""Sharing a cluster through the API: `SetExperimentResource` (who may, what values, that
it lasts), the queue's positions and reasons, max_slots and the user quota on a master."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from assay.master._server import MasterServer
from assay.proto import api_pb2, api_pb2_grpc, common_pb2
from tests.credentials import authed_channel, login, master_config
from tests.master.conftest import ScriptedAgent, eventually, experiment_yaml, model_archive


def _server(tmp_path: Path, **settings: Any) -> MasterServer:
    config = master_config(
        state_dir=tmp_path / "master",
        heartbeat_interval_s=0.5,
        agent_reconnect_wait_s=1.0,
        **settings,
    )
    server = MasterServer(config)
    server.start()
    return server


@pytest.fixture
def quota_master(tmp_path: Path) -> Iterator[MasterServer]:
    server = _server(tmp_path, user_slot_quota=2)
    yield server
    server.stop(grace=0.5)


def _create(api: api_pb2_grpc.ApiStub, trials: int = 1, **resources: Any) -> int:
    searcher = {
        "name": "random",
        "metric": "loss",
        "max_trials": trials,
        "max_concurrent_trials": trials,
        "max_length": {"batches": 100},
    }
    response: api_pb2.CreateExperimentResponse = api.CreateExperiment(
        api_pb2.CreateExperimentRequest(
            config_yaml=experiment_yaml(
                resources={"slots_per_trial": 1, **resources},
                searcher=searcher,
                hyperparameters={
                    "global_batch_size": 12,
                    "lr": {"type": "double", "minval": 0.01, "maxval": 0.1},
                },
            ),
            model_definition=model_archive(),
            activate=True,
        )
    )
    return response.experiment.id


def _set(api: api_pb2_grpc.ApiStub, eid: int, name: str, value: str) -> Any:
    return api.SetExperimentResource(
        api_pb2.SetExperimentResourceRequest(id=eid, name=name, value=value)
    )


def _queue(api: api_pb2_grpc.ApiStub) -> list[api_pb2.QueuedTrial]:
    return list(api.GetQueue(api_pb2.GetQueueRequest()).trials)


def _code(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details()


def test_set_changes_the_queue_at_once_and_outlives_a_restart(
    tmp_path: Path,
) -> None:
    server = _server(tmp_path)
    api = api_pb2_grpc.ApiStub(authed_channel(f"127.0.0.1:{server.port}"))
    agent = ScriptedAgent(server.port, "a1", slots=1)
    first = _create(api)  # runs on the one slot
    agent.next("start")
    low = _create(api, trials=2, priority=60)
    high = _create(api, trials=1, priority=40)
    queue = _queue(api)
    assert [q.experiment_id for q in queue] == [high, low, low]
    assert [q.position for q in queue] == [1, 2, 3]
    assert {q.wait_kind for q in queue} == {"no_free_slots"}
    assert "needs 1 CPU slot; 0 free" in queue[0].waiting
    experiment = _set(api, low, "priority", "10")
    assert experiment.priority == 10
    assert [q.experiment_id for q in _queue(api)] == [low, low, high]
    _set(api, low, "weight", "2.5")
    _set(api, high, "max-slots", "3")
    agent.close()
    server.stop(grace=0.5)

    server = _server(tmp_path)
    api = api_pb2_grpc.ApiStub(authed_channel(f"127.0.0.1:{server.port}"))
    described = api.GetExperiment(api_pb2.GetExperimentRequest(id=low)).experiment
    assert described.priority == 10
    assert described.config["resources"]["weight"] == 2.5
    high_config = api.GetExperiment(api_pb2.GetExperimentRequest(id=high)).experiment.config
    assert high_config["resources"]["max_slots"] == 3
    queued = [q.experiment_id for q in _queue(api) if q.experiment_id != first]
    assert queued == [low, low, high]
    server.stop(grace=0.5)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("priority", "0", "priority must be an integer in 1..99"),
        ("priority", "high", "priority must be an integer, got 'high'"),
        ("weight", "-1", "weight must be a number from 0.001 to 1e+06, got -1"),
        ("weight", "nan", "weight must be a number from 0.001 to 1e+06"),
        ("weight", "1e308", "weight must be a number from 0.001 to 1e+06, got 1e308"),
        ("max-slots", "0", "max-slots must be an integer of at least 1, got 0"),
        ("max-slots", "1.5", "max-slots must be an integer, got '1.5'"),
        ("slots", "2", "cannot set 'slots': the experiment settings that can change are"),
    ],
)
def test_bad_values_are_refused_with_one_message(
    master: MasterServer, api: api_pb2_grpc.ApiStub, name: str, value: str, message: str
) -> None:
    eid = _create(api)
    code, details = _code(lambda: _set(api, eid, name, value))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert message in details
    config = api.GetExperiment(api_pb2.GetExperimentRequest(id=eid)).experiment.config
    assert "weight" not in config["resources"]  # nothing changed


def test_max_slots_below_slots_per_trial_is_refused(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    eid = _create(api, slots_per_trial=2)
    code, details = _code(lambda: _set(api, eid, "max-slots", "1"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "max-slots must be at least the experiment's slots_per_trial (2)" in details


def test_only_an_editor_of_the_workspace_or_an_admin_may_set(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    address = f"127.0.0.1:{master.port}"
    for user in ("bob", "eve"):
        api.CreateUser(api_pb2.CreateUserRequest(username=user, password=f"{user}-password-123"))
    bob = api_pb2_grpc.ApiStub(authed_channel(address, login(address, "bob", "bob-password-123")))
    eve = api_pb2_grpc.ApiStub(authed_channel(address, login(address, "eve", "eve-password-123")))
    eid = _create(bob)
    # Every user is an editor of the Default workspace; as a viewer eve may not steer.
    api.SetWorkspaceMember(
        api_pb2.SetWorkspaceMemberRequest(workspace="Default", username="eve", role="viewer")
    )
    code, details = _code(lambda: _set(eve, eid, "priority", "1"))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert "eve is a viewer of workspace 'Default'" in details
    assert _set(bob, eid, "priority", "5").priority == 5
    assert _set(api, eid, "priority", "7").priority == 7  # the admin
    code, _ = _code(lambda: _set(api, 9999, "priority", "7"))
    assert code == grpc.StatusCode.NOT_FOUND
    api.ExperimentAction(
        api_pb2.ExperimentActionRequest(id=eid, action=api_pb2.EXPERIMENT_ACTION_KILL)
    )
    ended = (common_pb2.EXPERIMENT_STATE_CANCELED, common_pb2.EXPERIMENT_STATE_ERROR)
    eventually(
        lambda: api.GetExperiment(api_pb2.GetExperimentRequest(id=eid)).experiment.state in ended
    )
    code, details = _code(lambda: _set(api, eid, "priority", "7"))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "only an active or paused experiment's priority can change" in details


def test_the_user_quota_and_max_slots_hold_and_say_so(
    quota_master: MasterServer,
) -> None:
    address = f"127.0.0.1:{quota_master.port}"
    api = api_pb2_grpc.ApiStub(authed_channel(address))
    agents = [ScriptedAgent(quota_master.port, f"a{i}", slots=2) for i in range(3)]
    capped = _create(api, trials=3, max_slots=1)
    other = _create(api, trials=3)

    def running() -> int:
        return 6 - len(_queue(api))

    eventually(lambda: running() == 2)  # the admin's quota of 2, on a cluster of 6
    kinds = {(q.experiment_id, q.wait_kind) for q in _queue(api)}
    assert (capped, "max_slots") in kinds
    assert (other, "quota") in kinds
    quota = next(q for q in _queue(api) if q.wait_kind == "quota")
    assert "user 'admin' holds 2 slots of the user_slot_quota 2" in quota.waiting
    for agent in agents:
        agent.close()


@pytest.mark.parametrize("preemption", [None, False])
def test_a_fair_share_pool_preempts_for_fairness_unless_it_says_not_to(
    tmp_path: Path, preemption: bool | None
) -> None:
    pool: dict[str, Any] = {"name": "shared", "scheduler": "fair_share"}
    if preemption is not None:
        pool["preemption"] = preemption
    server = _server(tmp_path, resource_pools=[pool], default_resource_pool="shared")
    agent = ScriptedAgent(server.port, "a1", slots=2, pool="shared")
    try:
        with authed_channel(f"127.0.0.1:{server.port}") as channel:
            api = api_pb2_grpc.ApiStub(channel)
            first = _create(api, trials=2)
            held = {agent.next("start").start.allocation_id for _ in range(2)}
            second = _create(api, trials=2)  # same weight: one slot each is fair
            if preemption is None:
                kill = agent.next("kill").kill
                assert kill.graceful
                assert kill.allocation_id in held
            else:
                agent.nothing(1.0)  # it waits for a slot to free instead
            for experiment_id in (first, second):
                api.ExperimentAction(
                    api_pb2.ExperimentActionRequest(
                        id=experiment_id, action=api_pb2.EXPERIMENT_ACTION_KILL
                    )
                )
    finally:
        agent.close()
        server.stop(grace=0.5)
