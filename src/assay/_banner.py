"""The line a local run starts with: what it is about to train, said before torch loads.

Importing torch takes seconds; this module imports nothing heavy, so `assay trial
run-local` can say at once what it will train: the experiment's name, its slots and
device, its length and the hyperparameters it sampled (the ones the run will use).
"""

from __future__ import annotations

import importlib.metadata
import os
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from assay.config import ExperimentConfig, sample_hparams


def guess_device() -> str:
    """The device a local run will train on, told without importing torch: `cuda` when
    this machine shows an NVIDIA device to a CUDA build of torch, else `cpu`."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return "cpu"
    if not any(Path("/dev").glob("nvidia[0-9]*")):
        return "cpu"
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "cpu"
    return "cpu" if "+cpu" in version else "cuda"


def local_hparams(config: ExperimentConfig) -> dict[str, Any]:
    """The hyperparameters a local run trains with (drawn with `experiment_seed`)."""
    return sample_hparams(config.hyperparameters, random.Random(config.experiment_seed))


def banner(config: ExperimentConfig, device: str | None = None) -> str:
    """`run-local digits-const: 1 slot on cpu, 400 batches; lr=0.003 n_filters=16`."""
    slots = config.resources.slots_per_trial
    length = config.searcher.trial_length
    what = f"{length.value} {length.unit.value}" if length and length.bounded else "no max_length"
    device = device or guess_device()
    hparams = _format(local_hparams(config))
    precision = config.optimizations.mixed_precision
    if precision != "off":  # auto is resolved (and logged) once torch sees the device
        what += f", mixed_precision {precision}"
    return (
        f"run-local {config.name}: {slots} slot{'s' if slots != 1 else ''} on {device}, "
        f"{what}; {hparams or 'no hyperparameters'}"
    )


def _format(hparams: Mapping[str, Any]) -> str:
    def value(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    return " ".join(f"{k}={value(v)}" for k, v in sorted(hparams.items()))


__all__ = ["banner", "guess_device", "local_hparams"]
