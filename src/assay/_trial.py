"""`Trial`, the class users subclass, and the reducers of validation metrics."""

from __future__ import annotations

import abc
import enum
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

    from assay._context import TrialContext


class Reducer(enum.Enum):
    """How one validation metric's per-batch values combine into one number, over every
    batch of every rank (exactly: each rank sends sums, not its own mean).

    AVG (the default) is the mean weighted by each batch's number of samples: for a
    metric that is a mean over the batch's samples (a loss, an accuracy) it is the metric
    over the whole validation set, whatever the batch size, a short last batch or the
    number of slots. BATCH_AVG is the plain mean of the per-batch values, each batch
    counting once (Determined's AVG). SUM, MIN and MAX take every batch's value.
    """

    AVG = "avg"
    BATCH_AVG = "batch_avg"
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
    """The `Reducer`s, exact across ranks. `update(value, weight)` takes the batch's value
    and its number of samples (AVG's weight; the others ignore it); tensors stay on their
    device until `per_slot_reduce`, which copies them once per device."""

    def __init__(self, kind: Reducer) -> None:
        self.kind = kind
        self.values: list[torch.Tensor] = []
        self.weights: list[torch.Tensor] = []

    @property
    def weighted(self) -> bool:
        """Whether this reducer needs each batch's number of samples."""
        return self.kind is Reducer.AVG

    def reset(self) -> None:
        self.values = []
        self.weights = []

    def update(self, value: Any, weight: torch.Tensor | float = 1.0) -> None:
        self.values.append(scalar(value))
        self.weights.append(scalar(weight))

    def per_slot_reduce(self) -> tuple[float, float, int, float, float, float]:
        """(sum, weighted sum, batches, weights, min, max) of this rank's values."""
        if not self.values:
            return (0.0, 0.0, 0, 0.0, float("inf"), float("-inf"))
        values, weights = on_cpu(self.values), on_cpu(self.weights)
        bad = weights[~(weights >= 0) | weights.isinf()]
        if len(bad):
            raise ValueError(
                f"a batch's number of samples must be finite and >= 0, got {float(bad[0])}"
            )
        return (
            float(values.sum()),
            float((values * weights).sum()),
            len(values),
            float(weights.sum()),
            float(values.min()),
            float(values.max()),
        )

    def cross_slot_reduce(self, per_slot: Sequence[Any]) -> float:
        if self.kind is Reducer.SUM:
            return float(sum(p[0] for p in per_slot))
        if self.kind is Reducer.MIN:
            return float(min(p[4] for p in per_slot))
        if self.kind is Reducer.MAX:
            return float(max(p[5] for p in per_slot))
        if self.kind is Reducer.BATCH_AVG:
            total, count = sum(p[0] for p in per_slot), sum(p[2] for p in per_slot)
        else:
            total, count = sum(p[1] for p in per_slot), sum(p[3] for p in per_slot)
        return float(total / count) if count else float("nan")


def scalar(value: Any) -> torch.Tensor:
    """`value` as a detached 0-dim tensor (on its device); ValueError for anything else."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(
                f"expected a scalar, got a tensor of shape {tuple(value.shape)}; reduce it "
                "in evaluate_batch or give this metric a custom MetricReducer"
            )
        return value.detach().reshape(())
    if isinstance(value, int | float) and not isinstance(value, bool):
        return torch.tensor(float(value), dtype=torch.float64)
    raise ValueError(f"expected a number or a scalar tensor, got {type(value).__name__}")


def on_cpu(items: Sequence[torch.Tensor]) -> torch.Tensor:
    """0-dim tensors as one float64 CPU tensor, copied once from each device."""
    out = torch.empty(len(items), dtype=torch.float64)
    for device in {t.device for t in items}:
        where = [i for i, t in enumerate(items) if t.device == device]
        out[where] = torch.stack([items[i].double() for i in where]).cpu()
    return out


class CallableReducer(MetricReducer):
    """Determined's `wrap_reducer(fn)`: `fn` maps the list of every value given to
    `update` (on every rank, in rank order) to the metric (or a dict of metrics)."""

    def __init__(self, fn: Callable[[list[Any]], Any]) -> None:
        self.fn = fn
        self.values: list[Any] = []

    def reset(self) -> None:
        self.values = []

    def update(self, value: Any) -> None:
        self.values.append(value.detach().cpu() if isinstance(value, torch.Tensor) else value)

    def per_slot_reduce(self) -> list[Any]:
        return self.values

    def cross_slot_reduce(self, per_slot: Sequence[Any]) -> Any:
        return self.fn([v for values in per_slot for v in values])


class PyTorchCallback:
    """Hooks into the training loop (Determined's `PyTorchCallback`); override any of them.

    Return instances from `Trial.build_callbacks()` as a dict of name to callback. Every
    hook runs on every rank unless noted. Order: `on_checkpoint_load_start` (when
    restoring), `on_trial_startup`, `on_training_start`, then per epoch
    `on_training_epoch_start` ... `on_training_epoch_end`; `on_training_workload_end` after
    each training metrics report; `on_validation_start`/`on_validation_end` around each
    validation; `on_checkpoint_save_start`, `on_checkpoint_write_end` and
    `on_checkpoint_end` (the last two on rank 0, which writes) around each checkpoint;
    `on_trial_shutdown` last, also after an error or a preemption.
    `state_dict()` is saved in every checkpoint (plain containers and tensors only) and
    given back to `load_state_dict` when the trial restores.
    """

    def on_trial_startup(self, first_batch_idx: int, checkpoint_uuid: str | None) -> None:
        """Before training: the batch training starts from, and the checkpoint restored."""

    def on_training_start(self) -> None:
        """Once, right before the training loop (and the initial validation, if any)."""

    def on_training_epoch_start(self, epoch_idx: int) -> None:
        """Before the first batch of each epoch."""

    def on_training_epoch_end(self, epoch_idx: int) -> None:
        """After the last batch of each epoch."""

    def on_training_workload_end(
        self, avg_metrics: dict[str, Any], batch_metrics: list[dict[str, Any]]
    ) -> None:
        """After training metrics are reported: their averages over every rank and this
        rank's per-batch values since the last report."""

    def on_validation_start(self) -> None:
        """Before each validation."""

    def on_validation_end(self, metrics: dict[str, Any]) -> None:
        """After each validation, with its reduced metrics (the same on every rank)."""

    def on_checkpoint_save_start(self) -> None:
        """Before a checkpoint is written."""

    def on_checkpoint_write_end(self, checkpoint_dir: str) -> None:
        """Rank 0, once the checkpoint's files are in `checkpoint_dir`."""

    def on_checkpoint_end(self, checkpoint_dir: str) -> None:
        """Rank 0, once the checkpoint is stored and reported."""

    def on_checkpoint_load_start(self, checkpoint: dict[str, Any]) -> None:
        """Before a checkpoint is loaded: its contents (`models_state_dict`,
        `optimizers_state_dict`, `lr_schedulers_state_dict`, `callbacks`, `uuid`,
        `total_batches`). In a sharded checkpoint (FSDP's) the models and optimizers are
        every rank's shards, not gathered: their two entries are None."""

    def on_trial_shutdown(self) -> None:
        """Last, whatever the reason training ended."""

    def state_dict(self) -> dict[str, Any]:
        """This callback's state to keep in checkpoints."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""


# How many positional arguments each hook takes besides self (Determined's signatures);
# on_checkpoint_save_start also accepts Determined's one-argument form.
CALLBACK_HOOKS: dict[str, tuple[int, ...]] = {
    "on_trial_startup": (2,),
    "on_training_start": (0,),
    "on_training_epoch_start": (1,),
    "on_training_epoch_end": (1,),
    "on_training_workload_end": (2,),
    "on_validation_start": (0,),
    "on_validation_end": (1,),
    "on_checkpoint_save_start": (0, 1),
    "on_checkpoint_write_end": (1,),
    "on_checkpoint_end": (1,),
    "on_checkpoint_load_start": (1,),
    "on_trial_shutdown": (0,),
    "state_dict": (0,),
    "load_state_dict": (1,),
}


class Trial(abc.ABC):
    """Subclass this with your model, data and one training step.

    The harness builds it once per slot with a `TrialContext` (as `Trial(context)`, or
    `Trial(context, hparams)` when `__init__` takes two arguments), calls `train_batch`
    for each batch of this slot's shard (autocast active, gradient sync handled), and
    for validation either `evaluate_batch` for each validation batch of this slot's shard
    or `evaluate_full_dataset` once (on rank 0, with the whole validation loader), under
    `torch.no_grad()`. Define one of the two.
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

    if not TYPE_CHECKING:  # subclasses define it as (batch) or (batch, batch_idx)

        def evaluate_batch(self, batch: Any, batch_idx: int = 0) -> Any:
            """Return this validation batch's metrics, a dict (`batch_idx`, optional,
            counts the batches of this validation on this slot). AVG weighs the batch by
            its number of samples: those the loader drew for it (for an iterable dataset,
            the length of the batch's first tensor); return `(metrics, num_samples)` to
            weigh it by another count, such as its tokens."""
            raise NotImplementedError

    def evaluate_full_dataset(self, data_loader: DataLoader[Any]) -> dict[str, Any]:
        """Instead of `evaluate_batch`: validate over the whole `data_loader` at once and
        return the metrics. On several slots it runs on rank 0 only, as in Determined."""
        raise NotImplementedError

    def evaluation_reducer(self) -> Reducer | dict[str, Reducer | MetricReducer]:
        """How each validation metric is reduced over batches and ranks: AVG (the
        default, weighted by each batch's samples), BATCH_AVG, SUM, MIN, MAX, or a
        MetricReducer of your own."""
        return Reducer.AVG

    def build_callbacks(self) -> dict[str, PyTorchCallback]:
        """Callbacks by name (the name keys their state in checkpoints)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Extra user state to save in every checkpoint (models and optimizers are saved)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027 - optional hook
        """Restore what `state_dict` returned."""


EvaluationMode = Literal["batch", "batch_idx", "full"]
_BASE_EVALUATE_BATCH = getattr(Trial, "evaluate_batch", None)


def evaluation_mode(trial_class: type[Trial]) -> EvaluationMode:
    """Which evaluation the Trial defines; one clear error when it defines neither."""
    from assay.errors import TrainingError

    batch = getattr(trial_class, "evaluate_batch", None) is not _BASE_EVALUATE_BATCH
    full = trial_class.evaluate_full_dataset is not Trial.evaluate_full_dataset
    if batch and full:
        raise TrainingError(
            f"{trial_class.__qualname__} defines both evaluate_batch and "
            "evaluate_full_dataset: define one of them"
        )
    if full:
        _check_arity(trial_class.evaluate_full_dataset, (1,), trial_class, "(data_loader)")
        return "full"
    if not batch:
        raise TrainingError(
            f"{trial_class.__qualname__} defines neither evaluate_batch(batch) nor "
            "evaluate_full_dataset(data_loader): define one of them to validate"
        )
    evaluate: Callable[..., Any] = trial_class.evaluate_batch  # type: ignore[attr-defined]
    arity = _check_arity(evaluate, (1, 2), trial_class, "(batch[, batch_idx])")
    return "batch_idx" if arity == 2 else "batch"


def _check_arity(
    fn: Callable[..., Any], allowed: tuple[int, ...], owner: type, expected: str
) -> int:
    """The number of positional arguments (besides self) `fn` is called with."""
    from assay.errors import TrainingError

    params = list(inspect.signature(fn).parameters.values())[1:]
    positional = [
        p
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    required = sum(p.default is inspect.Parameter.empty for p in positional)
    varargs = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    for n in allowed[::-1]:
        if required <= n <= len(positional):
            return n
    if varargs and required <= allowed[0]:
        return allowed[0]
    name = getattr(fn, "__name__", "?")
    raise TrainingError(
        f"{owner.__qualname__}.{name} must take {expected}; it takes "
        f"({', '.join(p.name for p in params)})"
    )


def construct_trial(trial_class: type[Trial], context: TrialContext) -> Trial:
    """`trial_class(context)`, or `trial_class(context, hparams)` when `__init__` takes
    two arguments (checked before the Trial builds anything)."""
    evaluation_mode(trial_class)
    arity = _check_arity(trial_class.__init__, (1, 2), trial_class, "(context[, hparams])")
    if arity == 2:
        return trial_class(context, context.get_hparams())  # type: ignore[call-arg]
    return trial_class(context)


def check_callbacks(callbacks: Any) -> dict[str, PyTorchCallback]:
    """Validate what `build_callbacks()` returned: a dict of name to `PyTorchCallback`
    whose overridden hooks take Determined's arguments."""
    from assay.errors import TrainingError

    if not isinstance(callbacks, Mapping):
        raise TrainingError(
            "build_callbacks() must return a dict of name to PyTorchCallback, got "
            f"{type(callbacks).__name__}"
        )
    for name, callback in callbacks.items():
        if not isinstance(name, str) or not isinstance(callback, PyTorchCallback):
            raise TrainingError(
                f"build_callbacks() entry {name!r}: expected a name and an "
                f"assay.pytorch.PyTorchCallback, got {type(callback).__name__}"
            )
        for hook, allowed in CALLBACK_HOOKS.items():
            fn = getattr(type(callback), hook)
            if fn is getattr(PyTorchCallback, hook):
                continue
            expected = inspect.signature(getattr(PyTorchCallback, hook))
            args = ", ".join(list(expected.parameters)[1:])
            _check_arity(fn, allowed, type(callback), f"({args})")
    return dict(callbacks)
