"""`assay.load_checkpoint`: a trained Trial's weights back from its checkpoint directory.

The checkpoint comes from a real `run_local`; the ground truth is the model the run
trained, as its last checkpoint saved it. (Loading by UUID from a master is tested with a
real local cluster in tests/cli/test_local_cluster.py.)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

import assay
from assay._checkpoint import CheckpointError
from assay.errors import AssayError
from tests.conftest import REGRESSION_DIR, regression_config
from tests.fixtures.regression.model_def import RegressionTrial, make_data


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The last checkpoint of a 16-batch regression run."""
    root = tmp_path_factory.mktemp("checkpoints")
    config = regression_config(batches=16, checkpoint_period=8)
    result = assay.run_local(RegressionTrial, config, model_dir=REGRESSION_DIR, checkpoint_dir=root)
    assert result.checkpoint is not None
    return Path(result.checkpoint)


def test_the_models_state_comes_back_with_what_trained_it(trained: Path) -> None:
    loaded = assay.load_checkpoint(trained)

    saved = torch.load(trained / "models.pt", weights_only=True)
    assert loaded.path == trained
    assert loaded.uuid == json.loads((trained / "metadata.json").read_text())["uuid"]
    assert loaded.total_batches == 16
    assert loaded.hparams["lr"] == 0.05
    assert len(loaded.models) == 1
    assert loaded.models[0].keys() == saved[0].keys()
    for name, tensor in saved[0].items():
        assert torch.equal(loaded.models[0][name], tensor)


def test_the_trial_is_rebuilt_with_its_weights_for_inference(trained: Path) -> None:
    loaded = assay.load_checkpoint(str(trained))

    trial = loaded.load_trial(RegressionTrial)

    assert isinstance(trial, RegressionTrial)
    assert not trial.model.training
    for name, tensor in trial.model.state_dict().items():
        assert torch.equal(tensor, loaded.models[0][name])
    x, y = make_data(64, seed=2).tensors
    with torch.no_grad():
        trained_loss = torch.nn.functional.mse_loss(trial.model(x), y).item()
    untrained = torch.nn.functional.mse_loss(torch.zeros_like(y), y).item()
    assert trained_loss < untrained / 2  # these are weights that learned the data


def _copy(trained: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(trained, copy)
    return copy


def test_a_damaged_checkpoint_is_refused(trained: Path, tmp_path: Path) -> None:
    copy = _copy(trained, tmp_path)
    data = bytearray((copy / "models.pt").read_bytes())
    data[-1] ^= 0xFF
    (copy / "models.pt").write_bytes(bytes(data))

    with pytest.raises(CheckpointError, match=r"models\.pt fails its sha256"):
        assay.load_checkpoint(copy)


def test_a_directory_that_is_no_checkpoint_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="is not a checkpoint: it has no metadata.json"):
        assay.load_checkpoint(tmp_path)


@pytest.mark.parametrize("source", ["checkpoints/nope", "1234", "not-a-uuid"])
def test_a_source_that_is_neither_path_nor_uuid_is_named(source: str) -> None:
    with pytest.raises(AssayError, match="is neither a checkpoint directory nor a checkpoint UUID"):
        assay.load_checkpoint(source)


def test_a_trial_with_other_models_is_refused(trained: Path) -> None:
    class TwoModels(RegressionTrial):
        def __init__(self, context: Any) -> None:
            super().__init__(context)
            self.other = context.wrap_model(torch.nn.Linear(2, 2))

    with pytest.raises(assay.TrialLoadError, match="holds 1 models but"):
        assay.load_checkpoint(trained).load_trial(TwoModels)


def test_an_unreachable_master_is_named_for_a_uuid() -> None:
    from assay._rank_processes import free_port

    address = f"127.0.0.1:{free_port()}"

    with pytest.raises(AssayError, match=f"cannot reach the master at {address}"):
        assay.load_checkpoint("0b6e2c59-5d0e-4f7c-9d1a-3a2b1c0d9e8f", master=address)
