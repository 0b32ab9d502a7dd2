"""Races and edge cases found in review, each a real master over gRPC on loopback."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from sqlalchemy import text

from assay.master._server import MasterServer
from assay.master.store import WriteBatch
from assay.proto import (
    agent_pb2,
    agent_pb2_grpc,
    api_pb2,
    api_pb2_grpc,
    common_pb2,
)
from tests.credentials import (
    JOIN_METADATA,
    authed_channel,
    master_config,
)
from tests.master.conftest import Process, ScriptedAgent, experiment_yaml, model_archive
from tests.master.test_search import ASHA, SPACE

SINGLE = {"name": "single", "metric": "loss", "max_length": {"batches": 4}}
TERMINAL = {
    common_pb2.EXPERIMENT_STATE_COMPLETED,
    common_pb2.EXPERIMENT_STATE_ERROR,
    common_pb2.EXPERIMENT_STATE_CANCELED,
}


def _create(api: api_pb2_grpc.ApiStub, **overrides: object) -> int:
    request = api_pb2.CreateExperimentRequest(
        config_yaml=experiment_yaml(**overrides), model_definition=model_archive(), activate=True
    )
    eid: int = api.CreateExperiment(request).experiment.id
    return eid


def _state(api: api_pb2_grpc.ApiStub, eid: int) -> api_pb2.GetExperimentResponse:
    response: api_pb2.GetExperimentResponse = api.GetExperiment(
        api_pb2.GetExperimentRequest(id=eid)
    )
    return response


def _action(
    api: api_pb2_grpc.ApiStub, eid: int, kind: api_pb2.ExperimentActionKind.ValueType
) -> None:
    api.ExperimentAction(api_pb2.ExperimentActionRequest(id=eid, action=kind))


def _wait_for(check: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


def test_a_closed_trial_caught_by_a_pause_on_its_way_out_still_completes(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    agent = ScriptedAgent(master.port, "a1", slots=1)
    eid = _create(api, searcher=SINGLE)
    start = agent.next("start").start
    process = Process(master.port, start)
    assert process.next_op().total_batches == 4
    process.validate(4, 0.5)  # the searcher closes the trial: it reached max_length
    _action(api, eid, api_pb2.EXPERIMENT_ACTION_PAUSE)  # ... and a pause lands now
    agent.next("kill")
    assert process.next_op(4).stop
    agent.exited(start.allocation_id, [0])
    assert _wait_for(lambda: _state(api, eid).trials[0].state == common_pb2.TRIAL_STATE_COMPLETED)
    _action(api, eid, api_pb2.EXPERIMENT_ACTION_ACTIVATE)
    assert _wait_for(lambda: _state(api, eid).experiment.state in TERMINAL)
    assert _state(api, eid).experiment.state == common_pb2.EXPERIMENT_STATE_COMPLETED
    process.close()
    agent.close()


def test_a_gangs_surviving_part_keeps_its_slot_until_its_process_exits(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    a1 = ScriptedAgent(master.port, "a1", slots=1)
    a2 = ScriptedAgent(master.port, "a2", slots=1)
    _create(api, resources={"slots_per_trial": 2})
    gang = a1.next("start").start
    assert a2.next("start").start.allocation_id == gang.allocation_id
    waiting = _create(api, resources={"slots_per_trial": 1})  # queued: the cluster is full
    a1.close()  # a1 is lost (after the 1 s window); a2's rank must be killed first
    assert a2.next("kill", timeout=5).kill.allocation_id == gang.allocation_id
    a2.nothing(1.0)  # no new work onto a slot whose process is still being killed
    a2.exited(gang.allocation_id, [-9])
    # Now the slot is free: the waiting trial gets it (the gang no longer fits).
    assert a2.next("start").start.experiment_id == waiting
    a2.close()


def _register(agent_id: str) -> agent_pb2.AgentMessage:
    device = common_pb2.Device(index=0, type=common_pb2.SLOT_TYPE_CPU, name="cpu")
    return agent_pb2.AgentMessage(
        register=agent_pb2.Register(
            agent_id=agent_id,
            slot_type=common_pb2.SLOT_TYPE_CPU,
            devices=[device],
            address="127.0.0.1",
        )
    )


def test_an_agent_that_hangs_up_while_registering_is_not_left_connected(
    master: MasterServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = master.store
    real_apply = store.apply
    gate = threading.Event()

    def slow_apply(batch: WriteBatch) -> None:
        gate.wait(5)
        real_apply(batch)

    monkeypatch.setattr(store, "apply", slow_apply)
    outgoing: queue.Queue[agent_pb2.AgentMessage | None] = queue.Queue()
    outgoing.put(_register("flaky"))

    def requests() -> Iterator[agent_pb2.AgentMessage]:
        while (message := outgoing.get()) is not None:
            yield message

    channel = grpc.insecure_channel(f"127.0.0.1:{master.port}")
    call = agent_pb2_grpc.AgentServiceStub(channel).Connect(requests(), metadata=JOIN_METADATA)
    assert _wait_for(lambda: "flaky" in master.master.agents, timeout=3)
    call.cancel()  # it gives up (a timeout, a restart) before it was answered
    outgoing.put(None)
    time.sleep(0.3)
    gate.set()
    monkeypatch.setattr(store, "apply", real_apply)
    channel.close()
    assert _wait_for(lambda: not master.master.agents["flaky"].connected)
    again = ScriptedAgent(master.port, "flaky", slots=1)  # its reconnect is accepted
    again.close()


def test_an_experiment_stored_without_a_search_state_is_adopted_in_the_store_too(
    tmp_path: Path,
) -> None:
    config = master_config(
        state_dir=tmp_path / "m",
    )
    first = MasterServer(config)
    first.start()
    with authed_channel(f"127.0.0.1:{first.port}") as channel:
        eid = _create(api_pb2_grpc.ApiStub(channel))
    # What a master before searchers left: request id "single-0" and no search state.
    with first.store.write() as s:
        s.execute(text("UPDATE experiments SET searcher_state = NULL WHERE id = :e"), {"e": eid})
        s.execute(
            text("UPDATE trials SET request_id = 'single-0' WHERE experiment_id = :e"), {"e": eid}
        )
    first.stop(grace=0)
    for _ in range(2):  # adopted on the first start; still consistent on the next
        server = MasterServer(config)
        server.start()
        try:
            with server.master.lock:
                trials = server.master.experiments[eid].trials.values()
                memory = {t.id: (t.request_id, t.target) for t in trials}
            stored = {t.id: t.request_id for t in server.store.list_trials(eid)}
        finally:
            server.stop(grace=0)
        assert {i: rid for i, (rid, _) in memory.items()} == stored
        assert all(target == 100 for _, target in memory.values())


def test_log_followers_hold_no_thread(tmp_path: Path) -> None:
    config = master_config(
        state_dir=tmp_path,
        max_rpc_threads=2,
    )
    server = MasterServer(config)
    server.start()
    channel = authed_channel(f"127.0.0.1:{server.port}")
    api = api_pb2_grpc.ApiStub(channel)
    try:
        eid = _create(api)
        trial_id = _state(api, eid).trials[0].id
        follow = api_pb2.StreamTrialLogsRequest(trial_id=trial_id, follow=True)
        streams = [api.StreamTrialLogs(follow) for _ in range(4)]  # twice the pool
        readers = [threading.Thread(target=_drain, args=(s,), daemon=True) for s in streams]
        for reader in readers:
            reader.start()
        time.sleep(0.5)
        assert _state(api, eid).experiment.id == eid  # not starved behind the followers
        for stream in streams:
            stream.cancel()
    finally:
        channel.close()
        server.stop(grace=0)


def _drain(stream: Iterator[common_pb2.LogLine]) -> None:
    try:
        for _ in stream:
            pass
    except grpc.RpcError:
        pass  # cancelled


def test_a_trial_promoted_while_its_process_exits_is_resumed_not_failed(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    agent = ScriptedAgent(master.port, "a1", slots=2)
    eid = _create(api, searcher=dict(ASHA, max_trials=4), hyperparameters=SPACE)
    first, second = agent.next("start").start, agent.next("start").start
    p1, p2 = Process(master.port, first), Process(master.port, second)
    assert p1.next_op().total_batches == 2
    p1.validate(2, 0.1)  # the only result of its rung: not promoted yet
    assert p1.next_op(2).stop  # so its process is told to stop ...
    assert p2.next_op().total_batches == 2
    p2.validate(2, 0.9)  # ... and is promoted by this worse result before it exits
    agent.exited(first.allocation_id, [0])
    resumed = agent.next("start").start
    assert (resumed.trial_id, resumed.run_id) == (first.trial_id, 2)
    assert resumed.checkpoint_uuid  # from its rung's checkpoint
    trial = next(t for t in _state(api, eid).trials if t.id == first.trial_id)
    assert trial.restarts == 0
    p1.close()
    p2.close()
    agent.close()
