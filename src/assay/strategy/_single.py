"""One process: no wrapper, nothing to synchronise."""

from __future__ import annotations

from torch import nn

from assay.strategy._base import Strategy


class SingleDeviceStrategy(Strategy):
    """The model on this slot's device, as the user built it."""

    name = "single"

    def wrap_model(self, model: nn.Module) -> nn.Module:
        model = model.to(self.device)
        self.models.append(model)
        return model
