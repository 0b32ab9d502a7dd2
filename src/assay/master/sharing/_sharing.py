"""Sharing the cluster: the scheduler's limits from the live experiments, fair-share
preemption, and live changes of an experiment's priority, weight and max_slots.

The decisions are the pure scheduler's (`assay.master.scheduler`); this module only
translates the master's memory into its plain values and back.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from assay.config import MAX_WEIGHT, MIN_WEIGHT, ExperimentConfig
from assay.master.errors import ConflictError, InvalidArgumentError
from assay.master.lifecycle import ExperimentState, Run
from assay.master.lifecycle import effects as fx
from assay.master.scheduler import (
    MAX_PRIORITY,
    MIN_PRIORITY,
    Decision,
    Group,
    Limits,
    Request,
    Running,
    Scheduler,
    choose_share_victims,
)

# What `assay experiment set` changes, as the CLI names it.
SETTABLE = ("priority", "weight", "max-slots")


def limits(experiments: Mapping[int, ExperimentState], user_slot_quota: int | None) -> Limits:
    """Each live experiment's weight, max_slots and owner, and the user quota (read when
    the scheduler asks for a group: a round costs nothing per idle experiment)."""
    return Limits(_Groups(experiments), user_slot_quota)


class _Groups(Mapping[str, Group]):
    """The live experiments as the scheduler's groups, keyed by str(experiment id)."""

    def __init__(self, experiments: Mapping[int, ExperimentState]) -> None:
        self._experiments = experiments

    def __getitem__(self, key: str) -> Group:
        experiment = self._experiments.get(int(key)) if key.isdigit() else None
        if experiment is None:
            raise KeyError(key)
        resources = experiment.config.resources
        return _group(resources.weight, resources.max_slots, experiment.owner)

    def __iter__(self) -> Iterator[str]:
        return (str(e) for e in self._experiments)

    def __len__(self) -> int:
        return len(self._experiments)


@functools.lru_cache(maxsize=4096)
def _group(weight: float, max_slots: int | None, owner: str) -> Group:
    return Group(weight, max_slots, owner)


def fair_share_victims(
    decision: Decision,
    pending: Mapping[str, Request],
    runs: Iterable[Run],
    scheduler: Scheduler,
) -> tuple[Request, list[str]] | None:
    """The first request the round left waiting for room that fair share entitles to
    slots now held by groups above their share, and the allocations to stop for it."""
    shares = decision.shares
    goal = {group: share.target for group, share in shares.items()}
    held = scheduler.held_by_group()
    running = [
        Running(str(run.trial_id), 0, run.trial_id, run.placement, str(run.experiment_id))
        for run in runs
        if run.stopping is None and not run.awaiting
    ]
    for request_id, wait in decision.waiting.items():
        request = pending.get(request_id)
        if request is None or wait.kind not in ("no_free_slots", "priority"):
            continue
        free = {
            a.id: len(scheduler.free_slots(a.id))
            for a in scheduler.agents
            if a.enabled
            and a.slot_type == request.slot_type
            and (not request.label or a.label == request.label)
        }
        victims = choose_share_victims(request, running, free, goal, held)
        if victims:
            return request, victims
    return None


def parse_value(field: str, text: str) -> int | float:
    """The value of `assay experiment set FIELD VALUE`; InvalidArgumentError says what fits."""
    if field not in SETTABLE:
        raise InvalidArgumentError(
            f"cannot set {field!r}: the experiment settings that can change are "
            f"{', '.join(SETTABLE)}"
        )
    try:
        value = float(text) if field == "weight" else int(text)
    except ValueError:
        kind = "a number" if field == "weight" else "an integer"
        raise InvalidArgumentError(f"{field} must be {kind}, got {text!r}") from None
    if field == "priority" and not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise InvalidArgumentError(
            f"priority must be an integer in {MIN_PRIORITY}..{MAX_PRIORITY} (lower runs "
            f"first), got {text}"
        )
    if field == "weight" and not MIN_WEIGHT <= value <= MAX_WEIGHT:
        raise InvalidArgumentError(
            f"weight must be a number from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}, got {text}"
        )
    if field == "max-slots" and value < 1:
        raise InvalidArgumentError(f"max-slots must be an integer of at least 1, got {text}")
    return value


def not_settable(experiment_id: int, state: str, field: str) -> ConflictError:
    """The refusal of `experiment set` for an experiment that has ended (in `state`)."""
    return ConflictError(
        f"experiment {experiment_id} is {state.lower()}: only an active or "
        f"paused experiment's {field} can change"
    )


@dataclasses.dataclass(frozen=True)
class ResourceChange:
    """What `experiment set` changes: the experiment's config and priority in memory, and
    the effects that store them and queue its waiting trials again with the new values."""

    config: ExperimentConfig
    priority: int
    effects: list[fx.Effect]


def resource_change(
    experiment: ExperimentState, field: str, value: int | float, queued: Mapping[int, Request]
) -> ResourceChange:
    """A checked change (`parse_value`) of a live experiment's priority, weight or
    max-slots; `queued`: the queue, by trial id. Its queued trials keep their places.

    The stored config is patched as Determined patches it (resources.priority, .weight,
    .max_slots), so the change outlives a restart; priority is also its own column.
    """
    resources = experiment.config.resources
    if field == "max-slots" and int(value) < resources.slots_per_trial:
        raise InvalidArgumentError(
            f"max-slots must be at least the experiment's slots_per_trial "
            f"({resources.slots_per_trial}), or no trial could start; got {int(value)}"
        )
    key = {"priority": "priority", "weight": "weight", "max-slots": "max_slots"}[field]
    raw = copy.deepcopy(dict(experiment.config.raw))
    section = raw.get("resources")
    raw["resources"] = {**(section if isinstance(section, dict) else {}), key: value}
    if key == "priority":
        resources = dataclasses.replace(resources, priority=int(value))
    elif key == "weight":
        resources = dataclasses.replace(resources, weight=float(value))
    else:
        resources = dataclasses.replace(resources, max_slots=int(value))
    config = dataclasses.replace(experiment.config, resources=resources, raw=raw)
    fields: dict[str, Any] = {"config": raw}
    priority = experiment.priority
    if field == "priority":
        priority = fields["priority"] = int(value)
    group = str(experiment.id)
    requeue = [fx.Enqueue(t) for t, request in queued.items() if request.group == group]
    return ResourceChange(config, priority, [fx.SetExperiment(experiment.id, fields), *requeue])
