"""Validation metrics do not depend on the number of slots: the same weights validated on
1, 2 and 3 slots (real gloo processes on CPU), in batches of the per-slot batch size with
a short last batch and uneven shares of batches between the ranks, give the metrics of
the whole validation set computed in plain PyTorch (tests/fixtures/validation).

The AVG reducer weighs each batch by its number of samples (or by the count that
evaluate_batch returns); Reducer.BATCH_AVG, Determined's per-batch mean, moves with the
batches. The Lightning adapter's twin is in tests/test_lightning.py."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import assay
from assay.errors import TrainingError
from tests.conftest import regression_config

FIXTURE = Path(__file__).parent / "fixtures" / "validation"
sys.path.insert(0, str(FIXTURE))
from validation_trial import batch_mean_accuracy, reference  # noqa: E402

TOL = 1e-6
SLOTS = (1, 2, 3)  # per-slot batches of 12, 6 and 4 over 50 samples: 5, 9 and 13 batches


def validate(
    tmp_path: Path, entrypoint: str, slots: int, strategy: str = "ddp", **hparams: Any
) -> dict[str, float]:
    """The validation metrics of a 1-batch run at lr 0 (the weights stay as drawn)."""
    project = tmp_path / f"{strategy}-{slots}"
    shutil.copytree(FIXTURE, project, ignore=shutil.ignore_patterns("__pycache__"))
    config = {
        "name": "validation-weights",
        "entrypoint": entrypoint,
        "hyperparameters": {"global_batch_size": 12, **hparams},
        "searcher": {"name": "single", "metric": "val_acc", "max_length": {"batches": 1}},
        "resources": {"slots_per_trial": slots},
        "optimizations": {"strategy": strategy},
        "max_restarts": 0,
    }
    result = assay.run_local(config=config, model_dir=project, checkpoint_dir=project / "c")
    assert result.total_batches == 1
    return result.validation_metrics


def assert_whole_set(runs: dict[int, dict[str, float]], expected: dict[str, float]) -> None:
    for name, value in expected.items():
        got = {slots: metrics[name] for slots, metrics in runs.items()}
        assert all(abs(v - value) <= TOL for v in got.values()), (name, value, got)
        assert max(got.values()) - min(got.values()) <= TOL, (name, got)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_trial_api_metrics_are_the_whole_sets_on_1_2_and_3_slots(tmp_path: Path) -> None:
    runs = {slots: validate(tmp_path, "validation_trial:ValidationTrial", slots) for slots in SLOTS}

    assert_whole_set(runs, reference())
    # BATCH_AVG is the mean over every batch of every rank, each batch counting once:
    # it moves with the batch size, as Determined's AVG does.
    batch_means = {slots: runs[slots]["batch_val_acc"] for slots in SLOTS}
    for slots, value in batch_means.items():
        assert value == pytest.approx(batch_mean_accuracy(12 // slots), abs=TOL)
    assert max(batch_means.values()) - min(batch_means.values()) > 1e-3


@pytest.mark.slow
def test_under_fsdp_the_batch_a_rank_repeats_to_keep_step_is_not_counted(tmp_path: Path) -> None:
    # 13 batches on 3 ranks: 5, 4 and 4. Under FSDP every forward is a collective, so
    # ranks 1 and 2 evaluate their last batch once more; it is left out of the metrics.
    metrics = validate(tmp_path, "validation_trial:ValidationTrial", 3, strategy="fsdp")

    for name, value in reference().items():
        assert metrics[name] == pytest.approx(value, abs=TOL), name
    assert metrics["batch_val_acc"] == pytest.approx(batch_mean_accuracy(4), abs=TOL)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_trainer_api_weighs_by_the_count_evaluate_batch_returns(tmp_path: Path) -> None:
    # evaluate_batch returns (metrics, tokens in the batch): means over tokens.
    runs = {
        slots: validate(tmp_path, "python3 trainer_fit.py", slots, tokens=True) for slots in SLOTS
    }

    expected = reference(tokens=True)
    assert_whole_set(runs, expected)
    assert abs(expected["val_loss"] - reference()["val_loss"]) > 1e-3  # tokens matter


# --- one slot, in this process --------------------------------------------------------


def _data(n: int) -> TensorDataset:
    g = torch.Generator().manual_seed(4)
    return TensorDataset(torch.randn(n, 3, generator=g), torch.randn(n, 1, generator=g))


class _Stream(IterableDataset[Any]):
    """7 samples, values 0 to 6, with their text; `text_only`: the text alone."""

    def __init__(self, text_only: bool) -> None:
        self.text_only = text_only

    def __iter__(self) -> Any:
        for i in range(7):
            yield f"sample {i}" if self.text_only else (torch.full((1,), float(i)), f"s{i}")


class WeightTrial(assay.Trial):
    """A linear model at lr 0 validated on 23 samples in batches of 5 (the last one 3).
    hparams: `mode` default | batch_avg | tokens | bad_count | stream | text."""

    def __init__(self, context: assay.TrialContext) -> None:
        self.context = context
        self.mode = context.get_hparams().get("mode", "default")
        torch.manual_seed(1)
        self.model = context.wrap_model(nn.Linear(3, 1))
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.0))

    def build_training_data_loader(self) -> DataLoader[Any]:
        return DataLoader(_data(8), batch_size=self.context.get_per_slot_batch_size())

    def build_validation_data_loader(self) -> DataLoader[Any]:
        if self.mode in ("stream", "text"):
            return DataLoader(_Stream(self.mode == "text"), batch_size=3)
        return DataLoader(_data(23), batch_size=5)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        return loss

    def evaluate_batch(self, batch: Any) -> Any:
        if self.mode == "text":
            return {"val_loss": float(len(batch))}
        if self.mode == "stream":
            return {"val_loss": batch[0].mean()}
        x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        if self.mode == "tokens":  # each sample stands for 2 tokens
            return {"val_loss": loss}, 2 * len(x)
        if self.mode == "bad_count":
            return {"val_loss": loss}, -len(x)
        return {"val_loss": loss}

    def evaluation_reducer(self) -> assay.Reducer:
        return assay.Reducer.BATCH_AVG if self.mode == "batch_avg" else assay.Reducer.AVG


def _validate(tmp_path: Path, mode: str) -> dict[str, float]:
    config = regression_config(batches=1, global_batch_size=4, mode=mode)
    result = assay.run_local(WeightTrial, config, checkpoint_dir=tmp_path)
    return result.validation_metrics


def _losses() -> tuple[float, float]:
    """The MSE over the 23 samples at once, and the mean of the 5 batches' MSEs."""
    torch.manual_seed(1)
    model = nn.Linear(3, 1)
    x, y = _data(23).tensors
    with torch.no_grad():
        whole = float(nn.functional.mse_loss(model(x), y))
        batches = [
            float(nn.functional.mse_loss(model(x[i : i + 5]), y[i : i + 5]))
            for i in range(0, 23, 5)
        ]
    return whole, sum(batches) / len(batches)


def test_one_slot_averages_over_the_samples_and_batch_avg_over_the_batches(
    tmp_path: Path,
) -> None:
    whole, per_batch = _losses()
    assert abs(whole - per_batch) > 1e-3  # the short last batch matters here
    assert _validate(tmp_path / "a", "default")["val_loss"] == pytest.approx(whole, abs=1e-6)
    assert _validate(tmp_path / "b", "batch_avg")["val_loss"] == pytest.approx(per_batch, abs=1e-6)
    # A count of 2 per sample weighs every batch as its samples do.
    assert _validate(tmp_path / "c", "tokens")["val_loss"] == pytest.approx(whole, abs=1e-6)


def test_a_bad_count_from_evaluate_batch_fails_the_trial_naming_it(tmp_path: Path) -> None:
    with pytest.raises(TrainingError, match="num_samples must be finite and >= 0, got -5"):
        _validate(tmp_path, "bad_count")


def test_an_iterable_datasets_batches_are_counted_by_their_first_tensor(tmp_path: Path) -> None:
    # Batches of 3, 3 and 1 samples (values 0 to 6): 3.0, where the batch mean is 3.67.
    assert _validate(tmp_path / "a", "stream")["val_loss"] == pytest.approx(3.0, abs=1e-9)
    # Batches of text alone: nothing to count them by.
    with pytest.raises(TrainingError, match="cannot tell how many samples a validation batch"):
        _validate(tmp_path / "b", "text")
