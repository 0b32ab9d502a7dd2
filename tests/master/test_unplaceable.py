"""An experiment the cluster can never run says so: at create, in describe, in the queue,
in the trial's log, on the experiment itself (what the web UI's list and page show); and
stops saying so once agents that fit it are there."""

from __future__ import annotations

from assay.master._server import MasterServer
from assay.proto import api_pb2, api_pb2_grpc, common_pb2
from tests.master.conftest import ScriptedAgent, eventually, experiment_yaml, model_archive


def _create(api: api_pb2_grpc.ApiStub, slots: int) -> api_pb2.CreateExperimentResponse:
    response: api_pb2.CreateExperimentResponse = api.CreateExperiment(
        api_pb2.CreateExperimentRequest(
            config_yaml=experiment_yaml(
                resources={"slots_per_trial": slots},
                hyperparameters={"global_batch_size": 12 * slots, "lr": 0.1},
            ),
            model_definition=model_archive(),
            activate=True,
        )
    )
    return response


def _trial(api: api_pb2_grpc.ApiStub, experiment_id: int) -> common_pb2.Trial:
    response: api_pb2.GetExperimentResponse = api.GetExperiment(
        api_pb2.GetExperimentRequest(id=experiment_id)
    )
    [trial] = response.trials
    return trial


def _log(api: api_pb2_grpc.ApiStub, trial_id: int) -> list[str]:
    lines = api.StreamTrialLogs(api_pb2.StreamTrialLogsRequest(trial_id=trial_id, follow=False))
    return [line.message for line in lines]


def test_a_trial_larger_than_the_cluster_says_so_everywhere_until_it_fits(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    a1 = ScriptedAgent(master.port, "a1", slots=2)
    a2 = ScriptedAgent(master.port, "a2", slots=2)
    why = "needs 6 CPU slots; the cluster has 4 (2 agents)"
    created = _create(api, 6)
    assert [w for w in created.warnings if why in w], created.warnings
    trial = _trial(api, created.experiment.id)
    assert (trial.state, trial.waiting) == (common_pb2.TRIAL_STATE_QUEUED, why)
    [queued] = api.GetQueue(api_pb2.GetQueueRequest()).trials
    assert (queued.trial_id, queued.reason) == (trial.id, why)
    eventually(lambda: f"waiting: {why}" in _log(api, trial.id))
    # A trial that fits says nothing, even while it waits for slots held by another.
    fits = _create(api, 4)
    assert list(fits.warnings) == []
    a1.next("start")
    a2.next("start")
    # A third agent makes 6 possible (3 agents x 2): the reason goes, the trial waits
    # only for free slots now.
    a3 = ScriptedAgent(master.port, "a3", slots=2)
    eventually(lambda: _trial(api, created.experiment.id).waiting == "")
    assert all(q.reason == "" for q in api.GetQueue(api_pb2.GetQueueRequest()).trials)
    assert _log(api, trial.id).count(f"waiting: {why}") == 1  # said once
    for agent in (a1, a2, a3):
        agent.close()


def _listed(api: api_pb2_grpc.ApiStub) -> dict[int, str]:
    response = api.ListExperiments(api_pb2.ListExperimentsRequest())
    return {e.id: e.waiting for e in response.experiments}


def test_the_experiment_carries_its_trials_reason_in_get_and_list_until_it_fits(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    a1 = ScriptedAgent(master.port, "a1", slots=2)
    why = "needs 8 CPU slots; the cluster has 2 (1 agent)"
    stuck = _create(api, 8)
    assert stuck.experiment.waiting == why
    got = api.GetExperiment(api_pb2.GetExperimentRequest(id=stuck.experiment.id))
    assert got.experiment.waiting == why == got.trials[0].waiting
    # One that fits waits for slots only (the first holds none): nothing to say.
    fits = _create(api, 2)
    assert fits.experiment.waiting == ""
    a1.next("start")
    assert _listed(api) == {stuck.experiment.id: why, fits.experiment.id: ""}
    # Paused, its trial leaves the queue: it waits for nothing.
    api.ExperimentAction(
        api_pb2.ExperimentActionRequest(
            id=stuck.experiment.id, action=api_pb2.EXPERIMENT_ACTION_PAUSE
        )
    )
    eventually(lambda: _listed(api)[stuck.experiment.id] == "")
    api.ExperimentAction(
        api_pb2.ExperimentActionRequest(
            id=stuck.experiment.id, action=api_pb2.EXPERIMENT_ACTION_ACTIVATE
        )
    )
    eventually(lambda: _listed(api)[stuck.experiment.id] == why)
    # Three more agents make 8 possible: the reason goes from the list too.
    more = [ScriptedAgent(master.port, f"a{i}", slots=2) for i in (2, 3, 4)]
    eventually(lambda: _listed(api)[stuck.experiment.id] == "")
    for agent in (a1, *more):
        agent.close()


def test_every_agent_disabled_is_the_reason_and_enabling_one_starts_the_trial(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    agent = ScriptedAgent(master.port, "a1", slots=1)
    api.SetAgentEnabled(api_pb2.SetAgentEnabledRequest(id="a1", enabled=False))
    created = _create(api, 1)
    why = "needs 1 CPU slot; every CPU agent is disabled (1)"
    assert [w for w in created.warnings if why in w], created.warnings
    assert _trial(api, created.experiment.id).waiting == why
    api.SetAgentEnabled(api_pb2.SetAgentEnabledRequest(id="a1", enabled=True))
    agent.next("start")
    trial = _trial(api, created.experiment.id)
    assert (trial.state, trial.waiting) == (common_pb2.TRIAL_STATE_RUNNING, "")
    agent.close()


def test_no_agent_at_all_is_the_reason(master: MasterServer, api: api_pb2_grpc.ApiStub) -> None:
    created = _create(api, 2)
    why = "needs 2 CPU slots; no CPU agent is connected"
    assert [w for w in created.warnings if why in w], created.warnings
    assert _trial(api, created.experiment.id).waiting == why


def test_the_config_text_comes_back_as_submitted_from_get_but_not_from_list(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    # The seed is set: one the master draws is added as a comment (tests/master/test_seeds.py).
    seeded = {"experiment_seed": 3}
    text = (
        "# tuned by hand\n" + experiment_yaml(name="texted", reproducibility=seeded) + "# the end\n"
    )
    created = api.CreateExperiment(
        api_pb2.CreateExperimentRequest(
            config_yaml=text, model_definition=model_archive(), activate=False
        )
    )
    got = api.GetExperiment(api_pb2.GetExperimentRequest(id=created.experiment.id))
    assert got.experiment.config_yaml == text
    listed = api.ListExperiments(api_pb2.ListExperimentsRequest())
    assert [e.config_yaml for e in listed.experiments] == [""]
    assert created.experiment.config_yaml == ""


def test_with_no_agent_at_all_the_trials_log_is_left_alone(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    created = _create(api, 1)
    trial = _trial(api, created.experiment.id)
    assert trial.waiting == "needs 1 CPU slot; no CPU agent is connected"
    assert _log(api, trial.id) == []  # a master starting before its agents say nothing there
