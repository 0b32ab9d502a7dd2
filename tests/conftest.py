"""Shared helpers: the regression fixture's model directory and config builder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
REGRESSION_DIR = FIXTURES / "regression"


def regression_config(
    *,
    batches: int,
    global_batch_size: int = 16,
    slots: int = 1,
    aggregation: int = 1,
    precision: str = "off",
    scheduling_unit: int = 4,
    validation_period: int | None = None,
    checkpoint_period: int | None = None,
    seed: int = 3,
    **hparams: Any,
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "name": "regression",
        "entrypoint": "model_def:RegressionTrial",
        "hyperparameters": {"global_batch_size": global_batch_size, "lr": 0.05, **hparams},
        "searcher": {
            "name": "single",
            "metric": "val_loss",
            "max_length": {"batches": batches},
        },
        "resources": {"slots_per_trial": slots},
        "optimizations": {"aggregation_frequency": aggregation, "mixed_precision": precision},
        "scheduling_unit": scheduling_unit,
        "reproducibility": {"experiment_seed": seed},
    }
    if validation_period:
        config["min_validation_period"] = {"batches": validation_period}
    if checkpoint_period:
        config["min_checkpoint_period"] = {"batches": checkpoint_period}
    return config


@pytest.fixture
def regression_dir() -> Path:
    return REGRESSION_DIR
