"""Mixed precision: autocast, fp16 loss scaling with skipped steps, bf16 without a scaler."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import assay
from assay._context import TrialContext
from assay._distributed import DistributedContext
from assay._precision import BF16Precision, FP16Precision, PrecisionPlugin, make_precision
from assay.config import parse_config
from tests.conftest import REGRESSION_DIR, regression_config

CPU = torch.device("cpu")


def _context(precision: PrecisionPlugin, aggregation: int = 1) -> TrialContext:
    config = parse_config(regression_config(batches=4, aggregation=aggregation))
    return TrialContext(
        config=config,
        hparams={"global_batch_size": 16, "lr": 0.1},
        distributed=DistributedContext(),
        device=CPU,
        precision=precision,
    )


def _step(
    ctx: TrialContext,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    batch: int,
    scale: float = 1.0,
    clip: Any = None,
) -> None:
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(batch))
    with ctx._begin_batch(0, batch), ctx._precision_plugin.autocast():
        loss = model(x).float().pow(2).mean() * scale
        ctx.backward(loss)
        ctx.step_optimizer(opt, clip_grads=clip)
    ctx._end_batch()


def test_fp16_skips_the_step_on_inf_gradients_and_lowers_the_scale() -> None:
    precision = FP16Precision(CPU)
    ctx = _context(precision)
    torch.manual_seed(0)
    model = ctx.wrap_model(nn.Linear(4, 2))
    opt = ctx.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    before = [p.detach().clone() for p in model.parameters()]
    scale = precision.scaler.get_scale()

    _step(ctx, model, opt, batch=0, scale=math.inf)  # planted inf

    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert precision.scaler.get_scale() == scale / 2
    _step(ctx, model, opt, batch=1)
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_fp16_unscales_before_clipping() -> None:
    precision = FP16Precision(CPU)
    ctx = _context(precision)
    torch.manual_seed(0)
    model = ctx.wrap_model(nn.Linear(4, 2))
    opt = ctx.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    seen: list[float] = []

    def clip(params: Any) -> None:
        seen.append(float(torch.nn.utils.clip_grad_norm_(list(params), 1e9)))

    # The true gradient norm, in fp32 without scaling.
    reference = nn.Linear(4, 2)
    reference.load_state_dict(model.state_dict())
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
    reference(x).pow(2).mean().backward()
    true_norm = float(torch.nn.utils.clip_grad_norm_(list(reference.parameters()), 1e9))

    _step(ctx, model, opt, batch=0, clip=clip)

    assert precision.scaler.get_scale() > 1000  # the loss really was scaled
    assert seen[0] == pytest.approx(true_norm, rel=1e-2)


def test_one_scaler_update_per_effective_batch() -> None:
    precision = FP16Precision(CPU)
    updates: list[int] = []
    original = precision.scaler.update

    def counting_update(new_scale: Any = None) -> None:
        updates.append(1)
        original(new_scale)

    precision.scaler.update = counting_update  # type: ignore[method-assign]
    ctx = _context(precision, aggregation=4)
    model = ctx.wrap_model(nn.Linear(4, 2))
    opt = ctx.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    for batch in range(8):
        _step(ctx, model, opt, batch)
    assert len(updates) == 2


def test_bf16_autocasts_and_has_no_scaler() -> None:
    precision = make_precision("bf16", CPU)
    assert isinstance(precision, BF16Precision)
    assert not hasattr(precision, "scaler")
    assert precision.state_dict() == {}
    with precision.autocast():
        out = nn.Linear(4, 4)(torch.randn(2, 4))
    assert out.dtype == torch.bfloat16


class DtypeTrial(assay.Trial):
    """Records the dtype its model produces inside train_batch and evaluate_batch."""

    seen: ClassVar[list[torch.dtype]] = []

    def __init__(self, context: assay.TrialContext) -> None:
        self.context = context
        self.model = context.wrap_model(nn.Linear(4, 1))
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.01))

    def build_training_data_loader(self) -> DataLoader[Any]:
        data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
        return DataLoader(data, batch_size=self.context.get_per_slot_batch_size())

    def build_validation_data_loader(self) -> DataLoader[Any]:
        return DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=8)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> torch.Tensor:
        x, y = batch
        out = self.model(x)
        DtypeTrial.seen.append(out.dtype)
        loss = nn.functional.mse_loss(out.float(), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        return loss

    def evaluate_batch(self, batch: Any) -> dict[str, Any]:
        x, y = batch
        out = self.model(x)
        DtypeTrial.seen.append(out.dtype)
        return {"val_loss": nn.functional.mse_loss(out.float(), y)}


@pytest.mark.parametrize(
    ("precision", "dtype"),
    [("bf16", torch.bfloat16), ("fp16", torch.float16), ("off", torch.float32)],
)
def test_autocast_is_active_in_train_and_evaluate_batch(
    tmp_path: Path, precision: str, dtype: torch.dtype
) -> None:
    DtypeTrial.seen = []
    config = regression_config(batches=4, precision=precision)
    result = assay.run_local(DtypeTrial, config, checkpoint_dir=tmp_path)
    assert result.total_batches == 4
    assert set(DtypeTrial.seen) == {dtype}
    assert len(DtypeTrial.seen) == 4 + 2


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_regression_trains_under_mixed_precision(tmp_path: Path, precision: str) -> None:
    # Only fp16 has a scaler to absorb an inf; bf16 trains plainly.
    planted = 5 if precision == "fp16" else None
    config = regression_config(
        batches=48, precision=precision, plant_inf_at=planted, scheduling_unit=16
    )
    result = assay.run_local(config=config, model_dir=REGRESSION_DIR, checkpoint_dir=tmp_path)
    losses = [r["metrics"]["loss"] for r in result.training_history]
    assert losses[-1] < losses[0] / 2
    assert math.isfinite(result.validation_metrics["val_loss"])
    weights = torch.load(Path(str(result.checkpoint)) / "models.pt", weights_only=True)[0]
    assert all(torch.isfinite(t).all() for t in weights.values())
    if precision == "fp16":
        scaler = torch.load(Path(str(result.checkpoint)) / "precision.pt", weights_only=True)
        assert scaler["scaler"]["scale"] < 65536.0  # the planted inf lowered it
