"""How a trial's metric values become the numbers reported: scalars read off their devices,
validation metrics reduced by the Trial's `evaluation_reducer()` (AVG weighted by each
batch's number of samples), and the reducers of `context.wrap_reducer` reduced across
slots.

The training loop (`assay._controller`) calls these at each report; they hold no state of
the loop.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol

import torch

from assay._context import TrialContext
from assay._trial import BuiltinReducer, MetricReducer, Reducer
from assay.errors import TrainingError


def wrapped_metrics(context: TrialContext, *, training: bool) -> dict[str, float]:
    """The metrics of `context.wrap_reducer` reducers (a collective when there are any);
    the reducers are reset."""
    wrapped = [w for w in context._reducers if (w.for_training if training else w.for_validation)]
    if not wrapped:
        return {}
    everyone = context.distributed.allgather(
        [(w.fed, w.reducer.per_slot_reduce()) for w in wrapped]
    )
    metrics: dict[str, float] = {}
    for i, w in enumerate(wrapped):
        per_slot = [per_rank[i][1] for per_rank in everyone]
        fed = any(per_rank[i][0] for per_rank in everyone)
        w.reset()
        if not fed:
            continue  # no rank fed it since its last report: nothing to report
        value = w.reducer.cross_slot_reduce(per_slot)
        if w.name is None:
            if not isinstance(value, Mapping):
                raise TrainingError(
                    "a reducer wrapped with name=None must return a dict of metrics, got "
                    f"{type(value).__name__}"
                )
            metrics.update({k: number(k, v) for k, v in value.items()})
        else:
            metrics[w.name] = number(w.name, value)
    return metrics


def floats(values: list[torch.Tensor | float]) -> list[float]:
    """Metric values as floats, with one device sync for the tensors of one device."""
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    if not tensors:
        return [float(v) for v in values]
    if len({t.device for t in tensors}) == 1:
        converted = iter(torch.stack([t.reshape(()).double() for t in tensors]).tolist())
    else:
        converted = iter([float(t) for t in tensors])
    return [next(converted) if isinstance(v, torch.Tensor) else float(v) for v in values]


def number(name: str, value: Any) -> float:
    """A reported metric as a float: a number or a scalar tensor, nothing else."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.item())
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise TrainingError(f"metric {name!r} must be a number or a scalar tensor, got {value!r}")


class ReducerFactory:
    """The reducer of each validation metric, as `evaluation_reducer()` chose it."""

    def __init__(self, spec: Reducer | Mapping[str, Reducer | MetricReducer]) -> None:
        self.spec = spec

    def __call__(self, name: str) -> MetricReducer:
        if isinstance(self.spec, Reducer):
            return BuiltinReducer(self.spec)
        choice = self.spec.get(name, Reducer.AVG)
        return BuiltinReducer(choice) if isinstance(choice, Reducer) else choice


def metric_reducers(spec: Any) -> ReducerFactory:
    """Checks what `evaluation_reducer()` returned; a factory of reducers by name."""
    if isinstance(spec, Reducer):
        return ReducerFactory(spec)
    if isinstance(spec, Mapping) and all(
        isinstance(v, Reducer | MetricReducer) for v in spec.values()
    ):
        return ReducerFactory(spec)
    raise TrainingError(
        "evaluation_reducer() must return an assay.Reducer or a dict of metric name to "
        f"Reducer or MetricReducer, got {spec!r}"
    )


class _Gatherer(Protocol):
    def allgather(self, obj: Any) -> list[Any]: ...


OUTPUT = "evaluate_batch must return a dict of metrics, or (metrics, num_samples)"


def evaluation_output(out: Any) -> tuple[Mapping[str, Any], torch.Tensor | float | None]:
    """What `evaluate_batch` returned: its metrics, and the number of samples the batch
    counts for in AVG when it said so (a `(metrics, num_samples)` pair), else None."""
    if isinstance(out, Mapping):
        return out, None
    if not (isinstance(out, tuple | list) and len(out) == 2 and isinstance(out[0], Mapping)):
        raise TrainingError(f"{OUTPUT}, got {_describe(out)}")
    metrics, samples = out
    if isinstance(samples, torch.Tensor) and samples.numel() == 1:
        return metrics, samples.detach().reshape(())  # checked when reduced: no sync here
    if not isinstance(samples, int | float) or isinstance(samples, bool):
        raise TrainingError(
            f"{OUTPUT}: num_samples must be a number or a one-element tensor, got "
            f"{_describe(samples)}"
        )
    if not (math.isfinite(samples) and samples >= 0):
        raise TrainingError(f"{OUTPUT}: num_samples must be finite and >= 0, got {samples}")
    return metrics, float(samples)


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if isinstance(value, tuple | list):
        return f"a {type(value).__name__} of {len(value)}"
    return type(value).__name__


def batch_samples(batch: Any) -> int | None:
    """The length of the first tensor in `batch` (depth first through mappings, tuples and
    lists) with at least one dimension, as Lightning infers a batch size; None if none."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else None
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if isinstance(batch, tuple | list):
        for item in batch:
            found = batch_samples(item)
            if found is not None:
                return found
    return None


class BatchMetrics:
    """One validation's `evaluate_batch` metrics on this rank, reduced across ranks by
    `reduce`. A batch's weight in AVG is the `num_samples` evaluate_batch returned, else
    the number of samples the loader drew for it (`samples`)."""

    def __init__(self, factory: ReducerFactory) -> None:
        self.factory = factory
        self.reducers: dict[str, MetricReducer] = {}

    def add(self, out: Any, samples: int | None) -> None:
        """Feed one batch's output; `samples`: its number of samples, None if unknown."""
        metrics, given = evaluation_output(out)
        weight = given if given is not None else samples
        for name, value in metrics.items():
            reducer = self.reducers.get(name)
            if reducer is None:
                reducer = self.reducers[name] = self.factory(name)
                reducer.reset()
            try:
                if not isinstance(reducer, BuiltinReducer) or not reducer.weighted:
                    reducer.update(value)
                elif weight is None:
                    raise TrainingError(
                        f"cannot tell how many samples a validation batch holds, to weigh "
                        f"metric {name!r} in its average (the batch holds no tensor): return "
                        "(metrics, num_samples) from evaluate_batch, or give the metric "
                        "Reducer.BATCH_AVG in evaluation_reducer() (each batch counts once)"
                    )
                else:
                    reducer.update(value, weight)
            except ValueError as e:
                raise TrainingError(f"evaluate_batch returned metric {name!r}: {e}") from None

    def reduce(self, distributed: _Gatherer) -> dict[str, float]:
        """The metrics over every batch of every rank (a collective)."""
        per_slot: dict[str, Any] = {}
        error: str | None = None
        for name, reducer in self.reducers.items():
            try:
                per_slot[name] = reducer.per_slot_reduce()
            except ValueError as e:  # raised on every rank, after the collective
                error = error or f"evaluate_batch for metric {name!r}: {e}"
        everyone = distributed.allgather((per_slot, error))
        errors = [e for _, e in everyone if e is not None]
        if errors:
            raise TrainingError(errors[0])
        metrics: dict[str, float] = {}
        for name in sorted({name for per_rank, _ in everyone for name in per_rank}):
            reducer = self.reducers.get(name) or self.factory(name)
            value = reducer.cross_slot_reduce([r[name] for r, _ in everyone if name in r])
            metrics[name] = float(value.item() if isinstance(value, torch.Tensor) else value)
        return metrics
