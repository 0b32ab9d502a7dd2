"""Mixed precision as small plugins chosen by `optimizations.mixed_precision`.

Each plugin owns its autocast context, how a loss is backpropagated and how an optimizer
steps; the context only delegates. fp16 needs a `GradScaler` (loss scaling, `unscale_`
before clipping, steps skipped on inf/NaN); bf16 has fp32's range and needs none.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import torch

from assay.config import Precision

_NO_AUTOCAST = contextlib.nullcontext()
log = logging.getLogger("assay")


class PrecisionPlugin:
    """Full precision (fp32): no autocast, plain backward and step."""

    name: Precision = "off"

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return _NO_AUTOCAST

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        loss.backward(**kwargs)  # type: ignore[no-untyped-call]

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring gradients to their true scale (before clipping); a no-op without scaling."""

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """Step `optimizer` (a scaling plugin skips the step on inf/NaN gradients)."""
        optimizer.step()

    def update(self) -> None:
        """Called once per effective batch, after every optimizer stepped."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class _AutocastPrecision(PrecisionPlugin):
    dtype: torch.dtype

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)


class BF16Precision(_AutocastPrecision):
    """bfloat16 autocast; gradients are fp32 and need no scaling."""

    name: Precision = "bf16"
    dtype = torch.bfloat16


class FP16Precision(_AutocastPrecision):
    """float16 autocast with dynamic loss scaling (`torch.amp.GradScaler`)."""

    name: Precision = "fp16"
    dtype = torch.float16

    def __init__(self, device: torch.device) -> None:
        super().__init__(device)
        self.scaler = torch.amp.GradScaler(device.type)
        self._unscaled: set[int] = set()

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        self.scaler.scale(loss).backward(**kwargs)  # type: ignore[no-untyped-call]

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        if id(optimizer) not in self._unscaled:
            self.scaler.unscale_(optimizer)
            self._unscaled.add(id(optimizer))

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        self.scaler.step(optimizer)

    def update(self) -> None:
        self.scaler.update()
        self._unscaled.clear()

    def state_dict(self) -> dict[str, Any]:
        return {"scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])


class UserScaler:
    """A `GradScaler` the Trial manages itself (Determined's `context.wrap_scaler`).

    The Trial scales its loss (`context.backward(scaler.scale(loss))`); the harness
    unscales before clipping, steps through the scaler, calls `update()` once per effective
    batch, and checkpoints its state. It replaces the fp16 plugin's own scaler, so the two
    are not combined (see `TrialContext.wrap_scaler`).
    """

    def __init__(self, scaler: Any) -> None:
        self.scaler = scaler
        self._unscaled: set[int] = set()
        self._stepped = False

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        if id(optimizer) not in self._unscaled:
            self.scaler.unscale_(optimizer)
            self._unscaled.add(id(optimizer))

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        self.scaler.step(optimizer)
        self._stepped = True

    def update(self) -> None:
        if self._stepped:
            self.scaler.update()
        self._stepped = False
        self._unscaled.clear()


def resolve_precision(name: Precision, device: torch.device) -> Precision:
    """What `mixed_precision: auto` means on `device`: bf16 where the device computes in
    bfloat16 natively (CUDA with `torch.cuda.is_bf16_supported()`), else fp16 with the
    loss scaler on CUDA, else off (on CPU, autocast is slower than fp32). Other names stand."""
    if name != "auto":
        return name
    if device.type != "cuda":
        return "off"
    with torch.cuda.device(device):
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"


def make_precision(name: Precision, device: torch.device) -> PrecisionPlugin:
    """The plugin for `name` on `device`; `auto` is resolved here and the choice logged."""
    if name == "auto":
        name = resolve_precision(name, device)
        log.info("mixed_precision auto: %s on %s", name, device)
    plugins: dict[str, type[PrecisionPlugin]] = {
        "off": PrecisionPlugin,
        "bf16": BF16Precision,
        "fp16": FP16Precision,
    }
    return plugins[name](device)
