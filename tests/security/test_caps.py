"""What one experiment's code may make the master hold: a custom search's runner once
created 30,000 trials in one 2.7 s call, and a trial once reported 175,002 metric names
(its experiment's page was 9 MiB). Past the master's `custom_search_trials` and
`metric_names_per_trial` (50 and 100 here) the call is refused whole with
RESOURCE_EXHAUSTED, naming the limit and the setting that raises it; what was stored
before stays, and stays readable (a real `assay-master` process; the trial is played by
the test with its allocation's token)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import grpc
import pytest
import yaml

from assay.proto import api_pb2, api_pb2_grpc, common_pb2, trial_pb2
from tests.e2e.conftest import Cluster, start_cluster, stop_cluster
from tests.master.conftest import experiment_yaml, model_archive
from tests.security.conftest import PlayedTrial, add_users, play_trial

TRIALS_CAP = 50
NAMES_CAP = 100
ARCHIVE = model_archive()
CUSTOM = {"name": "custom", "metric": "loss"}  # no max_trials: the master's cap holds
HPARAMS = {"global_batch_size": 8, "lr": {"type": "double", "minval": 0.01, "maxval": 0.1}}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    env = {
        "ASSAY_CUSTOM_SEARCH_TRIALS": str(TRIALS_CAP),
        "ASSAY_METRIC_NAMES_PER_TRIAL": str(NAMES_CAP),
    }
    c = start_cluster(tmp_path_factory.mktemp("caps"), None, agents=0, slots=1, master_env=env)
    try:
        yield c
    finally:
        stop_cluster(c)


@pytest.fixture(scope="module")
def mallory(cluster: Cluster) -> api_pb2_grpc.ApiStub:
    return add_users(cluster, {"mallory": "mallory-password-1"})["mallory"]


def _creates(first: int, count: int) -> list[api_pb2.SearcherOperation]:
    ops = []
    for i in range(first, first + count):
        rid = f"t{i}"
        hparams = json.dumps({"lr": 0.05})
        ops.append(
            api_pb2.SearcherOperation(
                create=api_pb2.CreateTrialOperation(request_id=rid, hparams_json=hparams)
            )
        )
        ops.append(
            api_pb2.SearcherOperation(
                validate_after=api_pb2.ValidateAfterOperation(request_id=rid, length=4)
            )
        )
    return ops


def _post(
    api: api_pb2_grpc.ApiStub, eid: int, after: int, ops: list[api_pb2.SearcherOperation]
) -> int:
    request = api_pb2.PostSearcherOperationsRequest(
        experiment_id=eid, triggered_by_event_id=after, operations=ops
    )
    return int(api.PostSearcherOperations(request, timeout=60).acknowledged_event_id)


def _trials(api: api_pb2_grpc.ApiStub, eid: int) -> int:
    return len(api.GetExperiment(api_pb2.GetExperimentRequest(id=eid), timeout=30).trials)


def _exhausted(error: pytest.ExceptionInfo[grpc.RpcError], setting: str) -> str:
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.value.details()
    message = str(error.value.details())
    assert setting in message, message
    return message


def test_a_custom_search_creates_no_more_trials_than_the_master_allows(
    mallory: api_pb2_grpc.ApiStub,
) -> None:
    config = experiment_yaml(name="custom", searcher=CUSTOM, hyperparameters=HPARAMS)
    request = api_pb2.CreateExperimentRequest(config_yaml=config, model_definition=ARCHIVE)
    eid = mallory.CreateExperiment(request, timeout=30).experiment.id
    # The attack: 30,000 trials in one call. Refused before any is made, and at once.
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as refused:
        _post(mallory, eid, 1, _creates(0, 30_000))
    message = _exhausted(refused, "custom_search_trials")
    assert f"limit of {TRIALS_CAP} trials per custom search" in message
    assert time.monotonic() - started < 10
    assert _trials(mallory, eid) == 0

    # Up to the cap they come, in any batches; one more is refused, saying how many may.
    assert _post(mallory, eid, 1, _creates(0, TRIALS_CAP - 10)) == 1
    events = mallory.GetSearcherEvents(
        api_pb2.GetSearcherEventsRequest(experiment_id=eid, after_event_id=1), timeout=30
    ).events
    with pytest.raises(grpc.RpcError) as refused:
        _post(mallory, eid, events[-1].id, _creates(TRIALS_CAP, 11))
    assert "create at most 10 more" in _exhausted(refused, "custom_search_trials")
    assert _post(mallory, eid, events[-1].id, _creates(TRIALS_CAP, 10)) == events[-1].id
    assert _trials(mallory, eid) == TRIALS_CAP


def test_a_custom_config_promising_more_trials_than_the_cap_is_refused(
    mallory: api_pb2_grpc.ApiStub,
) -> None:
    searcher = {**CUSTOM, "max_trials": TRIALS_CAP + 1}
    config = experiment_yaml(name="too-many", searcher=searcher, hyperparameters=HPARAMS)
    request = api_pb2.CreateExperimentRequest(config_yaml=config, model_definition=ARCHIVE)
    with pytest.raises(grpc.RpcError) as refused:
        mallory.CreateExperiment(request, timeout=30)
    assert "searcher.max_trials" in _exhausted(refused, "custom_search_trials")
    # Other searchers keep their own caps (max_trials up to 100,000), untouched by it.
    random = {"name": "random", "metric": "loss", "max_trials": 1000, "max_length": {"batches": 4}}
    other = experiment_yaml(name="random", searcher=random, hyperparameters=HPARAMS)
    request = api_pb2.CreateExperimentRequest(config_yaml=other, model_definition=ARCHIVE)
    assert mallory.CreateExperiment(request, timeout=30).experiment.id


@pytest.fixture(scope="module")
def trial(cluster: Cluster, mallory: api_pb2_grpc.ApiStub) -> Iterator[PlayedTrial]:
    config = yaml.safe_load(experiment_yaml(name="names"))
    request = api_pb2.CreateExperimentRequest(
        config_yaml=yaml.safe_dump(config), model_definition=ARCHIVE, activate=True
    )
    mallory.CreateExperiment(request, timeout=30)
    played = play_trial(cluster)
    try:
        yield played
    finally:
        played.close()


def _report(trial: PlayedTrial, names: list[str], batch: int, group: str = "training") -> int:
    process = trial.process
    request = trial_pb2.ReportMetricsRequest(
        trial_id=process.trial_id,
        run_id=process.run_id,
        group=group,
        reports=[common_pb2.MetricsReport(total_batches=batch, metrics=dict.fromkeys(names, 1.0))],
    )
    return int(process.stub.ReportMetrics(request, metadata=process.meta, timeout=60).stored)


def _names(api: api_pb2_grpc.ApiStub, trial: PlayedTrial) -> set[tuple[str, str]]:
    got = api.GetExperiment(api_pb2.GetExperimentRequest(id=trial.start.experiment_id), timeout=30)
    return {(m.group, m.name) for m in got.metric_names}


def test_a_trial_reporting_names_without_end_is_stopped_at_the_cap(
    cluster: Cluster, trial: PlayedTrial, mallory: api_pb2_grpc.ApiStub
) -> None:
    # The attack: thousands of distinct names. Refused whole; nothing stored.
    with pytest.raises(grpc.RpcError) as refused:
        _report(trial, [f"m{i}" for i in range(5000)], batch=1)
    message = _exhausted(refused, "metric_names_per_trial")
    assert f"limit of {NAMES_CAP} per trial" in message
    assert _names(mallory, trial) == set()

    # Up to the cap, over several reports and groups.
    assert _report(trial, [f"m{i}" for i in range(60)], batch=1) == 60
    assert _report(trial, [f"v{i}" for i in range(40)], batch=1, group="validation") == 40
    # One more name, in any group, is refused, and so is a report mixing it with known ones.
    for names, group in [(["new"], "training"), (["m0", "m1", "new"], "training"), (["m0"], "x")]:
        with pytest.raises(grpc.RpcError) as refused:
            _report(trial, names, batch=2, group=group)
        _exhausted(refused, "metric_names_per_trial")
    # Names it has reported keep coming, as a trial that passed a lowered cap keeps its own.
    assert _report(trial, [f"m{i}" for i in range(60)], batch=3) == 60
    stored = _names(mallory, trial)
    assert len(stored) == NAMES_CAP
    assert ("training", "new") not in stored

    # A restarted master counts the trial's names from the store.
    stop_processes_of_master(cluster)
    cluster.restart_master()
    deadline = time.monotonic() + 60
    while True:
        try:
            assert _report(trial, ["m0"], batch=4) == 1
            break
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    with pytest.raises(grpc.RpcError) as refused:
        _report(trial, ["after-restart"], batch=5)
    _exhausted(refused, "metric_names_per_trial")


def stop_processes_of_master(cluster: Cluster) -> None:
    master = cluster.procs[0]
    master.terminate()
    master.wait(timeout=30)
