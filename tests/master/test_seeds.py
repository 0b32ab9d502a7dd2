"""Each experiment searches with its own seed: one the config sets, else one the master
draws and stores with the config, so that a restarted master goes on with the same search.

A real master on loopback; a scripted agent plays the trials (tests/master/test_search.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from google.protobuf.json_format import MessageToDict

from assay.master._server import MasterServer
from assay.proto import api_pb2, api_pb2_grpc
from tests.credentials import authed_channel, master_config
from tests.master.conftest import ScriptedAgent, experiment_yaml, model_archive
from tests.master.test_search import SPACE, Harness, _ended, _state
from tests.store.conftest import seeded

RANDOM = {
    "name": "random",
    "metric": "loss",
    "max_length": {"batches": 2},
    "max_trials": 4,
    "max_concurrent_trials": 1,
}


def _create(api: api_pb2_grpc.ApiStub, *, activate: bool = True, **overrides: Any) -> int:
    request = api_pb2.CreateExperimentRequest(
        config_yaml=experiment_yaml(searcher=RANDOM, hyperparameters=SPACE, **overrides),
        model_definition=model_archive(),
        activate=activate,
    )
    eid: int = api.CreateExperiment(request).experiment.id
    return eid


def _seed(api: api_pb2_grpc.ApiStub, eid: int) -> int:
    config = MessageToDict(_state(api, eid).experiment.config)
    return int(config["reproducibility"]["experiment_seed"])


def _points(api: api_pb2_grpc.ApiStub, eid: int) -> list[tuple[float, int]]:
    """Each trial's lr and seed, in the order the search created them."""
    trials = sorted(_state(api, eid).trials, key=lambda t: t.id)
    return [(MessageToDict(t.hparams)["lr"], t.seed) for t in trials]


def test_each_experiment_of_one_config_gets_its_own_seed_and_points(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    first, second = _create(api, activate=False), _create(api, activate=False)

    assert _seed(api, first) != _seed(api, second)
    assert _points(api, first) != _points(api, second)
    # The text people read back says the seed was drawn, and parses to the stored config
    # but for that seed: a fork of it (the web UI's) draws its own.
    text = _state(api, first).experiment.config_yaml
    assert text.endswith(
        f"# reproducibility.experiment_seed: {_seed(api, first)} (drawn by the master: the "
        "config set none; set it to search the same points again)\n"
    )
    assert "reproducibility" not in yaml.safe_load(text)


def test_a_seed_set_in_the_config_gives_the_same_trials_as_before(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    drawn = _create(api, activate=False)
    seed = _seed(api, drawn)

    again = _create(api, activate=False, reproducibility={"experiment_seed": seed})

    assert _seed(api, again) == seed
    assert _points(api, again) == _points(api, drawn)
    text = _state(api, again).experiment.config_yaml
    assert "drawn by the master" not in text
    assert yaml.safe_load(text)["reproducibility"] == {"experiment_seed": seed}


def test_a_restarted_master_goes_on_with_the_drawn_seed(tmp_path: Path) -> None:
    config = master_config(state_dir=seeded(tmp_path / "master"))
    server = MasterServer(config)
    server.start()
    channel = authed_channel(f"127.0.0.1:{server.port}")
    api = api_pb2_grpc.ApiStub(channel)
    agent = ScriptedAgent(server.port, "a1", slots=1)
    harness = Harness(agent, server.port)
    eid = _create(api)
    seed = _seed(api, eid)
    harness.run_one()  # the first of 4 trials; the searcher proposes the rest one by one
    agent.close()
    channel.close()
    server.stop(grace=0)

    again = MasterServer(master_config(state_dir=config.state_dir))
    again.start()
    try:
        channel = authed_channel(f"127.0.0.1:{again.port}")
        api = api_pb2_grpc.ApiStub(channel)
        agent = ScriptedAgent(again.port, "a1", slots=1)
        resumed = Harness(agent, again.port)
        resumed.checkpoints = harness.checkpoints  # what the trials wrote before
        resumed.run_until(_ended(api, eid))
        # The same search, run through without a restart, from the seed set in a config.
        reference = _create(api, reproducibility={"experiment_seed": seed})
        resumed.run_until(_ended(api, reference))

        assert _seed(api, eid) == seed
        assert len(_points(api, eid)) == 4
        assert _points(api, eid) == _points(api, reference)
        agent.close()
        channel.close()
    finally:
        again.stop(grace=0)
