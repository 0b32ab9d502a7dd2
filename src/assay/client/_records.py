"""The master's records as Python values: state names, configs as dicts, and the one-line
progress of an experiment that `assay experiment create --follow` and `Experiment.wait()`
print.

Protobuf is imported inside the functions, so importing this module stays cheap.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from google.protobuf.struct_pb2 import Struct

    from assay.proto import api_pb2, common_pb2

TERMINAL_EXPERIMENT_STATES = frozenset({"COMPLETED", "CANCELED", "ERROR"})
TERMINAL_TRIAL_STATES = frozenset({"COMPLETED", "CANCELED", "ERROR"})
# The experiment states a user filters by, each with the transient states that lead to it
# (an experiment being canceled or killed ends CANCELED); the master's ListExperiments
# takes the exact states.
EXPERIMENT_STATE_GROUPS: dict[str, tuple[str, ...]] = {
    "ACTIVE": ("ACTIVE",),
    "PAUSED": ("PAUSED",),
    "COMPLETED": ("COMPLETED",),
    "CANCELED": ("STOPPING_CANCELED", "STOPPING_KILLED", "CANCELED"),
    "ERROR": ("ERROR",),
}


def experiment_states_in(groups: Iterable[str]) -> list[str]:
    """The exact states of the named groups (EXPERIMENT_STATE_GROUPS; an exact state
    stands for itself), in the order named, each once."""
    found: dict[str, None] = {}
    for name in groups:
        for state in EXPERIMENT_STATE_GROUPS.get(name.upper(), (name.upper(),)):
            found[state] = None
    return list(found)


def _enum(enum_name: str, value: int, prefix: str) -> str:
    from assay.proto import common_pb2

    try:
        name: str = getattr(common_pb2, enum_name).Name(value)
    except ValueError:
        return str(value)  # a state newer than this CLI
    return name.removeprefix(prefix)


def experiment_state(value: int) -> str:
    return _enum("ExperimentState", value, "EXPERIMENT_STATE_")


def trial_state(value: int) -> str:
    return _enum("TrialState", value, "TRIAL_STATE_")


def slot_type(value: int) -> str:
    return _enum("SlotType", value, "SLOT_TYPE_")


def checkpoint_state(value: int) -> str:
    return _enum("CheckpointState", value, "CHECKPOINT_STATE_")


def _ints(value: Any) -> Any:
    """Struct stores every number as a double: give whole numbers back as ints."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: _ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_ints(v) for v in value]
    return value


def struct(message: Struct) -> dict[str, Any]:
    from google.protobuf import json_format

    converted: dict[str, Any] = _ints(json_format.MessageToDict(message))
    return converted


def metric(value: float | None) -> str | None:
    if value is None:
        return None
    return f"{value:.6g}" if math.isfinite(value) else str(value)


def searcher_objective(config: Mapping[str, Any]) -> tuple[str | None, bool]:
    """The metric a stored config's searcher ranks trials by, and whether smaller is better:
    `searcher.metric`, or the first of a multi-objective search's `searcher.metrics`
    (a name, or `{name, smaller_is_better}`)."""
    searcher = config.get("searcher") or {}
    metrics = searcher.get("metrics")
    if isinstance(metrics, Sequence) and not isinstance(metrics, str) and metrics:
        first = metrics[0]
        if isinstance(first, Mapping):
            name = first.get("name")
            return (None if name is None else str(name)), bool(first.get("smaller_is_better", True))
        return str(first), True
    metric = searcher.get("metric")
    return (None if metric is None else str(metric)), bool(searcher.get("smaller_is_better", True))


def best_trial(
    trials: Sequence[common_pb2.Trial], config: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The trial with the best validation of the searcher's metric (None before any)."""
    smaller = searcher_objective(config)[1]
    scored = [t for t in trials if t.HasField("best_validation")]
    if not scored:
        return None
    best = (min if smaller else max)(scored, key=lambda t: t.best_validation)
    return {"id": best.id, "best_validation": best.best_validation}


def percent(fraction: float) -> str:
    return f"{100 * fraction:.0f}%"


def progress_line(response: api_pb2.GetExperimentResponse) -> str:
    """`45%; trials: 3 done, 2 running, 1 queued; best val_loss 0.1475 (trial 2)`."""
    config = struct(response.experiment.config)
    counts = {"done": 0, "running": 0, "queued": 0, "paused": 0}
    for t in response.trials:
        state = trial_state(t.state)
        if state in TERMINAL_TRIAL_STATES:
            counts["done"] += 1
        elif state in ("RUNNING", "STOPPING"):
            counts["running"] += 1
        elif state == "PAUSED":
            counts["paused"] += 1
        else:
            counts["queued"] += 1
    shown = [f"{n} {word}" for word, n in counts.items() if n or word != "paused"]
    state = experiment_state(response.experiment.state)
    text = "" if state == "ACTIVE" else f"{state}; "
    text += f"{percent(response.experiment.progress)}; trials: {', '.join(shown)}"
    best = best_trial(response.trials, config)
    if best is not None:
        text += f"; best {metric_name(config)} {metric(best['best_validation'])}"
        text += f" (trial {best['id']})"
    waiting = next((t for t in response.trials if t.waiting), None)
    if waiting is not None:
        text += f"; trial {waiting.id} cannot start: {waiting.waiting}"
    return text


def metric_name(config: Mapping[str, Any]) -> str:
    """The searcher's metric, as a progress line names it."""
    return searcher_objective(config)[0] or "metric"


def experiment_seed(config: Mapping[str, Any]) -> int:
    """The `reproducibility.experiment_seed` a stored config holds: the config's own, or
    the one the master drew for it; 0 for an experiment stored before seeds were drawn."""
    repro = config.get("reproducibility")
    seed = repro.get("experiment_seed") if isinstance(repro, Mapping) else None
    return 0 if seed is None else int(seed)
