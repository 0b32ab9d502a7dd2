"""TrialContext and Trial hooks: schedulers, reducers, lengths in epochs, iterable data."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import assay
from assay import MetricReducer, Reducer
from tests.conftest import REGRESSION_DIR, regression_config


def _run(tmp_path: Path, **kwargs: Any) -> assay.LocalResult:
    return assay.run_local(
        config=regression_config(**kwargs), model_dir=REGRESSION_DIR, checkpoint_dir=tmp_path
    )


@pytest.mark.parametrize(
    ("mode", "expected_steps"),
    [("batch", 8), ("optimizer_step", 4), ("epoch", 2), ("manual", 0)],
)
def test_lr_scheduler_step_modes(tmp_path: Path, mode: str, expected_steps: int) -> None:
    # 64 samples / 16 per batch = 4 batches an epoch; 8 batches = 2 epochs; k=2.
    result = _run(tmp_path, batches=8, aggregation=2, scheduler=mode, n_train=64, scheduling_unit=8)
    sd = torch.load(Path(str(result.checkpoint)) / "lr_schedulers.pt", weights_only=True)
    assert sd[0]["last_epoch"] == expected_steps


def test_max_length_in_epochs_uses_the_loader_length(tmp_path: Path) -> None:
    config = regression_config(batches=1, n_train=64)
    config["searcher"]["max_length"] = {"epochs": 3}
    config["min_validation_period"] = {"epochs": 1}
    result = assay.run_local(config=config, model_dir=REGRESSION_DIR, checkpoint_dir=tmp_path)
    assert result.total_batches == 12
    assert [v["total_batches"] for v in result.validation_history] == [4, 8, 12]
    assert [v["epoch"] for v in result.validation_history] == [1, 2, 3]


class _Concat(MetricReducer):
    """A custom reducer that needs every value: the median of all batch values."""

    def __init__(self) -> None:
        self.values: list[float] = []

    def reset(self) -> None:
        self.values = []

    def update(self, value: Any) -> None:
        self.values.append(float(value))

    def per_slot_reduce(self) -> list[float]:
        return self.values

    def cross_slot_reduce(self, per_slot: Sequence[Any]) -> float:
        merged: list[float] = sorted(v for values in per_slot for v in values)
        return merged[len(merged) // 2]


class ReducerTrial(assay.Trial):
    """Validation batches carry known values 0..9 so every reduction is checkable."""

    def __init__(self, context: assay.TrialContext) -> None:
        self.context = context
        self.model = context.wrap_model(nn.Linear(1, 1))
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.0))

    def build_training_data_loader(self) -> DataLoader[Any]:
        return DataLoader(TensorDataset(torch.zeros(8, 1)), batch_size=2)

    def build_validation_data_loader(self) -> DataLoader[Any]:
        return DataLoader(TensorDataset(torch.arange(10.0)), batch_size=1)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> torch.Tensor:
        loss: torch.Tensor = self.model(batch[0]).sum()
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        return loss

    def evaluate_batch(self, batch: Any) -> dict[str, Any]:
        v = batch[0][0]
        return {"avg": v, "sum": v, "min": v, "max": v, "median": v}

    def evaluation_reducer(self) -> Reducer | dict[str, Reducer | MetricReducer]:
        return {
            "sum": Reducer.SUM,
            "min": Reducer.MIN,
            "max": Reducer.MAX,
            "median": _Concat(),
        }


def test_evaluation_reducers(tmp_path: Path) -> None:
    config = regression_config(batches=2, global_batch_size=2)
    config["searcher"]["metric"] = "avg"
    result = assay.run_local(ReducerTrial, config, checkpoint_dir=tmp_path)
    assert result.validation_metrics == {
        "avg": 4.5,
        "sum": 45.0,
        "min": 0.0,
        "max": 9.0,
        "median": 5.0,
    }


class _Stream(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        g = torch.Generator().manual_seed(0)
        for _ in range(40):
            x = torch.randn(8, generator=g)
            yield x, x.sum(0, keepdim=True)


class StreamTrial(ReducerTrial):
    def __init__(self, context: assay.TrialContext) -> None:
        self.context = context
        self.model = context.wrap_model(nn.Linear(8, 1))
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.05))

    def build_training_data_loader(self) -> DataLoader[Any]:
        return DataLoader(_Stream(), batch_size=self.context.get_per_slot_batch_size())

    def build_validation_data_loader(self) -> DataLoader[Any]:
        return DataLoader(_Stream(), batch_size=10)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        return loss

    def evaluate_batch(self, batch: Any) -> dict[str, Any]:
        x, y = batch
        return {"val_loss": nn.functional.mse_loss(self.model(x), y)}

    def evaluation_reducer(self) -> Reducer | dict[str, Reducer | MetricReducer]:
        return Reducer.AVG


def test_iterable_datasets_train_across_epochs(tmp_path: Path) -> None:
    # 40 samples / 4 per batch = 10 batches an epoch; 25 batches cross two epochs.
    config = regression_config(batches=25, global_batch_size=4)
    result = assay.run_local(StreamTrial, config, checkpoint_dir=tmp_path)
    assert result.total_batches == 25
    first, last = result.training_history[0], result.training_history[-1]
    assert last["metrics"]["loss"] < first["metrics"]["loss"]
    assert last["epoch"] == 2


def test_epoch_lengths_need_a_sized_loader(tmp_path: Path) -> None:
    config = regression_config(batches=1, global_batch_size=4)
    config["searcher"]["max_length"] = {"epochs": 1}
    with pytest.raises(assay.InvalidConfigError, match="known length"):
        assay.run_local(StreamTrial, config, checkpoint_dir=tmp_path)


def _context(**hparams: Any) -> assay.TrialContext:
    from assay._precision import PrecisionPlugin
    from assay.config import parse_config

    config = parse_config(regression_config(batches=4, global_batch_size=8, slots=2))
    return assay.TrialContext(
        config=config,
        hparams={"global_batch_size": 8, "lr": 0.1, **hparams},
        distributed=assay.DistributedContext(rank=1, size=2, local_rank=1, local_size=2),
        device=torch.device("cpu"),
        precision=PrecisionPlugin(torch.device("cpu")),
    )


def test_context_accessors_and_errors() -> None:
    ctx = _context(nested={"a": 1})
    assert ctx.get_per_slot_batch_size() == 4
    assert ctx.get_global_batch_size() == 8
    assert ctx.get_hparam("nested") == {"a": 1}
    with pytest.raises(
        assay.HyperparameterError, match="'lrr' is not defined.*global_batch_size, lr"
    ):
        ctx.get_hparam("lrr")
    with pytest.raises(assay.TrainingError, match="wrap_model before context.wrap_optimizer"):
        ctx.wrap_optimizer(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1))
    with pytest.raises(assay.TrainingError, match="step_mode must be one of"):
        ctx.wrap_lr_scheduler(object(), step_mode="sometimes")
    assert ctx.get_experiment_config()["name"] == "regression"
    assert ctx.distributed.rank == 1


def test_a_trials_distributed_context_answers_determineds_accessors() -> None:
    """A Trial ported from Determined calls `context.distributed.get_rank()` and the
    Core API's collectives; they answer as `assay.core`'s context does."""
    from assay.core._distributed import DistributedContext as CoreContext

    numbers = {"rank": 5, "size": 8, "local_rank": 1, "local_size": 4}
    numbers |= {"cross_rank": 1, "cross_size": 2}
    trial = assay.DistributedContext(**numbers)
    core = CoreContext(**numbers)  # type: ignore[arg-type]  # chief_ip is not among them
    for name in ("rank", "size", "local_rank", "local_size", "cross_rank", "cross_size"):
        assert getattr(trial, f"get_{name}")() == getattr(core, f"get_{name}")() == numbers[name]
    assert (trial.is_chief, trial.is_local_chief) == (core.is_chief, core.is_local_chief)
    assert (trial.is_chief, trial.is_local_chief) == (False, False)
    one = assay.DistributedContext()
    assert (one.gather("x"), one.allgather_local("x"), one.gather_local("x")) == (["x"],) * 3
    assert one.broadcast_local("x") == "x"


def _two_ranks(rank: int, init_file: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        context = assay.DistributedContext(rank=rank, size=2, local_rank=rank, local_size=2)
        got = (
            context.gather(rank * 10),
            context.allgather_local(rank),
            context.gather_local(rank),
            context.broadcast_local(f"from {rank}"),
        )
        torch.save(got, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_a_trials_context_gathers_on_two_ranks(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    out = str(tmp_path / "got")
    args = (str(tmp_path / "init"), out)
    mp.spawn(_two_ranks, args=args, nprocs=2)  # type: ignore[attr-defined,no-untyped-call]
    assert torch.load(f"{out}.0") == ([0, 10], [0, 1], [0, 1], "from 0")
    assert torch.load(f"{out}.1") == (None, [0, 1], None, "from 0")


def test_distributed_context_reads_torchrun_variables() -> None:
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}
    d = assay.DistributedContext.from_env(env)
    assert (d.rank, d.size, d.local_rank, d.local_size) == (5, 8, 1, 4)
    assert (d.cross_rank, d.cross_size) == (1, 2)
    assert not d.is_chief
    with pytest.raises(ValueError, match="outside WORLD_SIZE"):
        assay.DistributedContext.from_env({"RANK": "2", "WORLD_SIZE": "2"})


def test_train_batch_must_return_scalars(tmp_path: Path) -> None:
    class Bad(StreamTrial):
        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> torch.Tensor:
            super().train_batch(batch, epoch_idx, batch_idx)
            return torch.zeros(3)

    with pytest.raises(assay.TrainingError, match="tensor of shape \\(3,\\); return scalars"):
        assay.run_local(
            Bad, regression_config(batches=2, global_batch_size=4), checkpoint_dir=tmp_path
        )


def test_an_empty_training_loader_is_an_error_even_with_epoch_lengths(tmp_path: Path) -> None:
    config = regression_config(batches=1, global_batch_size=16, n_train=8)
    config["searcher"]["max_length"] = {"epochs": 2}

    class DropAll(StreamTrial):
        def build_training_data_loader(self) -> DataLoader[Any]:
            data = TensorDataset(torch.zeros(8, 8), torch.zeros(8, 1))
            return DataLoader(data, batch_size=16, drop_last=True)

    with pytest.raises(assay.TrainingError, match="training data loader has no batches"):
        assay.run_local(DropAll, config, checkpoint_dir=tmp_path)


seen_lrs: list[float] = []


class WarmupTrial(assay.Trial):
    """A per-batch warmup, lr = step / 8, under the config's accumulation and frequency;
    records the lr of every optimizer step."""

    def __init__(self, context: assay.TrialContext) -> None:
        self.context = context
        self.model = context.wrap_model(nn.Linear(1, 1))
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=1.0))
        warmup = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda step: step / 8)
        self.sched = context.wrap_lr_scheduler(
            warmup, "batch", frequency=context.get_hparam("frequency")
        )

    def build_training_data_loader(self) -> DataLoader[Any]:
        return DataLoader(TensorDataset(torch.ones(64, 1)), batch_size=1)

    def build_validation_data_loader(self) -> DataLoader[Any]:
        return DataLoader(TensorDataset(torch.ones(2, 1)), batch_size=1)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> torch.Tensor:
        loss: torch.Tensor = self.model(batch[0]).pow(2).mean()
        self.context.backward(loss)
        if self.context.is_gradient_sync_step():
            seen_lrs.append(self.opt.param_groups[0]["lr"])
        self.context.step_optimizer(self.opt)
        return loss

    def evaluate_batch(self, batch: Any) -> dict[str, Any]:
        return {"val_loss": self.model(batch[0]).pow(2).mean()}


def _warmup_config(batches: int, aggregation: int, frequency: int) -> dict[str, Any]:
    return {
        "name": "warmup",
        "entrypoint": "test_context:WarmupTrial",
        "hyperparameters": {"global_batch_size": 1, "frequency": frequency},
        "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": batches}},
        "optimizations": {"aggregation_frequency": aggregation},
        "min_checkpoint_period": {"batches": 4},
    }


def test_a_per_batch_schedule_never_runs_ahead_of_the_optimizer(tmp_path: Path) -> None:
    seen_lrs.clear()
    assay.run_local(WarmupTrial, _warmup_config(12, 4, 1), checkpoint_dir=tmp_path)
    # As in Determined: the first step uses lr 0; the 4 batches of each accumulation
    # step the schedule after its optimizer step (before: 3/8, then 7/8).
    assert seen_lrs == [0.0, 0.5, 1.0]


def test_a_schedulers_frequency_count_survives_a_restore(tmp_path: Path) -> None:
    seen_lrs.clear()
    straight = assay.run_local(WarmupTrial, _warmup_config(9, 1, 3), checkpoint_dir=tmp_path / "a")
    expected = list(seen_lrs)
    seen_lrs.clear()
    first = assay.run_local(WarmupTrial, _warmup_config(4, 1, 3), checkpoint_dir=tmp_path / "b")
    resumed = assay.run_local(
        WarmupTrial,
        _warmup_config(9, 1, 3),
        checkpoint_dir=tmp_path / "b",
        resume_from=first.checkpoint,
    )
    assert seen_lrs == expected  # steps at batches 3, 6, 9 in both
    assert resumed.validation_metrics == straight.validation_metrics


class LeftoverTrial(assay.Trial):
    """Leaves gradients after its optimizer step (a second backward, as some GAN loops
    do): the next step uses them, so they are part of what a checkpoint must carry."""

    def __init__(self, context: assay.TrialContext) -> None:
        self.context = context
        torch.manual_seed(0)
        self.model = context.wrap_model(nn.Linear(2, 1))
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.1))

    def build_training_data_loader(self) -> DataLoader[Any]:
        x = torch.randn(32, 2, generator=torch.Generator().manual_seed(1))
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=2)

    def build_validation_data_loader(self) -> DataLoader[Any]:
        x = torch.randn(4, 2, generator=torch.Generator().manual_seed(2))
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=2)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss: torch.Tensor = nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        self.model(x).pow(2).mean().backward()  # left for the next step
        return loss

    def evaluate_batch(self, batch: Any) -> dict[str, Any]:
        x, y = batch
        return {"val_loss": nn.functional.mse_loss(self.model(x), y)}


def test_gradients_left_after_a_step_survive_a_restore(tmp_path: Path) -> None:
    def config(batches: int) -> dict[str, Any]:
        return {
            "name": "leftover",
            "entrypoint": "test_context:LeftoverTrial",
            "hyperparameters": {"global_batch_size": 2},
            "searcher": {
                "name": "single",
                "metric": "val_loss",
                "max_length": {"batches": batches},
            },
            "min_checkpoint_period": {"batches": 4},
        }

    straight = assay.run_local(LeftoverTrial, config(8), checkpoint_dir=tmp_path / "a")
    first = assay.run_local(LeftoverTrial, config(4), checkpoint_dir=tmp_path / "b")
    assert first.checkpoint is not None
    assert (Path(str(first.checkpoint)) / "gradients.pt").is_file()
    resumed = assay.run_local(
        LeftoverTrial, config(8), checkpoint_dir=tmp_path / "b", resume_from=first.checkpoint
    )
    assert resumed.validation_metrics == straight.validation_metrics  # bit for bit
