"""The master over real gRPC: experiments, gang scheduling onto agents, runs and restarts."""

from __future__ import annotations

import contextlib
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from assay.master._interpreter import RENDEZVOUS_PORTS
from assay.master._server import MasterServer
from assay.proto import agent_pb2, api_pb2, api_pb2_grpc, common_pb2, trial_pb2, trial_pb2_grpc
from tests.credentials import authed_channel, master_config
from tests.master.conftest import ScriptedAgent, eventually, experiment_yaml, model_archive


def _create(api: api_pb2_grpc.ApiStub, *, activate: bool = True, **overrides: object) -> int:
    response: api_pb2.CreateExperimentResponse = api.CreateExperiment(
        api_pb2.CreateExperimentRequest(
            config_yaml=experiment_yaml(**overrides),
            model_definition=model_archive(),
            activate=activate,
        )
    )
    return int(response.experiment.id)


def _experiment(api: api_pb2_grpc.ApiStub, eid: int) -> api_pb2.GetExperimentResponse:
    response: api_pb2.GetExperimentResponse = api.GetExperiment(
        api_pb2.GetExperimentRequest(id=eid)
    )
    return response


def test_bad_experiments_are_refused_with_what_to_fix(api: api_pb2_grpc.ApiStub) -> None:
    cases = [
        (
            experiment_yaml(searcher={"name": "single"}),
            model_archive(),
            "searcher.metric: is required",
        ),
        (experiment_yaml(), b"not a tarball", "not a valid .tar.gz archive"),
        (
            experiment_yaml(
                searcher={"name": "single", "metric": "loss", "max_length": {"epochs": 2}}
            ),
            model_archive(),
            "needs records_per_epoch",
        ),
        ("{unclosed", model_archive(), "not valid YAML"),
        # Over 1 MiB: checked on the thread pool rather than the event loop.
        (experiment_yaml(), b"\x1f\x8b" + b"x" * 2**21, "not a valid .tar.gz archive"),
    ]
    for text, archive, expected in cases:
        with pytest.raises(grpc.RpcError) as info:
            api.CreateExperiment(
                api_pb2.CreateExperimentRequest(config_yaml=text, model_definition=archive)
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert expected in (info.value.details() or "")
    escaping = model_archive({"../evil.py": "x"})
    with pytest.raises(grpc.RpcError, match="would be written outside the model"):
        api.CreateExperiment(
            api_pb2.CreateExperimentRequest(
                config_yaml=experiment_yaml(), model_definition=escaping
            )
        )
    assert api.ListExperiments(api_pb2.ListExperimentsRequest()).total == 0


def test_a_trial_is_gang_scheduled_and_completes(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    agent = ScriptedAgent(master.port, "a1", slots=2)
    eid = _create(api, resources={"slots_per_trial": 2})
    start = agent.next("start").start
    assert list(start.slots) == [0, 1]
    assert list(start.ranks) == [0, 1]
    assert start.world_size == 2
    assert start.master_addr == "127.0.0.1"
    assert start.hparams_json
    assert start.token
    assert start.trial_api
    [trial] = _experiment(api, eid).trials
    assert trial.state == common_pb2.TRIAL_STATE_RUNNING

    # The harness's side, with the allocation's token.
    channel = grpc.insecure_channel(start.trial_api)
    trials = trial_pb2_grpc.TrialServiceStub(channel)
    meta = (("x-assay-token", start.token),)
    op = trials.NextOperation(
        trial_pb2.NextOperationRequest(trial_id=trial.id, run_id=start.run_id), metadata=meta
    )
    assert op.total_batches == 100
    stored = trials.ReportMetrics(
        trial_pb2.ReportMetricsRequest(
            trial_id=trial.id,
            run_id=start.run_id,
            group="validation",
            reports=[common_pb2.MetricsReport(total_batches=100, metrics={"loss": 0.5})],
        ),
        metadata=meta,
    )
    assert stored.stored == 1
    with pytest.raises(grpc.RpcError) as info:
        trials.NextOperation(
            trial_pb2.NextOperationRequest(trial_id=trial.id, run_id=start.run_id),
            metadata=(("x-assay-token", "forged"),),
        )
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    trials.CompleteOperation(
        trial_pb2.CompleteOperationRequest(
            trial_id=trial.id, run_id=start.run_id, total_batches=100, searcher_metric=0.5
        ),
        metadata=meta,
    )
    stop = trials.NextOperation(
        trial_pb2.NextOperationRequest(trial_id=trial.id, run_id=start.run_id, total_batches=100),
        metadata=meta,
    )
    assert stop.stop
    agent.exited(start.allocation_id, [0, 0])
    eventually(
        lambda: _experiment(api, eid).experiment.state == common_pb2.EXPERIMENT_STATE_COMPLETED
    )
    done = _experiment(api, eid)
    assert done.trials[0].state == common_pb2.TRIAL_STATE_COMPLETED
    assert done.trials[0].best_validation == 0.5
    assert done.experiment.progress == 1.0
    info_ = api.GetMasterInfo(api_pb2.GetMasterInfoRequest())
    assert (info_.agents, info_.slots, info_.free_slots) == (1, 2, 2)
    channel.close()
    agent.close()


def test_what_does_not_fit_waits_for_free_slots(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    agent = ScriptedAgent(master.port, "a1", slots=2)
    first = _create(api, resources={"slots_per_trial": 2})
    start = agent.next("start").start
    second = _create(api, resources={"slots_per_trial": 1})
    agent.nothing()
    assert api.GetMasterInfo(api_pb2.GetMasterInfoRequest()).queued_trials == 1
    agent.exited(start.allocation_id, [1, 1])  # a failure
    # The failed trial is retried (max_restarts 1) but the waiting one goes first.
    nxt = agent.next("start").start
    assert nxt.experiment_id == second
    assert list(nxt.slots) == [0]
    del first
    agent.close()


def test_trials_span_agents_with_equal_slots(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    a1 = ScriptedAgent(master.port, "a1", slots=2)
    a2 = ScriptedAgent(master.port, "a2", slots=2)
    _create(api, resources={"slots_per_trial": 4})
    s1, s2 = a1.next("start").start, a2.next("start").start
    assert (list(s1.ranks), list(s2.ranks)) == ([0, 1], [2, 3])
    assert s1.world_size == s2.world_size == 4
    assert s1.master_port == s2.master_port
    assert s1.master_port in RENDEZVOUS_PORTS  # below the ephemeral ports
    assert s1.allocation_id == s2.allocation_id
    agents = api.ListAgents(api_pb2.ListAgentsRequest()).agents
    assert [sum(1 for s in a.slots if s.trial_id) for a in agents] == [2, 2]
    a1.close()
    a2.close()


def test_failures_restart_up_to_max_restarts_then_error(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    agent = ScriptedAgent(master.port, "a1", slots=1)
    eid = _create(api, max_restarts=1)
    first = agent.next("start").start
    agent.exited(first.allocation_id, [1], "Traceback ... ValueError: boom")
    second = agent.next("start").start
    assert second.run_id == first.run_id + 1
    agent.exited(second.allocation_id, [1])
    eventually(lambda: _experiment(api, eid).experiment.state == common_pb2.EXPERIMENT_STATE_ERROR)
    [trial] = _experiment(api, eid).trials
    assert (trial.state, trial.restarts) == (common_pb2.TRIAL_STATE_ERROR, 1)
    assert trial.last_error == "run 2: exit codes [1]"  # the cause, for describe
    agent.close()


def test_an_experiment_whose_every_trial_was_killed_ends_canceled(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    # As in Determined: the user stopped the search trial by trial; nothing failed.
    agent = ScriptedAgent(master.port, "a1", slots=1)
    eid = _create(api)
    start = agent.next("start").start
    killed = api.KillTrial(api_pb2.KillTrialRequest(id=start.trial_id))
    assert killed.state == common_pb2.TRIAL_STATE_STOPPING
    assert agent.next("kill").kill.allocation_id == start.allocation_id
    agent.exited(start.allocation_id, [-9])
    eventually(
        lambda: _experiment(api, eid).experiment.state == common_pb2.EXPERIMENT_STATE_CANCELED
    )
    [trial] = _experiment(api, eid).trials
    assert trial.state == common_pb2.TRIAL_STATE_CANCELED
    agent.close()


def test_actions_follow_the_state_table(master: MasterServer, api: api_pb2_grpc.ApiStub) -> None:
    agent = ScriptedAgent(master.port, "a1", slots=1)
    eid = _create(api)
    start = agent.next("start").start

    def act(kind: api_pb2.ExperimentActionKind.ValueType) -> common_pb2.Experiment:
        result: common_pb2.Experiment = api.ExperimentAction(
            api_pb2.ExperimentActionRequest(id=eid, action=kind)
        )
        return result

    with pytest.raises(grpc.RpcError, match="cannot activate experiment .*: it is ACTIVE"):
        act(api_pb2.EXPERIMENT_ACTION_ACTIVATE)
    assert act(api_pb2.EXPERIMENT_ACTION_PAUSE).state == common_pb2.EXPERIMENT_STATE_PAUSED
    kill = agent.next("kill").kill
    assert (kill.allocation_id, kill.graceful) == (start.allocation_id, True)
    agent.exited(start.allocation_id, [-15])
    eventually(lambda: _experiment(api, eid).trials[0].state == common_pb2.TRIAL_STATE_PAUSED)
    act(api_pb2.EXPERIMENT_ACTION_ACTIVATE)
    again = agent.next("start").start
    assert again.run_id == start.run_id + 1
    act(api_pb2.EXPERIMENT_ACTION_KILL)
    assert agent.next("kill").kill.graceful is False
    agent.exited(again.allocation_id, [-9])
    eventually(
        lambda: _experiment(api, eid).experiment.state == common_pb2.EXPERIMENT_STATE_CANCELED
    )
    act(api_pb2.EXPERIMENT_ACTION_ARCHIVE)
    assert _experiment(api, eid).experiment.archived
    agent.close()


def test_losing_an_agent_requeues_its_trial_without_a_restart(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    a1 = ScriptedAgent(master.port, "a1", slots=1)
    eid = _create(api)
    a1.next("start")
    a2 = ScriptedAgent(master.port, "a2", slots=1)
    a1.close()
    # Within the window (1 s here) the trial keeps its slot and nothing moves.
    assert _experiment(api, eid).trials[0].state == common_pb2.TRIAL_STATE_RUNNING
    a2.nothing(0.5)
    # After it, the trial runs elsewhere, without counting a restart.
    a2.next("start", timeout=5)
    assert _experiment(api, eid).trials[0].restarts == 0
    a2.close()


def test_an_agent_back_within_the_window_keeps_its_running_trial(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    a1 = ScriptedAgent(master.port, "a1", slots=1)
    eid = _create(api)
    start = a1.next("start").start
    a1.close()  # the network drops; the trial goes on running on the agent
    again = ScriptedAgent(master.port, "a1", slots=1, running=[start.allocation_id])
    again.nothing(2.0)  # past the window: no kill, no new start
    [trial] = _experiment(api, eid).trials
    assert (trial.state, trial.run_id, trial.restarts) == (common_pb2.TRIAL_STATE_RUNNING, 1, 0)
    again.exited(start.allocation_id, [1])  # its later report still counts
    assert again.next("start").start.run_id == 2
    again.close()


def test_an_agent_back_without_the_trial_gets_it_requeued(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    a1 = ScriptedAgent(master.port, "a1", slots=1)
    eid = _create(api)
    first = a1.next("start").start
    a1.close()
    again = ScriptedAgent(master.port, "a1", slots=1, running=["someone-elses"])
    assert again.next("kill").kill.allocation_id == "someone-elses"
    restarted = again.next("start").start  # the agent lost it: run it again, no restart
    assert restarted.run_id == first.run_id + 1
    assert _experiment(api, eid).trials[0].restarts == 0
    again.close()


@contextlib.contextmanager
def _short_silence(tmp_path: Path) -> Iterator[tuple[MasterServer, api_pb2_grpc.ApiStub]]:
    """A master that gives up on an agent silent for 0.6 s (3 heartbeats of 0.2 s)."""
    config = master_config(
        state_dir=tmp_path,
        heartbeat_interval_s=0.2,
        agent_reconnect_wait_s=0.5,
    )
    server = MasterServer(config)
    server.start()
    try:
        with authed_channel(f"127.0.0.1:{server.port}") as channel:
            yield server, api_pb2_grpc.ApiStub(channel)
    finally:
        server.stop(grace=0)


def test_a_silent_agent_is_given_up_after_the_window(tmp_path: Path) -> None:
    with _short_silence(tmp_path) as (server, api):
        mute = ScriptedAgent(server.port, "mute", slots=1)
        mute.closed.set()  # stops its heartbeats, keeps its stream open
        eid = _create(api)
        mute.next("start")
        eventually(lambda: _experiment(api, eid).trials[0].state == common_pb2.TRIAL_STATE_QUEUED)
        assert api.GetMasterInfo(api_pb2.GetMasterInfoRequest()).agents == 0
        mute.close()


def test_an_agent_whose_heartbeats_wait_behind_its_logs_is_not_lost(tmp_path: Path) -> None:
    """A trial printing a flood of lines keeps the master storing log batches while the
    agent's heartbeats queue behind them: each batch shows the agent alive."""
    with _short_silence(tmp_path) as (server, api):
        busy = ScriptedAgent(server.port, "busy", slots=1)
        busy.closed.set()  # no heartbeats: only its log batches arrive
        eid = _create(api)
        start = busy.next("start").start
        line = common_pb2.LogLine(stream="stdout", message="x" * 200)
        for _ in range(15):  # 3 s: five times the silence window
            batch = agent_pb2.LogBatch(allocation_id=start.allocation_id, lines=[line] * 50)
            busy.send(agent_pb2.AgentMessage(logs=batch))
            busy.nothing(0.2)
        assert api.GetMasterInfo(api_pb2.GetMasterInfoRequest()).agents == 1
        assert _experiment(api, eid).trials[0].state == common_pb2.TRIAL_STATE_RUNNING
        busy.close()


# --- found in review: races around stops, gangs and restarts --------------------------------


def test_activate_while_a_pause_is_landing_runs_the_trial_again(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    agent = ScriptedAgent(master.port, "a1", slots=1)
    eid = _create(api)
    first = agent.next("start").start
    for kind in (api_pb2.EXPERIMENT_ACTION_PAUSE, api_pb2.EXPERIMENT_ACTION_ACTIVATE):
        api.ExperimentAction(api_pb2.ExperimentActionRequest(id=eid, action=kind))
    assert agent.next("kill").kill.graceful
    agent.exited(first.allocation_id, [-15])
    again = agent.next("start").start  # not stuck PAUSED under an ACTIVE experiment
    assert again.run_id == first.run_id + 1
    assert _experiment(api, eid).trials[0].restarts == 0
    agent.close()


def test_one_failed_part_of_a_gang_stops_the_others(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    a1 = ScriptedAgent(master.port, "a1", slots=2)
    a2 = ScriptedAgent(master.port, "a2", slots=2)
    _create(api, resources={"slots_per_trial": 4})
    s1, _ = a1.next("start").start, a2.next("start").start
    a1.exited(s1.allocation_id, [1, -9])
    kill = a2.next("kill").kill
    assert kill.allocation_id == s1.allocation_id
    a1.nothing()  # a1 already reported its part gone
    a1.close()
    a2.close()


def test_a_lost_agent_frees_the_gang_only_when_the_rest_is_gone(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    a1 = ScriptedAgent(master.port, "a1", slots=2)
    a2 = ScriptedAgent(master.port, "a2", slots=2)
    a3 = ScriptedAgent(master.port, "a3", slots=2)
    _create(api, resources={"slots_per_trial": 4})
    starts = {}
    for agent in (a1, a2, a3):
        with contextlib.suppress(queue.Empty):  # the agent left out of the gang gets nothing
            starts[agent.id] = agent.next("start", timeout=2).start
    assert len(starts) == 2
    lost, survivor = (a for a in (a1, a2, a3) if a.id in starts)
    spare = next(a for a in (a1, a2, a3) if a.id not in starts)
    lost.close()
    assert survivor.next("kill").kill.allocation_id == starts[survivor.id].allocation_id
    spare.nothing(1.0)  # no new run while the survivor's processes may still hold slots
    survivor.exited(starts[survivor.id].allocation_id, [-9, -9])
    restarted = [survivor.next("start").start, spare.next("start").start]
    assert {s.run_id for s in restarted} == {starts[survivor.id].run_id + 1}
    survivor.close()
    spare.close()


@pytest.mark.parametrize("agent_returns", [True, False])
def test_a_master_restart_finishes_a_kill_that_was_under_way(
    tmp_path: Path, agent_returns: bool
) -> None:
    config = master_config(
        state_dir=tmp_path / "m",
        agent_reconnect_wait_s=1.0,
    )
    first = MasterServer(config)
    first.start()
    agent = ScriptedAgent(first.port, "a1", slots=1)
    channel = authed_channel(f"127.0.0.1:{first.port}")
    api = api_pb2_grpc.ApiStub(channel)
    eid = _create(api)
    start = agent.next("start").start
    api.ExperimentAction(
        api_pb2.ExperimentActionRequest(id=eid, action=api_pb2.EXPERIMENT_ACTION_KILL)
    )
    channel.close()
    agent.close()
    first.stop(grace=0.1)  # the kill never landed
    second = MasterServer(config)
    second.start()
    channel = authed_channel(f"127.0.0.1:{second.port}")
    api = api_pb2_grpc.ApiStub(channel)
    if agent_returns:  # the trial is still running there: the kill is sent again
        agent = ScriptedAgent(second.port, "a1", slots=1, running=[start.allocation_id])
        kill = agent.next("kill").kill
        assert (kill.allocation_id, kill.graceful) == (start.allocation_id, False)
        agent.exited(start.allocation_id, [-9])
    eventually(
        lambda: _experiment(api, eid).experiment.state == common_pb2.EXPERIMENT_STATE_CANCELED
    )
    assert _experiment(api, eid).trials[0].state == common_pb2.TRIAL_STATE_CANCELED
    if agent_returns:
        agent.close()
    channel.close()
    second.stop(grace=0.1)


@pytest.mark.parametrize("paused", [False, True])
@pytest.mark.parametrize("agent_returns", [True, False])
def test_a_master_restart_finishes_a_trial_kill_that_was_under_way(
    tmp_path: Path, paused: bool, agent_returns: bool
) -> None:
    # The kill of one trial is not the experiment's: the restarted master learns it from
    # the store, not from the experiment's state (which says preempt, or pause).
    config = master_config(state_dir=tmp_path / "m", agent_reconnect_wait_s=1.0)
    first = MasterServer(config)
    first.start()
    agent = ScriptedAgent(first.port, "a1", slots=1)
    channel = authed_channel(f"127.0.0.1:{first.port}")
    api = api_pb2_grpc.ApiStub(channel)
    eid = _create(api)
    start = agent.next("start").start
    if paused:  # the pause is landing (a graceful kill) when the user kills the trial
        api.ExperimentAction(
            api_pb2.ExperimentActionRequest(id=eid, action=api_pb2.EXPERIMENT_ACTION_PAUSE)
        )
        assert agent.next("kill").kill.graceful
    killed = api.KillTrial(api_pb2.KillTrialRequest(id=start.trial_id))
    assert killed.state == common_pb2.TRIAL_STATE_STOPPING
    assert not agent.next("kill").kill.graceful
    channel.close()
    agent.close()
    first.stop(grace=0.1)  # the kill never landed
    second = MasterServer(config)
    second.start()
    channel = authed_channel(f"127.0.0.1:{second.port}")
    api = api_pb2_grpc.ApiStub(channel)
    if agent_returns:  # the trial is still running there: killed again, not checkpointed
        agent = ScriptedAgent(second.port, "a1", slots=1, running=[start.allocation_id])
        kill = agent.next("kill").kill
        assert (kill.allocation_id, kill.graceful) == (start.allocation_id, False)
        agent.exited(start.allocation_id, [-9])
    eventually(lambda: _experiment(api, eid).trials[0].state == common_pb2.TRIAL_STATE_CANCELED)
    [trial] = _experiment(api, eid).trials
    assert (trial.run_id, trial.restarts) == (1, 0)  # not requeued
    if paused:
        assert _experiment(api, eid).experiment.state == common_pb2.EXPERIMENT_STATE_PAUSED
    if agent_returns:
        agent.nothing(1.0)  # no new run
        agent.close()
    channel.close()
    second.stop(grace=0.1)


def test_a_restarted_master_re_adopts_a_running_trial(tmp_path: Path) -> None:
    config = master_config(
        state_dir=tmp_path / "m",
        agent_reconnect_wait_s=2.0,
    )
    first = MasterServer(config)
    first.start()
    agent = ScriptedAgent(first.port, "a1", slots=1)
    with authed_channel(f"127.0.0.1:{first.port}") as channel:
        eid = _create(api_pb2_grpc.ApiStub(channel))
    start = agent.next("start").start
    agent.close()
    first.stop(grace=0.1)  # as a kill -9 would: the trial goes on running

    second = MasterServer(config)
    second.start()
    try:
        agent = ScriptedAgent(second.port, "a1", slots=1, running=[start.allocation_id])
        agent.nothing(2.5)  # past the window: neither killed nor started again
        with authed_channel(f"127.0.0.1:{second.port}") as channel:
            api = api_pb2_grpc.ApiStub(channel)
            trials = trial_pb2_grpc.TrialServiceStub(channel)
            meta = (("x-assay-token", start.token),)  # the old token still works
            ids: dict[str, Any] = {"trial_id": start.trial_id, "run_id": start.run_id}
            op = trials.NextOperation(trial_pb2.NextOperationRequest(**ids), metadata=meta)
            assert op.total_batches == 100
            trials.CompleteOperation(
                trial_pb2.CompleteOperationRequest(total_batches=100, searcher_metric=0.5, **ids),
                metadata=meta,
            )
            agent.exited(start.allocation_id, [0])
            eventually(
                lambda: (
                    _experiment(api, eid).experiment.state == common_pb2.EXPERIMENT_STATE_COMPLETED
                )
            )
            [trial] = _experiment(api, eid).trials
            assert (trial.run_id, trial.restarts) == (1, 0)
            info = api.GetMasterInfo(api_pb2.GetMasterInfoRequest())
            assert (info.slots, info.free_slots) == (1, 1)
        agent.close()
    finally:
        second.stop(grace=0.1)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--db-url", "bogus://x"], "is not a database URL Assay can use"),
        (["--db-url", "sqlite:////nonexistent/dir/x.db"], "cannot open the store at"),
        (["--db-url", "postgresql+psycopg://postgres@127.0.0.1:1/x"], "cannot open the store at"),
        (["--grpc-port", "PORT_IN_USE"], "cannot listen on"),
    ],
)
def test_bad_start_up_settings_are_one_clear_error(
    tmp_path: Path, args: list[str], expected: str
) -> None:
    import socket
    import subprocess
    import sys

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        args = [port if a == "PORT_IN_USE" else a for a in args]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "assay.master.main",
                "--host",
                "127.0.0.1",
                "--state-dir",
                str(tmp_path),
                "--http-port",
                "0",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 1
    assert expected in done.stderr
    assert "Traceback" not in done.stderr


def test_a_higher_priority_experiment_preempts_a_lower_one(tmp_path: Path) -> None:
    config = master_config(
        state_dir=tmp_path,
        heartbeat_interval_s=0.5,
        preemption=True,
    )
    server = MasterServer(config)
    server.start()
    try:
        with authed_channel(f"127.0.0.1:{server.port}") as channel:
            api = api_pb2_grpc.ApiStub(channel)
            agent = ScriptedAgent(server.port, "a1", slots=1)
            low = _create(api, resources={"priority": 60})
            low_start = agent.next("start").start
            same = _create(api, resources={"priority": 60})
            agent.nothing()  # equal priority never preempts: it waits
            high = _create(api, resources={"priority": 10})
            kill = agent.next("kill").kill
            assert (kill.allocation_id, kill.graceful) == (low_start.allocation_id, True)
            [trial] = _experiment(api, low).trials
            assert trial.state == common_pb2.TRIAL_STATE_STOPPING
            agent.exited(low_start.allocation_id, [0])  # checkpointed and stopped
            high_start = agent.next("start").start
            assert high_start.experiment_id == high
            agent.exited(high_start.allocation_id, [1])  # (max_restarts 1: it runs again)
            again = agent.next("start").start
            assert again.experiment_id == high
            agent.exited(again.allocation_id, [1])
            resumed = agent.next("start").start  # the preempted one goes before `same`
            assert (resumed.experiment_id, resumed.run_id) == (low, low_start.run_id + 1)
            assert _experiment(api, low).trials[0].restarts == 0
            del same
            agent.close()
    finally:
        server.stop(grace=0)


def test_user_code_that_exits_0_early_counts_as_a_failure_and_80_does_not(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    agent = ScriptedAgent(master.port, "a1", slots=1)
    eid = _create(api, max_restarts=1)
    first = agent.next("start").start
    agent.exited(first.allocation_id, [80])  # stopped at a checkpoint when asked to
    second = agent.next("start").start
    assert _experiment(api, eid).trials[0].restarts == 0
    agent.exited(second.allocation_id, [0])  # returned early, target not reached
    third = agent.next("start").start
    [trial] = _experiment(api, eid).trials
    assert trial.restarts == 1
    assert "exited 0 before training to batch 100" in trial.last_error
    del third
    agent.close()


def test_an_agent_cannot_end_or_write_into_another_agents_run(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    a1 = ScriptedAgent(master.port, "a1", slots=1)
    eid = _create(api)
    start = a1.next("start").start
    intruder = ScriptedAgent(master.port, "intruder", slots=1)  # holds the join token too
    try:
        intruder.send(
            agent_pb2.AgentMessage(
                logs=agent_pb2.LogBatch(
                    allocation_id=start.allocation_id,
                    lines=[common_pb2.LogLine(message="FORGED: your run is done")],
                )
            )
        )
        intruder.exited(start.allocation_id, [1], "forged exit")
        intruder.nothing()
        [trial] = _experiment(api, eid).trials
        assert trial.state == common_pb2.TRIAL_STATE_RUNNING  # untouched
        assert trial.run_id == 1
        a1.nothing()  # no kill came to the real agent
        lines = api.StreamTrialLogs(api_pb2.StreamTrialLogsRequest(trial_id=trial.id))
        assert not any("FORGED" in line.message for line in lines)
    finally:
        intruder.close()
        a1.close()
