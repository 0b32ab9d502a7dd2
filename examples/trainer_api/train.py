"""Determined's Trainer API MNIST tutorial as Determined writes it, ported to Assay.

The changes from Determined's `train.py` are the imports (`import assay as det`, `from
assay import pytorch`) and the data (scikit-learn's bundled 8x8 digits, no download).

    python3 train.py                                      # local: one epoch
    assay trial run-local const.yaml .                    # as a cluster slot would run it
    assay experiment create const.yaml .                  # on a cluster
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset

import assay as det
from assay import pytorch

HPARAMS = {
    "global_batch_size": 32,
    "learning_rate": 1.0,
    "gamma": 0.7,
    "n_filters1": 8,
    "n_filters2": 16,
    "dropout1": 0.25,
    "dropout2": 0.5,
}


def digits(train: bool) -> TensorDataset:
    data = load_digits()
    images = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(data.target, dtype=torch.int64)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    cut = int(0.8 * len(labels))
    chosen = order[:cut] if train else order[cut:]
    return TensorDataset(images[chosen], labels[chosen])


class Net(nn.Module):
    def __init__(self, hparams: dict[str, Any]) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, hparams["n_filters1"], 3, 1, padding=1)
        self.conv2 = nn.Conv2d(hparams["n_filters1"], hparams["n_filters2"], 3, 1, padding=1)
        self.dropout1 = nn.Dropout(hparams["dropout1"])
        self.dropout2 = nn.Dropout(hparams["dropout2"])
        self.fc1 = nn.Linear(hparams["n_filters2"] * 16, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv1(x))
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = self.dropout1(torch.flatten(x, 1))
        x = self.dropout2(torch.relu(self.fc1(x)))
        return torch.log_softmax(self.fc2(x), dim=1)


class MNistTrial(pytorch.PyTorchTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext, hparams: dict[str, Any]) -> None:
        self.context = context
        self.model = context.wrap_model(Net(hparams))
        self.optimizer = context.wrap_optimizer(
            torch.optim.Adadelta(self.model.parameters(), lr=hparams["learning_rate"])
        )
        self.scheduler = context.wrap_lr_scheduler(
            torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=1, gamma=hparams["gamma"]),
            step_mode=pytorch.LRScheduler.StepMode.STEP_EVERY_EPOCH,
        )

    def build_training_data_loader(self) -> pytorch.DataLoader[Any]:
        return pytorch.DataLoader(
            digits(train=True), batch_size=self.context.get_per_slot_batch_size(), shuffle=True
        )

    def build_validation_data_loader(self) -> pytorch.DataLoader[Any]:
        return pytorch.DataLoader(
            digits(train=False), batch_size=self.context.get_per_slot_batch_size()
        )

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        data, labels = batch
        loss = torch.nn.functional.nll_loss(self.model(data), labels)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return {"loss": loss}

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        data, labels = batch
        output = self.model(data)
        validation_loss = torch.nn.functional.nll_loss(output, labels).item()
        accuracy = (output.argmax(dim=1) == labels).float().mean().item()
        return {"validation_loss": validation_loss, "accuracy": accuracy}


def run(max_length: pytorch.TrainUnit | None, local: bool = False) -> None:
    info = det.get_cluster_info()
    if local:
        hparams: dict[str, Any] = dict(HPARAMS)
        latest_checkpoint = None
    else:
        assert info is not None
        hparams = info.trial.hparams
        latest_checkpoint = info.latest_checkpoint
    # Off the cluster, init() takes the hyperparameters (global_batch_size included); on a
    # cluster and under run-local they come from the experiment.
    with pytorch.init(hparams=hparams if local else None) as train_context:
        trial = MNistTrial(train_context, hparams=hparams)
        trainer = pytorch.Trainer(trial, train_context)
        trainer.fit(
            max_length=max_length,
            latest_checkpoint=latest_checkpoint,
            validation_period=pytorch.Batch(20),
        )


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    local_training = det.get_cluster_info() is None
    # On a cluster (and under run-local) the searcher's max_length decides.
    run(pytorch.Epoch(1) if local_training else None, local=local_training)
