"""`TrialContext`: what a Trial uses to wrap its model and optimizers and read its config."""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import nn

from assay._distributed import DistributedContext
from assay._precision import PrecisionPlugin
from assay.config import ExperimentConfig
from assay.errors import HyperparameterError, TrainingError

T = TypeVar("T")
ClipGrads = Callable[[Iterator[nn.Parameter]], Any]


class StepMode(enum.Enum):
    """When the harness steps a wrapped LR scheduler."""

    STEP_EVERY_BATCH = "batch"
    STEP_EVERY_OPTIMIZER_STEP = "optimizer_step"
    STEP_EVERY_EPOCH = "epoch"
    MANUAL_STEP = "manual"


@dataclass
class _Scheduler:
    scheduler: Any
    mode: StepMode
    optimizer: torch.optim.Optimizer | None


class TrialContext:
    """Given to `Trial.__init__`; the harness owns everything it wraps.

    Models are moved to the slot's device and wrapped in DistributedDataParallel when the
    trial has several slots. `backward` and `step_optimizer` apply loss scaling, gradient
    accumulation (`optimizations.aggregation_frequency`) and gradient clipping.
    """

    def __init__(
        self,
        *,
        config: ExperimentConfig,
        hparams: Mapping[str, Any],
        distributed: DistributedContext,
        device: torch.device,
        precision: PrecisionPlugin,
        trial_id: int = 0,
        trial_seed: int = 0,
    ) -> None:
        self._config = config
        self._hparams = dict(hparams)
        self.distributed = distributed
        self.device = device
        self._precision = precision
        self._trial_id = trial_id
        self._trial_seed = trial_seed
        self._aggregation = config.optimizations.aggregation_frequency
        self._global_batch_size = int(self._hparams["global_batch_size"])
        self.models: list[nn.Module] = []
        self._ddp_models: list[Any] = []
        self.optimizers: list[torch.optim.Optimizer] = []
        self._schedulers: list[_Scheduler] = []
        self._epoch = 0
        self._batch = 0
        self._boundary = True
        self._stepped = False

    # --- configuration -------------------------------------------------------------------

    def get_hparam(self, name: str) -> Any:
        if name not in self._hparams:
            known = ", ".join(sorted(self._hparams)) or "(none)"
            raise HyperparameterError(
                f"hyperparameter {name!r} is not defined in the experiment config; defined: {known}"
            )
        return self._hparams[name]

    def get_hparams(self) -> dict[str, Any]:
        return dict(self._hparams)

    def get_experiment_config(self) -> dict[str, Any]:
        return dict(self._config.raw)

    def get_data_config(self) -> dict[str, Any]:
        return dict(self._config.data)

    def get_trial_id(self) -> int:
        return self._trial_id

    def get_trial_seed(self) -> int:
        return self._trial_seed

    def get_global_batch_size(self) -> int:
        """Samples per training batch summed over every slot."""
        return self._global_batch_size

    def get_per_slot_batch_size(self) -> int:
        """Samples per training batch on this slot: use it as the DataLoader's batch_size."""
        return self._global_batch_size // self.distributed.size

    def current_train_epoch(self) -> int:
        return self._epoch

    def current_train_batch(self) -> int:
        """Batches trained since the trial began (across epochs and restores)."""
        return self._batch

    # --- wrapping ------------------------------------------------------------------------

    def to_device(self, data: T) -> T:
        """Move every tensor inside `data` (nested lists, tuples, dicts) to this slot's device."""
        if self.device.type == "cpu":
            return data  # loaders yield CPU tensors: walking the batch would cost per step
        moved: T = _to_device(data, self.device)
        return moved

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """Move `model` to the slot's device; wrap it in DDP when the trial has several slots."""
        model = model.to(self.device)
        if self.distributed.is_distributed:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            model = DistributedDataParallel(model, device_ids=ids)
            self._ddp_models.append(model)
        self.models.append(model)
        return model

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        if not self.models:
            raise TrainingError("call context.wrap_model before context.wrap_optimizer")
        self.optimizers.append(optimizer)
        return optimizer

    def wrap_lr_scheduler(
        self, scheduler: T, step_mode: StepMode | str = StepMode.STEP_EVERY_EPOCH
    ) -> T:
        """Register a scheduler; the harness steps it as `step_mode` says and checkpoints it.

        `step_mode`: `batch` (after every batch), `optimizer_step` (after every optimizer
        step, i.e. every `aggregation_frequency` batches), `epoch` or `manual`.
        """
        try:
            mode = step_mode if isinstance(step_mode, StepMode) else StepMode(step_mode)
        except ValueError:
            allowed = ", ".join(m.value for m in StepMode)
            raise TrainingError(f"step_mode must be one of {allowed}; got {step_mode!r}") from None
        optimizer = getattr(scheduler, "optimizer", None)
        self._schedulers.append(_Scheduler(scheduler, mode, optimizer))
        return scheduler

    # --- the training step ---------------------------------------------------------------

    def is_gradient_sync_step(self) -> bool:
        """True on the batch that completes an accumulation (where optimizers step)."""
        return self._boundary

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Backpropagate `loss` (scaled for fp16, divided by the accumulation count)."""
        if self._aggregation > 1:
            loss = loss / self._aggregation
        self._precision.backward(loss, **kwargs)

    def step_optimizer(
        self,
        optimizer: torch.optim.Optimizer,
        clip_grads: ClipGrads | float | None = None,
        auto_zero_grads: bool = True,
    ) -> None:
        """Step `optimizer` on accumulation boundaries; do nothing on other batches.

        `clip_grads` is a callable taking the parameters (e.g.
        `lambda p: torch.nn.utils.clip_grad_norm_(p, 1.0)`) or a float max norm; gradients
        are unscaled first under fp16. Gradients are zeroed after the step.
        """
        if not self._boundary:
            return
        if clip_grads is not None:
            self._precision.unscale(optimizer)
            params = (p for group in optimizer.param_groups for p in group["params"])
            if callable(clip_grads):
                clip_grads(params)
            else:
                torch.nn.utils.clip_grad_norm_(list(params), float(clip_grads))
        self._precision.step(optimizer)
        self._stepped = True
        if auto_zero_grads:
            optimizer.zero_grad(set_to_none=True)
        for entry in self._schedulers:
            if entry.mode is StepMode.STEP_EVERY_OPTIMIZER_STEP and entry.optimizer is optimizer:
                entry.scheduler.step()

    # --- used by the harness ------------------------------------------------------------

    def _begin_batch(self, epoch: int, batch: int) -> contextlib.AbstractContextManager[Any]:
        """Enter the batch: set counters, and suspend DDP sync off accumulation boundaries."""
        self._epoch, self._batch = epoch, batch
        self._boundary = (batch + 1) % self._aggregation == 0
        self._stepped = False
        if self._boundary or not self._ddp_models:
            return _NO_CONTEXT
        stack = contextlib.ExitStack()
        for model in self._ddp_models:
            stack.enter_context(model.no_sync())
        return stack

    def _end_batch(self) -> None:
        if self._boundary and self._stepped:
            self._precision.update()
        for entry in self._schedulers:
            if entry.mode is StepMode.STEP_EVERY_BATCH or (
                entry.mode is StepMode.STEP_EVERY_OPTIMIZER_STEP
                and entry.optimizer is None
                and self._boundary
            ):
                entry.scheduler.step()

    def _end_epoch(self) -> None:
        for entry in self._schedulers:
            if entry.mode is StepMode.STEP_EVERY_EPOCH:
                entry.scheduler.step()

    @property
    def _lr_schedulers(self) -> list[Any]:
        return [entry.scheduler for entry in self._schedulers]

    @property
    def _precision_plugin(self) -> PrecisionPlugin:
        return self._precision

    def _unwrapped_models(self) -> list[nn.Module]:
        return [getattr(m, "module", m) for m in self.models]


_NO_CONTEXT = contextlib.nullcontext()


def _to_device(data: Any, device: torch.device) -> Any:
    if isinstance(data, torch.Tensor):
        return data.to(device, non_blocking=device.type == "cuda")
    if isinstance(data, Mapping):
        return type(data)({k: _to_device(v, device) for k, v in data.items()})  # type: ignore[call-arg]
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(_to_device(v, device) for v in data))
    if isinstance(data, list | tuple):
        return type(data)(_to_device(v, device) for v in data)
    return data


def _params(optimizers: Iterable[torch.optim.Optimizer]) -> Iterator[nn.Parameter]:
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            yield from group["params"]
