"""Choosing a strategy from the config, and `setup`, the Core API's way in."""

from __future__ import annotations

import torch

from assay.config import FSDPConfig, OptimizationsConfig, Precision, StrategyName
from assay.errors import TrainingError
from assay.strategy._base import Ranks, Strategy
from assay.strategy._ddp import DDPStrategy
from assay.strategy._fsdp import FSDPStrategy
from assay.strategy._single import SingleDeviceStrategy


def make_strategy(
    optimizations: OptimizationsConfig, ranks: Ranks, device: torch.device
) -> Strategy:
    """The strategy `optimizations.strategy` names; one process needs no wrapper.
    `mixed_precision: auto` is resolved for `device` first, so FSDP's precision policy
    follows what auto picks."""
    from assay._precision import resolve_precision

    return strategy_for(
        optimizations.strategy,
        ranks,
        device,
        fsdp=optimizations.fsdp,
        precision=resolve_precision(optimizations.mixed_precision, device),
    )


def strategy_for(
    name: StrategyName | str,
    ranks: Ranks,
    device: torch.device,
    *,
    fsdp: FSDPConfig | None = None,
    precision: Precision = "off",
) -> Strategy:
    if name not in ("ddp", "fsdp"):
        raise TrainingError(f"strategy must be ddp or fsdp, got {name!r}")
    if ranks.size == 1:
        return SingleDeviceStrategy(ranks, device)
    if name == "fsdp":
        return FSDPStrategy(ranks, device, fsdp, precision)
    return DDPStrategy(ranks, device)
