"""Shared pieces of the searcher tests: a search space, a synthetic objective, configs."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Any

from assay.config import Categorical, Const, Double, HParam, Int, Length, Log, SearcherConfig

SPACE: dict[str, HParam] = {
    "global_batch_size": Const(32),
    "lr": Log(-5.0, 0.0, 10.0, 4),
    "optimizer": Categorical(("sgd", "adam", "rmsprop")),
    "model": {"width": Int(16, 64, 3), "dropout": Double(0.0, 0.5, 2)},
}


def objective(hparams: Mapping[str, Any], length: int, seed: int) -> float:
    """A loss that falls with training like a power law; its floor depends on the
    hyperparameters (best lr 1e-2.5, adam best), plus a little deterministic noise."""
    lr = math.log10(hparams["lr"])
    floor = 0.1 + 0.05 * (lr + 2.5) ** 2 + (0.0 if hparams["optimizer"] == "adam" else 0.1)
    noise = random.Random(seed * 1_000_003 + length).gauss(0.0, 0.01)
    return float(floor + 2.0 * length**-0.5 + noise)


def config(
    name: str,
    *,
    max_length: int = 1000,
    max_trials: int | None = None,
    max_concurrent_trials: int = 0,
    smaller_is_better: bool = True,
    **options: Any,
) -> SearcherConfig:
    return SearcherConfig(
        name=name,
        metric="loss",
        max_length=Length.batches(max_length),
        smaller_is_better=smaller_is_better,
        max_trials=max_trials,
        max_concurrent_trials=max_concurrent_trials,
        options=options,
    )
