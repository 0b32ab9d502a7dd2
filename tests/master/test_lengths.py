"""Lengths in epochs and records on a cluster: the master converts them to the batches its
searchers count (epochs with records_per_epoch), when the experiment is created and again
when it is restored, and `assay preview-search` shows the same rungs."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest
import yaml
from click.testing import CliRunner

from assay.cli.main import cli
from assay.master._server import MasterServer
from assay.master._state import load_live
from assay.proto import api_pb2, api_pb2_grpc
from tests.master.conftest import Process, ScriptedAgent, experiment_yaml, model_archive

ASHA_EPOCHS = {
    "name": "async_halving",  # Determined's name of ASHA
    "metric": "loss",
    "max_length": {"epochs": 2},
    "divisor": 2.5,
    "num_rungs": 3,
    "max_trials": 4,
    "max_concurrent_trials": 1,
}
SPACE = {"global_batch_size": 64, "lr": {"type": "double", "minval": 0.0, "maxval": 1.0}}


def _create(api: api_pb2_grpc.ApiStub, **overrides: Any) -> int:
    request = api_pb2.CreateExperimentRequest(
        config_yaml=experiment_yaml(**overrides),
        model_definition=model_archive(),
        activate=True,
    )
    eid: int = api.CreateExperiment(request).experiment.id
    return eid


def _first_target(master: MasterServer, agent: ScriptedAgent) -> int:
    start = agent.next("start").start
    process = Process(master.port, start)
    target: int = process.next_op(0).total_batches
    process.close()
    return target


def test_epochs_become_batches_with_records_per_epoch(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    # 2 epochs of 60,000 records in batches of 64: ceil(1875.0) = 1875 batches; rungs at
    # floor(1875 / 6.25) = 300, floor(1875 / 2.5) = 750 and 1875.
    agent = ScriptedAgent(master.port, "a1", slots=1)
    eid = _create(api, searcher=ASHA_EPOCHS, hyperparameters=SPACE, records_per_epoch=60000)

    assert _first_target(master, agent) == 300
    (restored,) = [e for e in load_live(master.store) if e.id == eid]
    assert restored.searcher.snapshot()["brackets"][0]["lengths"] == [300, 750, 1875]
    agent.close()


def test_records_become_batches_rounded_up(master: MasterServer, api: api_pb2_grpc.ApiStub) -> None:
    agent = ScriptedAgent(master.port, "a1", slots=1)
    searcher = {"name": "single", "metric": "loss", "max_length": {"records": 1000}}
    _create(api, searcher=searcher, hyperparameters=SPACE)

    assert _first_target(master, agent) == 16  # ceil(1000 / 64)
    agent.close()


def test_epochs_without_records_per_epoch_are_refused(api: api_pb2_grpc.ApiStub) -> None:
    with pytest.raises(grpc.RpcError) as info:
        _create(api, searcher=ASHA_EPOCHS, hyperparameters=SPACE)

    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = info.value.details() or ""
    assert "searcher.max_length" in details
    assert "records_per_epoch" in details


def test_converted_rules_are_checked(api: api_pb2_grpc.ApiStub) -> None:
    # 1 epoch of 100 records in batches of 64 is 2 batches: too short for 3 rungs.
    with pytest.raises(grpc.RpcError) as info:
        _create(
            api,
            searcher={**ASHA_EPOCHS, "max_length": {"epochs": 1}},
            hyperparameters=SPACE,
            records_per_epoch=100,
        )

    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "searcher.num_rungs" in (info.value.details() or "")


def test_preview_shows_the_masters_batches(tmp_path: Any) -> None:
    path = tmp_path / "config.yaml"
    data = yaml.safe_load(
        experiment_yaml(searcher=ASHA_EPOCHS, hyperparameters=SPACE, records_per_epoch=60000)
    )
    path.write_text(yaml.safe_dump(data))

    result = CliRunner().invoke(cli, ["preview-search", "--json", str(path)])

    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["unit"] == "batches"
    assert [r["length"] for r in plan["brackets"][0]["rungs"]] == [300, 750, 1875]
