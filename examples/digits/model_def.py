"""A small CNN on scikit-learn's bundled 8x8 handwritten digits (no download needed)."""

from __future__ import annotations

from typing import Any

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from assay import Trial, TrialContext


def digits_split(train: bool) -> TensorDataset:
    """1,437 training and 360 validation images, scaled to [0, 1], in a fixed split."""
    data = load_digits()
    images = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(data.target, dtype=torch.int64)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    cut = int(0.8 * len(labels))
    chosen = order[:cut] if train else order[cut:]
    return TensorDataset(images[chosen], labels[chosen])


class Net(nn.Module):
    def __init__(self, n_filters: int, dropout: float) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, n_filters, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(n_filters, 2 * n_filters, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Dropout(dropout),
            nn.Linear(2 * n_filters * 16, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.features(x))
        return out


class DigitsTrial(Trial):
    def __init__(self, context: TrialContext) -> None:
        self.context = context
        self.model = context.wrap_model(
            Net(context.get_hparam("n_filters"), context.get_hparam("dropout"))
        )
        self.optimizer = context.wrap_optimizer(
            torch.optim.Adam(self.model.parameters(), lr=context.get_hparam("lr"))
        )
        self.loss_fn = nn.CrossEntropyLoss()

    def build_training_data_loader(self) -> DataLoader[Any]:
        return DataLoader(
            digits_split(train=True),
            batch_size=self.context.get_per_slot_batch_size(),
            shuffle=True,
            drop_last=True,
        )

    def build_validation_data_loader(self) -> DataLoader[Any]:
        return DataLoader(digits_split(train=False), batch_size=120)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        images, labels = batch
        loss = self.loss_fn(self.model(images), labels)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return {"loss": loss}

    def evaluate_batch(self, batch: Any) -> dict[str, Any]:
        images, labels = batch
        logits = self.model(images)
        return {
            "validation_loss": self.loss_fn(logits.float(), labels),
            "accuracy": (logits.argmax(dim=1) == labels).float().mean(),
        }
