"""Names that show as something else: a right-to-left override makes "emoc" read "come",
a zero-width space makes two names that look the same differ, and "paypal" with a
Cyrillic U+0430 for its first "a" passes for Latin. Wherever a user names something
other users see (experiment names and labels, hyperparameter names, model labels, metric
names and groups) the master refuses them with INVALID_ARGUMENT, naming the character by
its code point, and stores nothing (a real `assay-master` process; the metrics come from
a trial played by the test with its allocation's token)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from assay.proto import api_pb2, api_pb2_grpc, common_pb2, trial_pb2
from tests.e2e.conftest import Cluster, start_cluster, stop_cluster
from tests.master.conftest import experiment_yaml, model_archive
from tests.security.conftest import PlayedTrial, add_users, play_trial

# (the name, what the refusal must name)
LIES = [
    ("e\u202emoc", "U+202E RIGHT-TO-LEFT OVERRIDE"),  # shown as "come"
    ("\u2067admin\u2069", "U+2067 RIGHT-TO-LEFT ISOLATE"),
    ("resnet\u200e", "U+200E LEFT-TO-RIGHT MARK"),
    ("ad\u200bmin", "U+200B ZERO WIDTH SPACE"),
    ("base\u200dline", "U+200D ZERO WIDTH JOINER"),
    ("\ufeffbaseline", "U+FEFF ZERO WIDTH NO-BREAK SPACE"),
    ("best\u2060run", "U+2060 WORD JOINER"),
    ("run\u180e1", "U+180E MONGOLIAN VOWEL SEPARATOR"),
    ("run\u00ad1", "U+00AD SOFT HYPHEN"),
    ("run\u3164", "U+3164 HANGUL FILLER"),
    ("best\u00a0run", "U+00A0 NO-BREAK SPACE"),
    ("p\u0430ypal", "Latin and Cyrillic"),  # a Cyrillic a
    ("\u0391lpha", "Greek and Latin"),  # a Greek capital alpha
]
# Names in other alphabets, accents, CJK beside Latin, Greek letters as their own words.
ARCHIVE = model_archive()
STATS = "\u03c3_stats"  # a metric group in Greek
SEARCHER = {"name": "single", "max_length": {"batches": 100}}
HONEST = [
    "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac",  # Greek
    "\u041f\u0440\u0438\u0432\u0435\u0442 run",  # Cyrillic, then Latin as another word
    "café résumé",
    "ResNet实验",
    "\u03c3_grad",
    "\u03b21 run",
    "Tシャツ",
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(tmp_path_factory.mktemp("names"), None, agents=0, slots=1)
    try:
        yield c
    finally:
        stop_cluster(c)


@pytest.fixture(scope="module")
def mallory(cluster: Cluster) -> api_pb2_grpc.ApiStub:
    return add_users(cluster, {"mallory": "mallory-password-1"})["mallory"]


def _refused(call: Any, request: Any) -> str:
    with pytest.raises(grpc.RpcError) as refused:
        call(request, timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
    return str(refused.value.details())


def _count(api: api_pb2_grpc.ApiStub) -> int:
    listed = api.ListExperiments(api_pb2.ListExperimentsRequest(limit=1000), timeout=30)
    return len(listed.experiments)


@pytest.mark.parametrize(("name", "said"), LIES)
def test_experiment_names_labels_hyperparameters_and_metrics_that_lie_are_refused(
    mallory: api_pb2_grpc.ApiStub, name: str, said: str
) -> None:
    before = _count(mallory)
    hparams = {"global_batch_size": 8, name: 0.1}
    for config, where in [
        (experiment_yaml(name=name), "name:"),
        (experiment_yaml(labels=["ok", name]), "labels[1]:"),
        (experiment_yaml(hyperparameters=hparams), "hyperparameters:"),
        (experiment_yaml(searcher={**SEARCHER, "metric": name}), "searcher.metric:"),
    ]:
        request = api_pb2.CreateExperimentRequest(config_yaml=config, model_definition=ARCHIVE)
        message = _refused(mallory.CreateExperiment, request)
        assert where in message, message
        assert said in message, message
    assert _count(mallory) == before  # nothing stored


@pytest.mark.parametrize(("name", "said"), LIES)
def test_renaming_or_labelling_with_a_lie_is_refused(
    mallory: api_pb2_grpc.ApiStub, name: str, said: str
) -> None:
    created = mallory.CreateExperiment(
        api_pb2.CreateExperimentRequest(
            config_yaml=experiment_yaml(name="mine"), model_definition=ARCHIVE
        ),
        timeout=30,
    ).experiment
    for request in [
        api_pb2.PatchExperimentRequest(id=created.id, name=name),
        api_pb2.PatchExperimentRequest(id=created.id, add_labels=[name]),
        api_pb2.PatchExperimentRequest(
            id=created.id, labels=api_pb2.LabelList(labels=["fine", name])
        ),
    ]:
        assert said in _refused(mallory.PatchExperiment, request)
    got = mallory.GetExperiment(api_pb2.GetExperimentRequest(id=created.id), timeout=30)
    assert (got.experiment.name, list(got.experiment.labels)) == ("mine", [])


@pytest.mark.parametrize(("name", "said"), LIES)
def test_model_labels_that_lie_are_refused(
    mallory: api_pb2_grpc.ApiStub, name: str, said: str
) -> None:
    model = f"model-{LIES.index((name, said))}"
    request = api_pb2.CreateModelRequest(name=model, labels=["ok", name])
    assert said in _refused(mallory.CreateModel, request)
    mallory.CreateModel(api_pb2.CreateModelRequest(name=model, labels=["ok"]), timeout=30)
    patch = api_pb2.PatchModelRequest(name=model, labels=api_pb2.LabelList(labels=[name]))
    assert said in _refused(mallory.PatchModel, patch)
    got = mallory.GetModel(api_pb2.GetModelRequest(name=model), timeout=30)
    assert list(got.labels) == ["ok"]


@pytest.fixture(scope="module")
def trial(cluster: Cluster, mallory: api_pb2_grpc.ApiStub) -> Iterator[PlayedTrial]:
    config = experiment_yaml(name="reports")
    request = api_pb2.CreateExperimentRequest(
        config_yaml=config, model_definition=ARCHIVE, activate=True
    )
    mallory.CreateExperiment(request, timeout=30)
    played = play_trial(cluster)
    try:
        yield played
    finally:
        played.close()


def _report(trial: PlayedTrial, metrics: dict[str, float], group: str = "training") -> Any:
    process = trial.process
    request = trial_pb2.ReportMetricsRequest(
        trial_id=process.trial_id,
        run_id=process.run_id,
        group=group,
        reports=[common_pb2.MetricsReport(total_batches=1, metrics=metrics)],
    )
    return process.stub.ReportMetrics(request, metadata=process.meta, timeout=30)


@pytest.mark.parametrize(("name", "said"), LIES)
def test_metric_names_and_groups_that_lie_are_refused(
    trial: PlayedTrial, mallory: api_pb2_grpc.ApiStub, name: str, said: str
) -> None:
    for metrics, group in [({"loss": 1.0, name: 2.0}, "training"), ({"loss": 1.0}, name)]:
        with pytest.raises(grpc.RpcError) as refused:
            _report(trial, metrics, group)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert said in str(refused.value.details())
    got = mallory.GetExperiment(
        api_pb2.GetExperimentRequest(id=trial.start.experiment_id), timeout=30
    )
    assert {(m.group, m.name) for m in got.metric_names} <= {("training", "loss")} | {
        (STATS, n) for n in HONEST
    }


def test_names_in_any_one_alphabet_go_in(trial: PlayedTrial, mallory: api_pb2_grpc.ApiStub) -> None:
    for name in HONEST:
        config = experiment_yaml(
            name=name, labels=[name], hyperparameters={"global_batch_size": 8, name: 1}
        )
        request = api_pb2.CreateExperimentRequest(config_yaml=config, model_definition=ARCHIVE)
        assert mallory.CreateExperiment(request, timeout=30).experiment.name == name
    assert _report(trial, dict.fromkeys(HONEST, 1.0), group=STATS).stored == len(HONEST)


def test_a_script_is_told_before_it_reports() -> None:
    from assay.core._train import _check_metric_name
    from assay.errors import AssayError

    for name, said in LIES:
        with pytest.raises(AssayError, match=said.split(" ")[0].replace("+", r"\+")):
            _check_metric_name(name)
    for name in HONEST:
        _check_metric_name(name)
