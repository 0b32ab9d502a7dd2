"""A failure that repeats the run before it ends the trial, also across a master restart,
and the agents an `exclude_node` log policy names are avoided by the trial's next runs.

A real master on loopback; scripted agents speak the agent protocol and report each
run's end as the agent daemon does (`AllocationStateChange.failure`)."""

from __future__ import annotations

from pathlib import Path

from assay.master._server import MasterServer
from assay.proto import agent_pb2, api_pb2, api_pb2_grpc, common_pb2
from tests.credentials import authed_channel, master_config
from tests.master.conftest import ScriptedAgent, create_experiment, eventually
from tests.store.conftest import seeded

MISSING = "exited with code 1: FileNotFoundError: [Errno 2] No such file: '/data/train.csv'"


def _trial(api: api_pb2_grpc.ApiStub, eid: int) -> common_pb2.Trial:
    response: api_pb2.GetExperimentResponse = api.GetExperiment(
        api_pb2.GetExperimentRequest(id=eid)
    )
    [trial] = response.trials
    return trial


def _logs(api: api_pb2_grpc.ApiStub, trial_id: int) -> list[str]:
    lines = api.StreamTrialLogs(api_pb2.StreamTrialLogsRequest(trial_id=trial_id))
    return [line.message for line in lines]


def test_the_failure_before_a_master_restart_is_remembered(tmp_path: Path) -> None:
    config = master_config(state_dir=seeded(tmp_path / "master"))
    server = MasterServer(config)
    server.start()
    channel = authed_channel(f"127.0.0.1:{server.port}")
    api = api_pb2_grpc.ApiStub(channel)
    agent = ScriptedAgent(server.port, "a1", slots=1)
    eid = create_experiment(api, max_restarts=5)
    first = agent.next("start").start
    agent.exited(first.allocation_id, [1], "rank 0 exited with code 1", MISSING)
    agent.next("start")  # run 2, which the master will not see end
    agent.close()
    channel.close()
    server.stop(grace=0)

    again = MasterServer(master_config(state_dir=config.state_dir, agent_reconnect_wait_s=0))
    again.start()
    try:
        channel = authed_channel(f"127.0.0.1:{again.port}")
        api = api_pb2_grpc.ApiStub(channel)
        agent = ScriptedAgent(again.port, "a1", slots=1)
        start = agent.next("start").start  # run 2 was lost with its agent: run 3
        agent.exited(start.allocation_id, [1], "rank 0 exited with code 1", MISSING)
        eventually(lambda: _trial(api, eid).state == common_pb2.TRIAL_STATE_ERROR)
        trial = _trial(api, eid)
        assert (trial.run_id, trial.restarts) == (3, 1)
        assert trial.last_error.startswith(
            "run 3 (not restarted: it failed as run 1 did, at batch 0, with no batch or "
            "checkpoint gained since): a1: rank 0 exited with code 1"
        )
        agent.nothing()
        agent.close()
        channel.close()
    finally:
        again.stop(grace=0)


def test_a_failure_unlike_the_one_before_is_restarted(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    agent = ScriptedAgent(master.port, "a1", slots=1)
    eid = create_experiment(api, max_restarts=2)
    for error in (MISSING, "exited with code 1: KeyError: 'label'", ""):
        start = agent.next("start").start
        agent.exited(start.allocation_id, [1], "rank 0 exited with code 1", error)
    eventually(lambda: _trial(api, eid).state == common_pb2.TRIAL_STATE_ERROR)
    trial = _trial(api, eid)
    assert (trial.run_id, trial.restarts) == (3, 2)
    assert trial.last_error == "run 3: a1: rank 0 exited with code 1"
    agent.close()


def test_exclude_node_steers_the_next_run_off_the_agent_that_wrote_the_line(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    first_agent = ScriptedAgent(master.port, "a1", slots=1)
    policies = [{"name": "ecc", "pattern": "uncorrectable ECC", "action": "exclude_node"}]
    eid = create_experiment(api, max_restarts=3, log_policies=policies)
    start = first_agent.next("start").start
    second_agent = ScriptedAgent(master.port, "a2", slots=1)

    def fail(agent: ScriptedAgent, allocation_id: str, line: str) -> None:
        logs = agent_pb2.LogBatch(
            allocation_id=allocation_id, lines=[common_pb2.LogLine(message=line, rank=0)]
        )
        agent.send(agent_pb2.AgentMessage(logs=logs))
        agent.exited(allocation_id, [1], "rank 0 exited with code 1")

    fail(first_agent, start.allocation_id, "NVRM: Xid 48: uncorrectable ECC error")
    moved = second_agent.next("start").start
    assert moved.run_id == 2
    notes = [m for m in _logs(api, moved.trial_id) if "exclude_node" in m]
    assert notes == [
        "assay: run 1: log_policies[0] ('ecc') matched a line from a1: NVRM: Xid 48: "
        "uncorrectable ECC error (exclude_node): the trial's runs avoid a1"
    ]
    # A failure without the line: the next run stays off a1 still.
    fail(second_agent, moved.allocation_id, "RuntimeError: something else")
    third = second_agent.next("start").start
    assert third.run_id == 3
    first_agent.nothing()
    # With every agent excluded, the trial waits and says why.
    fail(second_agent, third.allocation_id, "NVRM: Xid 79: uncorrectable ECC error")
    said = (
        "needs 1 CPU slot; its log_policies exclude every agent that could run it (a1, a2): "
        "add an agent, or kill the trial"
    )
    eventually(lambda: _trial(api, eid).waiting == said)
    assert _trial(api, eid).state == common_pb2.TRIAL_STATE_QUEUED
    first_agent.nothing()
    second_agent.nothing()
    first_agent.close()
    second_agent.close()
