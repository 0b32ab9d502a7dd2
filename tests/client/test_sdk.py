"""`assay.client` against a real master and agent: a search, its best checkpoint loaded
back into the Trial (whose outputs give the validation metric the trial reported),
experiment control, metrics, logs, and the errors a script gets for bad input."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from assay import client
from assay.errors import AssayError
from tests.conftest import REGRESSION_DIR, regression_config
from tests.credentials import ADMIN_PASSWORD
from tests.e2e.conftest import Cluster, start_cluster, stop_cluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("sdk")
    found = start_cluster(tmp, None, agents=1, slots=2)
    try:
        yield found
    finally:
        client.logout()
        stop_cluster(found)


@pytest.fixture
def session(cluster: Cluster) -> client.Session:
    return client.login(cluster.address, "admin", ADMIN_PASSWORD)


def _search_config(**overrides: Any) -> dict[str, Any]:
    config = regression_config(batches=16, validation_period=8, checkpoint_period=8)
    config["hyperparameters"]["lr"] = {"type": "categorical", "vals": [0.01, 0.05]}
    config["searcher"] = {
        "name": "grid",
        "metric": "val_loss",
        "smaller_is_better": True,
        "max_length": {"batches": 16},
    }
    config["checkpoint_storage"] = {"save_trial_best": 2, "save_trial_latest": 1}
    config.update(overrides)
    return config


def _validation_loss(model: nn.Module) -> float:
    """The trial's own validation: mean squared error over its validation set (70
    samples in 7 equal batches, so the mean of the batches' means is the overall mean)."""
    sys.path.insert(0, str(REGRESSION_DIR))
    try:
        from model_def import make_data
    finally:
        sys.path.remove(str(REGRESSION_DIR))
    data = make_data(70, seed=2)
    x, y = data.tensors
    with torch.no_grad():
        return float(nn.functional.mse_loss(model(x), y))


@pytest.fixture(scope="module")
def searched(cluster: Cluster) -> client.Experiment:
    """A grid search of two trials, completed: the module's tests read it, in any order."""
    client.login(cluster.address, "admin", ADMIN_PASSWORD)
    experiment = client.create_experiment(_search_config(name="sdk-search"), REGRESSION_DIR)
    assert experiment.wait(progress=True, timeout=300) == "COMPLETED"
    return experiment


def test_a_search_its_best_checkpoint_loads_into_a_model_that_gives_its_metric(
    session: client.Session, searched: client.Experiment, tmp_path: Path
) -> None:
    experiment = searched
    assert experiment.state == "COMPLETED"

    trials = experiment.trials()
    assert sorted(t.hparams["lr"] for t in trials) == [0.01, 0.05]
    best = experiment.top_checkpoint()
    top = experiment.top_n_checkpoints(10)
    assert top[0].uuid == best.uuid
    losses = [c.validation_metrics["val_loss"] for c in top]
    assert losses == sorted(losses)
    assert min(t.best_validation or float("inf") for t in trials) == pytest.approx(losses[0])

    trial = best.load()  # the entrypoint's class, from the uploaded model definition
    assert type(trial).__name__ == "RegressionTrial"
    model: nn.Module = vars(trial)["model"]  # what RegressionTrial wrapped
    assert not model.training
    assert _validation_loss(model) == pytest.approx(best.validation_metrics["val_loss"], rel=1e-5)

    # Registered, then loaded back from the registry: the same weights.
    registered = client.create_model("sdk-regression", "the grid's best", labels=["test"])
    version = registered.register_version(best, notes="lowest val_loss")
    assert (version.model_name, version.version) == ("sdk-regression", 1)
    assert version.checkpoint.uuid == best.uuid
    assert [v.notes for v in client.get_model("sdk-regression").versions()] == ["lowest val_loss"]
    latest = client.get_model("sdk-regression").get_version()
    again = vars(latest.load())["model"]
    x = torch.randn(5, 8)
    with torch.no_grad():
        assert torch.equal(again(x), model(x))
    assert [m.name for m in client.list_models(label="test")] == ["sdk-regression"]

    # The same weights, through a download of the files.
    copy = best.download(tmp_path / "copy")
    assert (copy / "metadata.json").is_file()
    owner = client.get_trial(best.trial_id)
    assert owner.top_checkpoint().uuid == best.uuid
    assert owner.latest_checkpoint().total_batches == 16

    reports = list(owner.metrics("validation"))
    assert [r["total_batches"] for r in reports] == [8, 16]
    at_best = next(r for r in reports if r["total_batches"] == best.total_batches)
    assert at_best["val_loss"] == pytest.approx(best.validation_metrics["val_loss"])
    training = list(owner.metrics("training"))
    assert training
    assert all("loss" in r for r in training)
    assert list(owner.logs())  # the harness logs at least its start


def test_metrics_dataframe_says_to_install_pandas_when_it_is_missing(
    session: client.Session, searched: client.Experiment, monkeypatch: pytest.MonkeyPatch
) -> None:
    experiment = searched
    trial = experiment.trials()[0]
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match="pip install pandas"):
        trial.metrics_dataframe()


def _until(experiment: client.Experiment, state: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while experiment.state != state:
        assert time.monotonic() < deadline, f"experiment never {state}: {experiment.state}"
        time.sleep(0.3)


def test_metrics_as_a_dataframe(session: client.Session, searched: client.Experiment) -> None:
    pd = pytest.importorskip(
        "pandas", reason="pandas is not installed (Trial.metrics_dataframe needs it)"
    )
    experiment = searched
    trial = experiment.trials()[0]
    frame = trial.metrics_dataframe("validation")
    assert isinstance(frame, pd.DataFrame)
    assert list(frame["total_batches"]) == [8, 16]
    # One row per report, one column per metric: the same values as metrics() yields.
    assert frame.to_dict("records") == list(trial.metrics("validation"))
    training = trial.metrics_dataframe("training")
    assert len(training) == len(list(trial.metrics("training"))) > 0
    assert {"total_batches", "loss"} <= set(training.columns)
    # A group the trial never reported: no rows, but the batch column.
    empty = trial.metrics_dataframe("never-reported")
    assert empty.empty
    assert list(empty.columns) == ["total_batches"]


def test_pause_activate_and_kill(session: client.Session) -> None:
    config = regression_config(batches=400, sleep_s=0.05)
    config["name"] = "sdk-control"
    experiment = client.create_experiment(config, REGRESSION_DIR)
    experiment.pause()
    _until(experiment, "PAUSED")
    experiment.activate()
    _until(experiment, "ACTIVE")
    with pytest.raises(TimeoutError, match="still ACTIVE"):
        experiment.wait(progress=False, timeout=0.2)
    experiment.kill()
    assert experiment.wait(progress=False, timeout=120) == "CANCELED"
    trial = experiment.trials()[0]
    assert trial.state in {"CANCELED", "COMPLETED"}
    listed = client.list_experiments(name="sdk-control")
    assert [e.id for e in listed] == [experiment.id]
    assert experiment.seed == 3  # regression_config sets it


def test_an_experiment_without_a_seed_in_its_config_gets_one_drawn(
    session: client.Session,
) -> None:
    config = _search_config(name="sdk-seeds")
    del config["reproducibility"]
    seeds = []
    for _ in range(2):
        experiment = client.create_experiment(config, REGRESSION_DIR, activate=False)
        seeds.append(experiment.seed)
        assert experiment.config["reproducibility"] == {"experiment_seed": experiment.seed}
        assert client.get_experiment(experiment.id).seed == experiment.seed
        experiment.kill()
    assert seeds[0] != seeds[1]


def test_bad_input_raises_one_clear_error(
    cluster: Cluster, session: client.Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(client.AuthenticationError) as wrong:
        client.login(cluster.address, "admin", "not-the-password")
    assert "Traceback" not in str(wrong.value)
    with pytest.raises(client.AuthenticationError):
        client.login(cluster.address, token="ast_not-a-token")
    with monkeypatch.context() as env:
        env.delenv("ASSAY_PASSWORD")
        with pytest.raises(client.AuthenticationError, match="assay user login nobody"):
            client.login(cluster.address, "nobody")
    session = client.login(cluster.address, "admin", ADMIN_PASSWORD)
    assert session.username == "admin"

    with pytest.raises(client.NotFoundError, match="experiment 99999"):
        client.get_experiment(99999)
    with pytest.raises(client.NotFoundError):
        client.get_trial(99999)
    with pytest.raises(client.NotFoundError):
        client.get_checkpoint("00000000-0000-0000-0000-000000000000")
    bad = regression_config(batches=8)
    bad["searcher"]["max_length"] = {"batches": -1}
    with pytest.raises(client.InvalidRequestError, match="searcher.max_length"):
        client.create_experiment(bad, REGRESSION_DIR)
    with pytest.raises(client.NotFoundError):
        client.get_model("no-such-model")
    client.create_model("sdk-twice")
    with pytest.raises(client.InvalidRequestError):
        client.create_model("sdk-twice")
    with pytest.raises(client.NotFoundError):
        client.get_model("sdk-twice").register_version("00000000-0000-0000-0000-000000000000")
    with pytest.raises(AssayError, match="unknown experiment state 'DONE'"):
        client.list_experiments(states=["done"])
    with pytest.raises(AssayError, match="does not exist"):
        client.create_experiment(regression_config(batches=8), "/no/such/dir")

    created = client.create_experiment(regression_config(batches=8), REGRESSION_DIR, activate=False)
    with pytest.raises(AssayError, match="has a validation val_loss"):
        created.top_checkpoint()
    created.kill()


def test_an_unreachable_master_is_named() -> None:
    from assay._rank_processes import free_port

    with pytest.raises(client.MasterError, match="cannot reach the master"):
        client.login(f"127.0.0.1:{free_port()}", "admin", ADMIN_PASSWORD)
