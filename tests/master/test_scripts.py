"""The master's side of script entrypoints and the Core API, against a real master with a
scripted agent: targets completed past their length, a trial that asks to stop, a script
that exits 0 early, best validation, progress, and a trial deleting its own checkpoints."""

from __future__ import annotations

import time
import uuid
from typing import Any

import grpc
import pytest

from assay.master._server import MasterServer
from assay.proto import api_pb2, api_pb2_grpc, common_pb2, trial_pb2
from tests.master.conftest import Process, ScriptedAgent, experiment_yaml, model_archive


def _create(api: api_pb2_grpc.ApiStub, **overrides: Any) -> int:
    response = api.CreateExperiment(
        api_pb2.CreateExperimentRequest(
            config_yaml=experiment_yaml(**overrides),
            model_definition=model_archive(),
            activate=True,
        )
    )
    return int(response.experiment.id)


def _experiment(api: api_pb2_grpc.ApiStub, eid: int) -> api_pb2.GetExperimentResponse:
    response: api_pb2.GetExperimentResponse = api.GetExperiment(
        api_pb2.GetExperimentRequest(id=eid)
    )
    return response


def _ended(api: api_pb2_grpc.ApiStub, eid: int) -> api_pb2.GetExperimentResponse:
    """The experiment once it has completed (the exit is asynchronous), or after 10 s."""
    deadline = time.monotonic() + 10
    while True:
        experiment = _experiment(api, eid)
        ended = experiment.experiment.state == common_pb2.EXPERIMENT_STATE_COMPLETED
        if ended or time.monotonic() > deadline:
            return experiment
        time.sleep(0.05)


def _script(**overrides: Any) -> dict[str, Any]:
    return {"entrypoint": "python3 train.py", "hyperparameters": {"lr": 0.1}, **overrides}


def test_a_validation_past_the_target_completes_it(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    agent = ScriptedAgent(master.port, "a1", slots=1)
    eid = _create(api, **_script())
    start = agent.next("start").start
    process = Process(master.port, start)
    assert process.next_op().total_batches == 100
    process.complete(90, 0.5)  # short of the target: nothing happens
    assert process.next_op(90).total_batches == 100
    process.complete(110, 0.4)  # a script validating on its own schedule
    assert process.next_op(110).stop
    agent.exited(start.allocation_id, [0])
    [trial] = _ended(api, eid).trials
    agent.close()
    process.close()
    assert trial.state == common_pb2.TRIAL_STATE_COMPLETED


def test_a_trial_that_asks_to_stop_ends_completed(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    agent = ScriptedAgent(master.port, "a1", slots=1)
    eid = _create(api)  # a Trial class: exit 0 early would otherwise be a failure
    start = agent.next("start").start
    process = Process(master.port, start)
    process.report(30, 0.5)
    process.complete(30, 0.5, stop_requested=True)
    assert process.next_op(30).stop
    agent.exited(start.allocation_id, [0])
    experiment = _ended(api, eid)
    agent.close()
    process.close()
    assert [t.state for t in experiment.trials] == [common_pb2.TRIAL_STATE_COMPLETED]
    assert experiment.trials[0].restarts == 0
    assert experiment.experiment.state == common_pb2.EXPERIMENT_STATE_COMPLETED


def test_a_script_that_exits_0_before_its_target_ends_completed(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    agent = ScriptedAgent(master.port, "a1", slots=1)
    eid = _create(api, **_script())
    start = agent.next("start").start
    agent.exited(start.allocation_id, [0])
    experiment = _ended(api, eid)
    agent.close()
    [trial] = experiment.trials
    assert trial.state == common_pb2.TRIAL_STATE_COMPLETED
    assert trial.restarts == 0
    assert experiment.experiment.state == common_pb2.EXPERIMENT_STATE_COMPLETED


def test_a_script_without_max_length_completes_when_it_exits_0(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    agent = ScriptedAgent(master.port, "a1", slots=1)
    eid = _create(api, **_script(searcher={"name": "single", "metric": "loss"}))
    start = agent.next("start").start
    process = Process(master.port, start)
    process.report(500, 0.2)
    process.complete(500, 0.2)  # far short of no length at all: nothing happens
    assert not process.next_op(500).stop
    agent.exited(start.allocation_id, [0])
    experiment = _ended(api, eid)
    agent.close()
    process.close()
    assert experiment.experiment.state == common_pb2.EXPERIMENT_STATE_COMPLETED
    assert experiment.trials[0].restarts == 0


def test_best_validation_progress_and_own_checkpoint_deletion(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    agent = ScriptedAgent(master.port, "a1", slots=1)
    eid = _create(api, **_script())
    start = agent.next("start").start
    process = Process(master.port, start)
    ids: dict[str, Any] = {"trial_id": start.trial_id, "run_id": start.run_id}
    best = process.stub.GetBestValidation(
        trial_pb2.GetBestValidationRequest(**ids), metadata=process.meta
    )
    assert not best.found
    first = process.report(10, 0.7)
    process.report(20, 0.3)
    best = process.stub.GetBestValidation(
        trial_pb2.GetBestValidationRequest(**ids), metadata=process.meta
    )
    assert (best.found, best.value) == (True, pytest.approx(0.3))

    process.stub.ReportProgress(
        trial_pb2.ReportProgressRequest(progress=0.4, **ids), metadata=process.meta
    )
    assert _experiment(api, eid).experiment.progress == pytest.approx(0.4)
    with pytest.raises(grpc.RpcError) as bad:
        process.stub.ReportProgress(
            trial_pb2.ReportProgressRequest(progress=1.5, **ids), metadata=process.meta
        )
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    deleted = process.stub.DeleteTrialCheckpoints(
        trial_pb2.DeleteTrialCheckpointsRequest(uuids=[first], **ids), metadata=process.meta
    )
    assert first in deleted.deleted
    assert not deleted.failed
    with pytest.raises(grpc.RpcError) as unknown:
        process.stub.DeleteTrialCheckpoints(
            trial_pb2.DeleteTrialCheckpointsRequest(uuids=[str(uuid.uuid4())], **ids),
            metadata=process.meta,
        )
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    agent.close()
    process.close()


def test_a_trial_may_not_delete_another_trials_checkpoint(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    agent = ScriptedAgent(master.port, "a1", slots=2)
    _create(api, **_script())
    _create(api, **_script())
    first, second = agent.next("start").start, agent.next("start").start
    alice, mallory = Process(master.port, first), Process(master.port, second)
    theirs = alice.report(10, 0.5)
    ids: dict[str, Any] = {"trial_id": second.trial_id, "run_id": second.run_id}

    with pytest.raises(grpc.RpcError) as refused:
        mallory.stub.DeleteTrialCheckpoints(
            trial_pb2.DeleteTrialCheckpointsRequest(uuids=[theirs], **ids), metadata=mallory.meta
        )

    assert refused.value.code() == grpc.StatusCode.NOT_FOUND  # nothing learnt of it
    assert f"trial {first.trial_id}" not in (refused.value.details() or "")
    agent.close()
    alice.close()
    mallory.close()
