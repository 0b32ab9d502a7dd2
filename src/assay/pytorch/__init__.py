"""Determined's PyTorch Trial and Trainer API on Assay.

Code written for Determined ports by changing one import::

    from assay import pytorch          # was: from determined import pytorch

    with pytorch.init(hparams=hparams) as context:
        trial = MyTrial(context)
        pytorch.Trainer(trial, context).fit(max_length=pytorch.Epoch(1))

`PyTorchTrial` is `assay.Trial` and `PyTorchTrialContext` is `assay.TrialContext`: the
same classes, so a Trial runs unchanged under `assay experiment create`, `assay trial
run-local` or `Trainer.fit`.
"""

from __future__ import annotations

from torch.utils.data import DataLoader

from assay._context import LRScheduler, StepMode
from assay._context import TrialContext as PyTorchTrialContext
from assay._trial import MetricReducer, PyTorchCallback, Reducer
from assay._trial import Trial as PyTorchTrial
from assay.pytorch._trainer import (
    Batch,
    Epoch,
    Trainer,
    TrainUnit,
    init,
    load_trial_from_checkpoint_path,
)

__all__ = [
    "Batch",
    "DataLoader",
    "Epoch",
    "LRScheduler",
    "MetricReducer",
    "PyTorchCallback",
    "PyTorchTrial",
    "PyTorchTrialContext",
    "Reducer",
    "StepMode",
    "TrainUnit",
    "Trainer",
    "init",
    "load_trial_from_checkpoint_path",
]
