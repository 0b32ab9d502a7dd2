"""How a trial's metric values become the numbers reported: scalars read off their devices,
validation metrics reduced by the Trial's `evaluation_reducer()`, and the reducers of
`context.wrap_reducer` reduced across slots.

The training loop (`assay._controller`) calls these at each report; they hold no state of
the loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
