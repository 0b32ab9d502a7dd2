"""Searchers wired into the master: trials pause at rungs, promotions resume from checkpoints.

A scripted agent stands in for the agent daemon and plays each trial's process: it asks
the master what to train to, reports a validation metric and a checkpoint at each target,
completes the operation, and exits 0 when told to stop (all over real gRPC).
"""

from __future__ import annotations

import json
import math
import queue
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from assay.errors import INVALID_HP_EXIT_CODE
from assay.master._server import MasterServer
from assay.proto import agent_pb2, api_pb2, api_pb2_grpc, common_pb2
from tests.credentials import authed_channel, master_config
from tests.master.conftest import Process, ScriptedAgent, experiment_yaml, model_archive

ASHA = {
    "name": "asha",
    "metric": "loss",
    "max_length": {"batches": 8},
    "divisor": 2,
    "num_rungs": 3,
    "max_trials": 8,
    "max_concurrent_trials": 2,
}
SPACE = {"global_batch_size": 8, "lr": {"type": "double", "minval": 0.0, "maxval": 1.0}}


def loss(hparams: dict[str, Any], batches: int, trial_id: int) -> float:
    """Lower lr is better; longer training helps everyone."""
    return float(hparams["lr"]) + 1.0 / batches


def older_is_better(hparams: dict[str, Any], batches: int, trial_id: int) -> float:
    """Each new trial is worse than the ones before: paused trials get promoted later."""
    return trial_id + 1.0 / batches


class Harness:
    """Plays the trial processes of every allocation an agent is given."""

    def __init__(self, agent: ScriptedAgent, port: int, metric: Callable[..., float] = loss):
        self.agent = agent
        self.port = port
        self.metric = metric
        self.checkpoints: dict[str, int] = {}  # uuid -> batches
        self.starts: list[agent_pb2.StartAllocation] = []
        self.invalid: set[float] = set()  # lr values whose trials raise InvalidHP

    def run_one(self, timeout: float = 10.0) -> agent_pb2.StartAllocation:
        start = self.agent.next("start", timeout=timeout).start
        self.starts.append(start)
        hparams = json.loads(start.hparams_json)
        if hparams["lr"] in self.invalid:
            self.agent.exited(start.allocation_id, [INVALID_HP_EXIT_CODE])
            return start
        process = Process(self.port, start)
        total = self.checkpoints[start.checkpoint_uuid] if start.checkpoint_uuid else 0
        while True:
            op = process.next_op(total)
            if op.stop:
                break
            assert op.total_batches > total or op.total_batches == total
            total = op.total_batches
            value = self.metric(hparams, total, start.trial_id)
            self.checkpoints[process.report(total, value)] = total
            process.complete(total, value)
            process.complete(total, value)  # a retry changes nothing
        process.close()
        self.agent.exited(start.allocation_id, [0])
        return start

    def run_until(self, done: Callable[[], bool], limit: int = 100) -> None:
        for _ in range(limit):
            if done():
                return
            try:
                self.run_one(timeout=2.0)
            except Exception:
                if done():
                    return
                raise
        raise AssertionError(f"not done after {limit} allocations")


def _create(api: api_pb2_grpc.ApiStub, searcher: dict[str, Any], **overrides: Any) -> int:
    request = api_pb2.CreateExperimentRequest(
        config_yaml=experiment_yaml(searcher=searcher, hyperparameters=SPACE, **overrides),
        model_definition=model_archive(),
        activate=True,
    )
    eid: int = api.CreateExperiment(request).experiment.id
    return eid


def _state(api: api_pb2_grpc.ApiStub, eid: int) -> api_pb2.GetExperimentResponse:
    response: api_pb2.GetExperimentResponse = api.GetExperiment(
        api_pb2.GetExperimentRequest(id=eid)
    )
    return response


def _ended(api: api_pb2_grpc.ApiStub, eid: int) -> Callable[[], bool]:
    terminal = {
        common_pb2.EXPERIMENT_STATE_COMPLETED,
        common_pb2.EXPERIMENT_STATE_ERROR,
        common_pb2.EXPERIMENT_STATE_CANCELED,
    }
    return lambda: _state(api, eid).experiment.state in terminal


def _validations(api: api_pb2_grpc.ApiStub, trial_id: int) -> list[int]:
    reply = api.GetTrialMetrics(api_pb2.GetTrialMetricsRequest(id=trial_id, group="validation"))
    return [row.total_batches for row in reply.reports]


def test_asha_pauses_trials_at_rungs_and_resumes_promotions_from_checkpoints(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    agent = ScriptedAgent(master.port, "a1", slots=2)
    harness = Harness(agent, master.port, metric=older_is_better)
    eid = _create(api, ASHA)
    harness.run_until(_ended(api, eid))

    done = _state(api, eid)
    assert done.experiment.state == common_pb2.EXPERIMENT_STATE_COMPLETED
    assert done.experiment.progress == 1.0
    trials = done.trials
    assert len(trials) == 8
    assert {t.state for t in trials} == {common_pb2.TRIAL_STATE_COMPLETED}
    lengths = sorted(t.total_batches for t in trials)
    # Rungs at 2, 4 and 8 batches. Asynchronous ASHA promotes whoever is in the top half
    # of a rung so far, so how many climb depends on the order results arrive in.
    assert set(lengths) <= {2, 4, 8}
    assert lengths[0] == 2
    assert lengths[-1] == 8
    for t in trials:
        rows = _validations(api, t.id)
        assert rows == [r for r in (2, 4, 8) if r <= t.total_batches]  # each rung once
        assert t.restarts == 0
    promoted = [t for t in trials if t.total_batches > 2]
    resumed = [s for s in harness.starts if s.checkpoint_uuid]
    assert promoted
    assert resumed  # a promotion after a pause starts from the trial's checkpoint
    for start in resumed:
        assert harness.checkpoints[start.checkpoint_uuid] in (2, 4)
    best = min(trials, key=lambda t: t.best_validation)
    assert best.total_batches == 8
    agent.close()


def test_invalid_hyperparameters_are_replaced_without_counting(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    agent = ScriptedAgent(master.port, "a1", slots=1)
    harness = Harness(agent, master.port)
    random_search = {
        "name": "random",
        "metric": "loss",
        "max_length": {"batches": 4},
        "max_trials": 3,
        "max_concurrent_trials": 1,
    }
    eid = _create(api, random_search)
    first = harness.agent.next("start").start
    harness.invalid.add(json.loads(first.hparams_json)["lr"])
    agent.exited(first.allocation_id, [INVALID_HP_EXIT_CODE])
    harness.run_until(_ended(api, eid))

    trials = _state(api, eid).trials
    states = sorted(common_pb2.TrialState.Name(t.state) for t in trials)
    assert states == ["TRIAL_STATE_CANCELED"] + ["TRIAL_STATE_COMPLETED"] * 3
    assert all(t.restarts == 0 for t in trials)
    assert _state(api, eid).experiment.state == common_pb2.EXPERIMENT_STATE_COMPLETED
    agent.close()


def test_grid_runs_every_point_once(master: MasterServer, api: api_pb2_grpc.ApiStub) -> None:
    agent = ScriptedAgent(master.port, "a1", slots=2)
    harness = Harness(agent, master.port)
    grid = {"name": "grid", "metric": "loss", "max_length": {"batches": 2}}
    space = {
        "global_batch_size": 8,
        "lr": {"type": "double", "minval": 0.0, "maxval": 1.0, "count": 3},
        "act": {"type": "categorical", "vals": ["relu", "tanh"]},
    }
    request = api_pb2.CreateExperimentRequest(
        config_yaml=experiment_yaml(searcher=grid, hyperparameters=space),
        model_definition=model_archive(),
        activate=True,
    )
    eid = api.CreateExperiment(request).experiment.id
    harness.run_until(_ended(api, eid))
    trials = _state(api, eid).trials
    points = {(t.hparams["lr"], t.hparams["act"]) for t in trials}
    assert len(trials) == len(points) == 6
    assert {lr for lr, _ in points} == {0.0, 0.5, 1.0}
    agent.close()


def test_the_search_survives_a_master_restart(tmp_path: Path) -> None:
    config = master_config(
        state_dir=tmp_path / "master",
    )
    server = MasterServer(config)
    server.start()
    channel = authed_channel(f"127.0.0.1:{server.port}")
    api = api_pb2_grpc.ApiStub(channel)
    agent = ScriptedAgent(server.port, "a1", slots=2)
    harness = Harness(agent, server.port)
    eid = _create(api, ASHA)
    for _ in range(4):
        harness.run_one()
    before = {t.id: (t.state, t.total_batches) for t in _state(api, eid).trials}
    agent.close()
    channel.close()
    server.stop(grace=0)

    again = MasterServer(
        master_config(
            state_dir=config.state_dir,
        )
    )
    again.start()
    try:
        channel = authed_channel(f"127.0.0.1:{again.port}")
        api = api_pb2_grpc.ApiStub(channel)
        agent = ScriptedAgent(again.port, "a1", slots=2)
        harness2 = Harness(agent, again.port)
        harness2.checkpoints = harness.checkpoints
        harness2.run_until(_ended(api, eid))
        done = _state(api, eid)
        assert done.experiment.state == common_pb2.EXPERIMENT_STATE_COMPLETED
        assert len(done.trials) == 8  # the restored searcher did not start over
        for t in done.trials:
            if t.id in before and before[t.id][1]:
                assert t.total_batches >= before[t.id][1]
            assert _validations(api, t.id) == [r for r in (2, 4, 8) if r <= t.total_batches]
        agent.close()
        channel.close()
    finally:
        again.stop(grace=0)


def test_bad_search_options_are_refused_at_create(api: api_pb2_grpc.ApiStub) -> None:
    bad = dict(ASHA, divisor=1)
    with pytest.raises(grpc.RpcError) as info:
        _create(api, bad)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "searcher.divisor" in (info.value.details() or "")


def test_progress_rises_with_the_search(master: MasterServer, api: api_pb2_grpc.ApiStub) -> None:
    agent = ScriptedAgent(master.port, "a1", slots=2)
    harness = Harness(agent, master.port)
    eid = _create(api, ASHA)
    seen = [_state(api, eid).experiment.progress]
    deadline = time.monotonic() + 60
    while not _ended(api, eid)() and time.monotonic() < deadline:
        try:
            harness.run_one(timeout=2)
        except queue.Empty:
            continue  # no trial left to start: the last exit had not landed yet
        seen.append(_state(api, eid).experiment.progress)
    seen.append(_state(api, eid).experiment.progress)  # the last exit lands asynchronously
    assert seen == sorted(seen)
    assert seen[-1] == 1.0
    assert not math.isnan(seen[0])
    agent.close()


def test_checkpoints_the_policy_does_not_keep_are_collected_when_trials_end(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    agent = ScriptedAgent(master.port, "a1", slots=2)
    harness = Harness(agent, master.port, metric=older_is_better)
    eid = _create(api, ASHA)  # save_trial_best 1, save_trial_latest 1 (the defaults)
    harness.run_until(_ended(api, eid))
    store = master.store

    def kept() -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for t in store.list_trials(eid):
            out[t.id] = [
                c.total_batches for c in store.list_checkpoints(t.id) if c.state != "DELETED"
            ]
        return out

    deadline = time.monotonic() + 10
    while any(len(v) > 1 for v in kept().values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for trial_id, batches in kept().items():
        latest = store.get_trial(trial_id).total_batches
        assert batches == [latest]  # no metric recorded with them: only the latest stays
    agent.close()
