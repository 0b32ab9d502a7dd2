"""`experiment set` decided on plain data (`_sharing.resource_change`): the new config and
priority, the store's fields, the queued trials asked for again; nothing is changed in
place, and a refusal leaves the experiment as it was."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from assay.config import parse_config
from assay.master.errors import ConflictError, InvalidArgumentError
from assay.master.lifecycle import ExperimentState, ExperimentStatus
from assay.master.lifecycle import effects as fx
from assay.master.scheduler import Request
from assay.master.sharing import not_settable, parse_value, resource_change
from assay.master.submission import new_searcher


def _experiment(experiment_id: int = 3, **resources: Any) -> ExperimentState:
    config = parse_config(
        {
            "name": "t",
            "entrypoint": "model_def:T",
            "hyperparameters": {"lr": 0.1, "global_batch_size": 8},
            "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 10}},
            "resources": {"slots_per_trial": 2, "priority": 42, **resources},
        }
    )
    return ExperimentState(experiment_id, config, ExperimentStatus.ACTIVE, 42, new_searcher(config))


def _queue() -> dict[int, Request]:
    return {
        10: Request("10", 2, "cpu", 42, 1, group="3"),
        11: Request("11", 1, "cpu", 50, 2, group="4"),  # another experiment's
        12: Request("12", 2, "cpu", 42, 3, group="3"),
    }


def test_priority_changes_the_column_the_config_and_requeues_its_trials() -> None:
    experiment = _experiment()
    raw_before = copy.deepcopy(dict(experiment.config.raw))
    change = resource_change(experiment, "priority", parse_value("priority", "7"), _queue())
    assert change.priority == 7
    assert change.config.resources.priority == 7
    assert change.config.raw["resources"] == {"slots_per_trial": 2, "priority": 7}
    set_experiment, *requeue = change.effects
    assert set_experiment == fx.SetExperiment(3, {"config": change.config.raw, "priority": 7})
    assert requeue == [fx.Enqueue(10), fx.Enqueue(12)]  # in queue order, this one's only
    # Decided, not done: the experiment is as it was until the shell applies the change.
    assert experiment.priority == 42
    assert experiment.config.resources.priority == 42
    assert dict(experiment.config.raw) == raw_before


@pytest.mark.parametrize(
    ("name", "text", "attribute", "key", "expected"),
    [
        ("weight", "2.5", "weight", "weight", 2.5),
        ("max-slots", "4", "max_slots", "max_slots", 4),
    ],
)
def test_weight_and_max_slots_change_the_config_only(
    name: str, text: str, attribute: str, key: str, expected: float
) -> None:
    experiment = _experiment()
    change = resource_change(experiment, name, parse_value(name, text), {})
    assert getattr(change.config.resources, attribute) == expected
    assert change.config.raw["resources"][key] == expected
    assert change.priority == 42  # unchanged
    assert change.effects == [fx.SetExperiment(3, {"config": change.config.raw})]
    assert getattr(experiment.config.resources, attribute) != expected


def test_max_slots_below_slots_per_trial_is_refused() -> None:
    experiment = _experiment()
    with pytest.raises(InvalidArgumentError) as info:
        resource_change(experiment, "max-slots", 1, _queue())
    assert str(info.value) == (
        "max-slots must be at least the experiment's slots_per_trial (2), or no trial "
        "could start; got 1"
    )


def test_an_ended_experiment_is_refused_with_its_state() -> None:
    error = not_settable(5, "COMPLETED", "weight")
    assert isinstance(error, ConflictError)
    assert str(error) == (
        "experiment 5 is completed: only an active or paused experiment's weight can change"
    )
