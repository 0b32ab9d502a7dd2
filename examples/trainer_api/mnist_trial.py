"""The tutorial's model, data and Trial (Determined keeps them in `model_def.py`)."""

from __future__ import annotations

from typing import Any

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset

from assay import pytorch


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
