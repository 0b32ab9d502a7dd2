"""`TrialContext`: what a Trial uses to wrap its model and optimizers and read its config."""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import torch
from torch import nn

from assay._activation_checkpointing import apply_activation_checkpointing
from assay._distributed import DistributedContext
from assay._precision import FP16Precision, PrecisionPlugin, UserScaler
from assay._trial import CallableReducer, MetricReducer
from assay.config import ExperimentConfig
from assay.errors import HyperparameterError, TrainingError
from assay.strategy import Strategy, strategy_for

T = TypeVar("T")
ClipGrads = Callable[[Iterator[nn.Parameter]], Any]


class StepMode(enum.Enum):
    """When the harness steps a wrapped LR scheduler."""

    STEP_EVERY_BATCH = "batch"
    STEP_EVERY_OPTIMIZER_STEP = "optimizer_step"
    STEP_EVERY_EPOCH = "epoch"
    MANUAL_STEP = "manual"


_StepMode = StepMode


class LRScheduler:
    """Determined's `LRScheduler(scheduler, step_mode, frequency=1)`: a torch LR scheduler
    with when to step it. Give it to `context.wrap_lr_scheduler`, or call `step()`,
    `state_dict()` and `load_state_dict()` on it as on the scheduler it wraps."""

    StepMode: ClassVar[type[_StepMode]] = _StepMode

    def __init__(
        self,
        scheduler: Any,
        step_mode: _StepMode | str = _StepMode.STEP_EVERY_EPOCH,
        frequency: int = 1,
    ) -> None:
        self.scheduler = scheduler
        self.step_mode = _step_mode(step_mode)
        self.frequency = _frequency(frequency)

    def step(self, *args: Any, **kwargs: Any) -> None:
        self.scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        return list(self.scheduler.get_last_lr())

    def state_dict(self) -> dict[str, Any]:
        return dict(self.scheduler.state_dict())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)


@dataclass
class _Scheduler:
    scheduler: Any
    mode: StepMode
    optimizer: torch.optim.Optimizer | None
    frequency: int = 1
    ticks: int = 0

    def tick(self) -> None:
        """One step-mode event; the scheduler steps on every `frequency`-th."""
        self.ticks += 1
        if self.ticks % self.frequency == 0:
            self.scheduler.step()


@dataclass
class _WrappedReducer:
    reducer: MetricReducer
    name: str | None
    for_training: bool
    for_validation: bool
    fed: bool = False  # `update` was called since the last reset (on this rank)

    def reset(self) -> None:
        self.reducer.reset()
        self.fed = False


class TrialContext:
    """Given to `Trial.__init__`; the harness owns everything it wraps.

    Models are moved to the slot's device and wrapped by the strategy
    (`optimizations.strategy`: DDP or FSDP) when the trial has several slots. `backward`
    and `step_optimizer` apply loss scaling, gradient accumulation
    (`optimizations.aggregation_frequency`) and gradient clipping.
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
        experiment_id: int = 0,
    ) -> None:
        self._config = config
        self._hparams = dict(hparams)
        self.distributed = distributed
        self.device = device
        self._precision = precision
        self._trial_id = trial_id
        self._trial_seed = trial_seed
        self._experiment_id = experiment_id
        self._aggregation = config.optimizations.aggregation_frequency
        gbs = self._hparams.get("global_batch_size")
        self._global_batch_size = None if gbs is None else int(gbs)
        self.models: list[nn.Module] = []
        optimizations = config.optimizations
        self._strategy: Strategy = strategy_for(
            optimizations.strategy,
            distributed,
            device,
            fsdp=optimizations.fsdp,
            precision=precision.name,
        )
        scaler = self._strategy.grad_scaler()
        if scaler is not None and isinstance(precision, FP16Precision):
            precision.scaler = scaler
        self.optimizers: list[torch.optim.Optimizer] = []
        self._schedulers: list[_Scheduler] = []
        self._epoch = 0
        self._batch = 0
        self._boundary = True
        self._stepped = False
        self._batch_in_epoch = 0
        self._batches_per_epoch: int | None = None
        self._initial_batch = 0
        self._stop_requested = False
        self._scalers: list[UserScaler] = []
        self._reducers: list[_WrappedReducer] = []
        self._tensorboard_path: Path | None = None
        self._tensorboard_writer: Any = None
        self._profiler: Any = None  # set_profiler's torch.profiler.profile, once started
        self._profiler_args: tuple[tuple[Any, ...], dict[str, Any]] | None = None
        self._tensorboard_logging = True

    # --- configuration -------------------------------------------------------------------

    def get_hparam(self, name: str) -> Any:
        if name not in self._hparams:
            known = ", ".join(sorted(self._hparams))
            where = (
                f"defined: {known}"
                if known
                else "none are (off a cluster, pass them: pytorch.init(hparams={...}) or the "
                "experiment config's hyperparameters)"
            )
            raise HyperparameterError(
                f"hyperparameter {name!r} is not defined in the experiment config; {where}"
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

    def get_experiment_id(self) -> int:
        """The experiment's id on a cluster; 0 off-cluster."""
        return self._experiment_id

    def get_global_batch_size(self) -> int:
        """Samples per training batch summed over every slot."""
        if self._global_batch_size is None:
            raise HyperparameterError(
                "hyperparameter 'global_batch_size' is not defined: add it to the "
                "hyperparameters to use get_global_batch_size / get_per_slot_batch_size"
            )
        return self._global_batch_size

    def get_per_slot_batch_size(self) -> int:
        """Samples per training batch on this slot: use it as the DataLoader's batch_size."""
        return self.get_global_batch_size() // self.distributed.size

    def current_train_epoch(self) -> int:
        return self._epoch

    def current_train_batch(self) -> int:
        """Batches trained since the trial began (across epochs and restores)."""
        return self._batch

    def get_initial_batch(self) -> int:
        """The batch this run of the trial started from (non-zero after a restore)."""
        return self._initial_batch

    def is_epoch_start(self) -> bool:
        """In `train_batch`: whether this batch is the first of its epoch."""
        return self._batch_in_epoch == 0

    def is_epoch_end(self) -> bool:
        """In `train_batch`: whether this batch is the last of its epoch (False when the
        epoch's length is unknown, e.g. an iterable dataset)."""
        n = self._batches_per_epoch
        return n is not None and self._batch_in_epoch == n - 1

    # --- stopping early ------------------------------------------------------------------

    def set_stop_requested(self, stop_requested: bool) -> None:
        """Ask training to end at the next batch boundary: it validates, checkpoints and
        the trial counts as completed. On several slots, ranks agree on it within a few
        batches (at once after a validation); setting it on one rank is enough."""
        if not isinstance(stop_requested, bool):
            raise TypeError(f"set_stop_requested takes a bool, got {stop_requested!r}")
        self._stop_requested = stop_requested

    def get_stop_requested(self) -> bool:
        """Whether `set_stop_requested(True)` was called (on this rank)."""
        return self._stop_requested

    # --- TensorBoard ---------------------------------------------------------------------

    def get_tensorboard_path(self) -> Path:
        """The directory for this trial's TensorBoard event files:
        `<checkpoint directory>/tensorboard/trial-<id>` (rank 0; other ranks get a
        `rank-<n>` folder inside it), kept beside the trial's checkpoints."""
        if self._tensorboard_path is None:
            raise TrainingError("the TensorBoard path is known once the trial is training")
        return self._tensorboard_path

    def get_tensorboard_writer(self) -> Any:
        """A `torch.utils.tensorboard.SummaryWriter` writing into `get_tensorboard_path()`
        (one per trial; flushed and closed when training ends). Needs `pip install
        tensorboard`."""
        if self._tensorboard_writer is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise TrainingError(
                    "get_tensorboard_writer needs the tensorboard package: pip install tensorboard"
                ) from None
            path = self.get_tensorboard_path()
            path.mkdir(parents=True, exist_ok=True)
            self._tensorboard_writer = SummaryWriter(log_dir=str(path))
        return self._tensorboard_writer

    def set_enable_tensorboard_logging(self, enabled: bool) -> None:
        """Determined's switch for the metrics it writes to TensorBoard itself. Assay
        writes none there (only what you write with `get_tensorboard_writer()`), so this
        records the choice, which `get_enable_tensorboard_logging()` returns."""
        self._tensorboard_logging = bool(enabled)

    def get_enable_tensorboard_logging(self) -> bool:
        return self._tensorboard_logging

    def set_profiler(self, *args: Any, **kwargs: Any) -> None:
        """Profile training with `torch.profiler.profile(*args, **kwargs)` (Determined's
        `set_profiler`): started with the first batch, stepped after every batch and
        stopped when training ends; its traces go to `get_tensorboard_path()` unless
        `on_trace_ready` is given. Rank 0 only; call it in `__init__`. E.g.
        `context.set_profiler(activities=[ProfilerActivity.CPU],
        schedule=torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1))`."""
        self._profiler_args = (args, dict(kwargs))

    def _start_profiler(self) -> None:
        if self._profiler_args is None or self._profiler is not None or self.distributed.rank != 0:
            return
        import torch.profiler

        args, kwargs = self._profiler_args
        if "on_trace_ready" not in kwargs:
            path = str(self.get_tensorboard_path())
            kwargs["on_trace_ready"] = torch.profiler.tensorboard_trace_handler(path)
        self._profiler = torch.profiler.profile(*args, **kwargs)
        self._profiler.start()

    # --- wrapping ------------------------------------------------------------------------

    def to_device(self, data: T) -> T:
        """Move every tensor inside `data` (nested lists, tuples, dicts) to this slot's device."""
        if self.device.type == "cpu":
            return data  # loaders yield CPU tensors: walking the batch would cost per step
        moved: T = _to_device(data, self.device)
        return moved

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """Move `model` to the slot's device; on several slots, wrap it as
        `optimizations.strategy` says (DDP, or FSDP sharding it in place)."""
        model = model.to(self.device)
        apply_activation_checkpointing(model, self._config.optimizations.activation_checkpointing)
        model = self._strategy.wrap_model(model)
        self.models.append(model)
        return model

    def wrap_optimizer(
        self, optimizer: torch.optim.Optimizer, backward_passes_per_step: int = 1
    ) -> torch.optim.Optimizer:
        """Register `optimizer` (checkpointed with the trial).

        `backward_passes_per_step` is accepted for Determined compatibility: under DDP
        nothing more is needed; accumulate over batches with
        `optimizations.aggregation_frequency`.
        """
        if not self.models:
            raise TrainingError("call context.wrap_model before context.wrap_optimizer")
        if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
            raise TrainingError(
                f"backward_passes_per_step must be a positive integer, got "
                f"{backward_passes_per_step!r}"
            )
        optimizer = self._strategy.wrap_optimizer(optimizer)
        self.optimizers.append(optimizer)
        return optimizer

    def wrap_lr_scheduler(
        self,
        scheduler: T,
        step_mode: StepMode | str | None = None,
        frequency: int | None = None,
    ) -> T:
        """Register a scheduler; the harness steps it as `step_mode` says and checkpoints it.

        `step_mode`: `STEP_EVERY_BATCH` ("batch"; under gradient accumulation, once for
        each batch of it after its optimizer step, as Determined does, so the schedule
        never runs ahead of the optimizer), `STEP_EVERY_OPTIMIZER_STEP`
        ("optimizer_step": every `aggregation_frequency` batches), `STEP_EVERY_EPOCH`
        ("epoch", the default) or `MANUAL_STEP` ("manual": you call `step()`, e.g. a
        `ReduceLROnPlateau` in a callback's `on_validation_end`). It steps every
        `frequency`-th time its mode comes round. An `LRScheduler` brings its own mode and
        frequency.
        """
        inner: Any = scheduler
        mode = StepMode.STEP_EVERY_EPOCH
        every = 1
        if isinstance(scheduler, LRScheduler):
            inner, mode, every = scheduler.scheduler, scheduler.step_mode, scheduler.frequency
        if step_mode is not None:
            mode = _step_mode(step_mode)
        if frequency is not None:
            every = _frequency(frequency)
        optimizer = getattr(inner, "optimizer", None)
        self._schedulers.append(_Scheduler(inner, mode, optimizer, every))
        return scheduler

    def wrap_scaler(self, scaler: T) -> T:
        """Register your own `GradScaler` (Determined's fp16 recipe): scale the loss
        yourself (`context.backward(scaler.scale(loss))`) and pass `scaler=` to
        `step_optimizer`; the harness unscales before clipping, calls `update()` once per
        effective batch and checkpoints it. Not combined with `mixed_precision: fp16`,
        whose plugin brings its own scaler."""
        if self._precision.name == "fp16":
            raise TrainingError(
                "optimizations.mixed_precision is fp16, which scales the loss already: "
                "either drop wrap_scaler or set mixed_precision to off and autocast yourself"
            )
        if self._strategy.name == "fsdp":
            raise TrainingError(
                "under strategy fsdp each rank holds only its gradient shards, which a plain "
                "GradScaler checks alone: use mixed_precision: fp16, whose scaler is "
                "sharding-aware, instead of wrap_scaler"
            )
        for required in ("scale", "step", "update", "unscale_", "state_dict"):
            if not callable(getattr(scaler, required, None)):
                raise TrainingError(
                    f"wrap_scaler expects a torch.amp.GradScaler; {type(scaler).__name__} "
                    f"has no {required}()"
                )
        self._scalers.append(UserScaler(scaler))
        return scaler

    def wrap_reducer(
        self,
        reducer: MetricReducer | Callable[[list[Any]], Any],
        name: str | None = None,
        for_training: bool = True,
        for_validation: bool = True,
    ) -> MetricReducer:
        """Register a metric you feed with `reducer.update(value)` in `train_batch` /
        `evaluate_batch` (Determined's `wrap_reducer`, with its defaults).

        `reducer` is a `MetricReducer` or a callable over the list of every value given to
        `update` (all ranks) that returns the metric. The result is reported as `name`, or,
        with `name=None`, the reducer returns a dict of metrics, with the training metrics
        (`for_training`) and with the validation metrics (`for_validation`). It is reset
        before each validation and after each training report. A reducer no rank fed
        since then (e.g. fed in `evaluate_batch` only, at a training report) is left out
        of that report.
        """
        if not isinstance(reducer, MetricReducer):
            if not callable(reducer):
                raise TrainingError(
                    f"wrap_reducer takes a MetricReducer or a callable, got "
                    f"{type(reducer).__name__}"
                )
            reducer = CallableReducer(reducer)
        if not (for_training or for_validation):
            raise TrainingError("wrap_reducer: set for_training or for_validation")
        entry = _WrappedReducer(reducer, name, for_training, for_validation)
        entry.reset()
        update = reducer.update

        def fed_update(*args: Any, **kwargs: Any) -> Any:
            entry.fed = True  # a report skips a reducer that no rank fed since its reset
            return update(*args, **kwargs)

        reducer.update = fed_update  # type: ignore[method-assign]
        self._reducers.append(entry)
        return reducer

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
        scaler: Any = None,
    ) -> None:
        """Step `optimizer` on accumulation boundaries; do nothing on other batches.

        `clip_grads` is a callable taking the parameters (e.g.
        `lambda p: torch.nn.utils.clip_grad_norm_(p, 1.0)`) or a float max norm; gradients
        are unscaled first under fp16. Gradients are zeroed after the step. `scaler`: a
        `GradScaler` registered with `wrap_scaler`, which then does the step.
        """
        if not self._boundary:
            return
        stepper: Any = self._precision
        if scaler is not None:
            stepper = next((s for s in self._scalers if s.scaler is scaler), None)
            if stepper is None:
                raise TrainingError("step_optimizer(scaler=...): wrap the scaler with wrap_scaler")
        if clip_grads is not None:
            stepper.unscale(optimizer)
            params = (p for group in optimizer.param_groups for p in group["params"])
            if callable(clip_grads):
                clip_grads(params)
            else:
                self._strategy.clip_grad_norm(params, float(clip_grads))
        stepper.step(optimizer)
        self._stepped = True
        if auto_zero_grads:
            optimizer.zero_grad(set_to_none=True)
        for entry in self._schedulers:
            if entry.mode is StepMode.STEP_EVERY_OPTIMIZER_STEP and entry.optimizer is optimizer:
                entry.tick()

    # --- used by the harness ------------------------------------------------------------

    def _begin_batch(
        self, epoch: int, batch: int, batch_in_epoch: int = 0
    ) -> contextlib.AbstractContextManager[Any]:
        """Enter the batch: set counters, and suspend gradient sync off accumulation
        boundaries (the strategy's no-sync context)."""
        self._at(epoch, batch, batch_in_epoch)
        self._boundary = (batch + 1) % self._aggregation == 0
        self._stepped = False
        if self._boundary:
            return _NO_CONTEXT
        return self._strategy.no_sync()

    def _at(self, epoch: int, batch: int, batch_in_epoch: int) -> None:
        """The position the next batch trains at (what callbacks and `train_batch` see)."""
        self._epoch, self._batch, self._batch_in_epoch = epoch, batch, batch_in_epoch

    def _end_batch(self) -> None:
        if self._profiler is not None:
            self._profiler.step()
        if self._boundary and self._stepped:
            self._precision.update()
            for user_scaler in self._scalers:
                user_scaler.update()
        if not self._boundary:
            return  # a scheduler never steps ahead of the optimizers (as in Determined)
        for entry in self._schedulers:
            if entry.mode is StepMode.STEP_EVERY_BATCH:
                for _ in range(self._aggregation):  # each batch of the accumulation
                    entry.tick()
            elif entry.mode is StepMode.STEP_EVERY_OPTIMIZER_STEP and entry.optimizer is None:
                entry.tick()

    def _end_epoch(self) -> None:
        for entry in self._schedulers:
            if entry.mode is StepMode.STEP_EVERY_EPOCH:
                entry.tick()

    def _close(self) -> None:
        """Training ended: stop the profiler, flush and close the TensorBoard writer."""
        if self._profiler is not None:
            self._profiler.stop()
            self._profiler = None
        if self._tensorboard_writer is not None:
            self._tensorboard_writer.close()
            self._tensorboard_writer = None

    @property
    def _lr_schedulers(self) -> list[Any]:
        return [entry.scheduler for entry in self._schedulers]

    @property
    def _scheduler_ticks(self) -> list[int]:
        """How often each scheduler's mode has come round: with `frequency` > 1, where in
        its count a restored scheduler is."""
        return [entry.ticks for entry in self._schedulers]

    @_scheduler_ticks.setter
    def _scheduler_ticks(self, ticks: list[int]) -> None:
        for entry, count in zip(self._schedulers, ticks, strict=True):
            entry.ticks = count

    @property
    def _precision_plugin(self) -> PrecisionPlugin:
        return self._precision

    def _unwrapped_models(self) -> list[nn.Module]:
        return [self._strategy.unwrap(m) for m in self.models]


_NO_CONTEXT = contextlib.nullcontext()


def _step_mode(step_mode: StepMode | str) -> StepMode:
    if isinstance(step_mode, StepMode):
        return step_mode
    try:
        return StepMode(step_mode)
    except ValueError:
        pass
    try:
        return StepMode[str(step_mode)]
    except KeyError:
        allowed = ", ".join(f"{m.name} ({m.value!r})" for m in StepMode)
        raise TrainingError(f"step_mode must be one of {allowed}; got {step_mode!r}") from None


def _frequency(frequency: int) -> int:
    if not isinstance(frequency, int) or isinstance(frequency, bool) or frequency < 1:
        raise TrainingError(f"frequency must be a positive integer, got {frequency!r}")
    return frequency


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
