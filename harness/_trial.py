"""`Trial`, the class users subclass, and the reducers of validation metrics."""

from __future__ import annotations

import abc
import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

    from assay._context import TrialContext


class Reducer(enum.Enum):
    """How one validation metric's per-batch values combine into one number.

    Across ranks the combination is exact: AVG is the mean over every batch of every rank
    (so ranks with more batches weigh more), SUM/MIN/MAX over all batches.
    """

    AVG = "avg"
    SUM = "sum"
    MIN = "min"
    MAX = "max"


class MetricReducer(abc.ABC):
    """A custom reduction of one validation metric (e.g. an AUC over all predictions).

    `update` sees the metric's value from every `evaluate_batch` call on this rank;
    `per_slot_reduce` returns a picklable summary of this rank's values; the summaries of
    all ranks are gathered, and `cross_slot_reduce` combines them into the metric.
    """

    @abc.abstractmethod
    def reset(self) -> None: ...

    @abc.abstractmethod
    def update(self, value: Any) -> None: ...

    @abc.abstractmethod
    def per_slot_reduce(self) -> Any: ...

    @abc.abstractmethod
    def cross_slot_reduce(self, per_slot: Sequence[Any]) -> Any: ...


class BuiltinReducer(MetricReducer):
    """AVG / SUM / MIN / MAX over batch values, exact across ranks."""

    def __init__(self, kind: Reducer) -> None:
        self.kind = kind
        self.values: list[torch.Tensor] = []

    def reset(self) -> None:
        self.values = []

    def update(self, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(
                    f"expected a scalar, got a tensor of shape {tuple(value.shape)}; reduce it "
                    "in evaluate_batch or give this metric a custom MetricReducer"
                )
            self.values.append(value.detach().reshape(()).double())
        elif isinstance(value, int | float) and not isinstance(value, bool):
            self.values.append(torch.tensor(float(value), dtype=torch.float64))
        else:
            raise ValueError(f"expected a number or a scalar tensor, got {type(value).__name__}")

    def per_slot_reduce(self) -> tuple[float, int, float, float]:
        if not self.values:
            return (0.0, 0, float("inf"), float("-inf"))
        stacked = torch.stack([v.cpu() for v in self.values])
        return (
            float(stacked.sum()),
            len(self.values),
            float(stacked.min()),
            float(stacked.max()),
        )

    def cross_slot_reduce(self, per_slot: Sequence[Any]) -> float:
        total = sum(p[0] for p in per_slot)
        count = sum(p[1] for p in per_slot)
        if self.kind is Reducer.SUM:
            return float(total)
        if self.kind is Reducer.MIN:
            return float(min(p[2] for p in per_slot))
        if self.kind is Reducer.MAX:
            return float(max(p[3] for p in per_slot))
        return float(total / count) if count else float("nan")


class Trial(abc.ABC):
    """Subclass this with your model, data and one training step.

    The harness builds it once per slot with a `TrialContext`, calls `train_batch` for each
    batch of this slot's shard (autocast active, gradient sync handled), and
    `evaluate_batch` for each validation batch under `torch.no_grad()`.
    """

    @abc.abstractmethod
    def __init__(self, context: TrialContext) -> None: ...

    @abc.abstractmethod
    def build_training_data_loader(self) -> DataLoader[Any]:
        """A DataLoader with `batch_size=context.get_per_slot_batch_size()`."""

    @abc.abstractmethod
    def build_validation_data_loader(self) -> DataLoader[Any]: ...

    @abc.abstractmethod
    def train_batch(
        self, batch: Any, epoch_idx: int, batch_idx: int
    ) -> dict[str, Any] | torch.Tensor:
        """Train on one batch; return metrics (a bare tensor is reported as `loss`).

        `batch_idx` counts batches since the trial began, across epochs and restores.
        """

    @abc.abstractmethod
    def evaluate_batch(self, batch: Any) -> dict[str, Any]:
        """Return this batch's validation metrics."""

    def evaluation_reducer(self) -> Reducer | dict[str, Reducer | MetricReducer]:
        """How each validation metric is reduced over batches and ranks (default AVG)."""
        return Reducer.AVG

    def state_dict(self) -> dict[str, Any]:
        """Extra user state to save in every checkpoint (models and optimizers are saved)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027 - optional hook
        """Restore what `state_dict` returned."""
