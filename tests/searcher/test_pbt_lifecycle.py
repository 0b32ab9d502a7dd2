"""The master's side of pbt's exploit, as pure transitions: a copy created from a running
trial waits, paused, for that trial's run to end; nothing requeues it before then (a
ValidateAfter, an activate, a restarted master), and a cancel still ends it."""

from __future__ import annotations

import datetime as dt

from assay.config import parse_config
from assay.master.lifecycle import (
    ExperimentState,
    ExperimentStatus,
    TrialState,
    TrialStatus,
)
from assay.master.lifecycle import effects as fx
from assay.master.lifecycle import experiment as experiment_life
from assay.master.lifecycle import trial as trial_life
from assay.master.searcher import Create, ValidateAfter
from assay.master.submission import new_searcher

E, T = ExperimentStatus, TrialStatus
NOW = dt.datetime(2026, 12, 2, tzinfo=dt.UTC)


def _experiment(state: ExperimentStatus = E.ACTIVE) -> ExperimentState:
    config = parse_config(
        {
            "entrypoint": "model_def:T",
            "hyperparameters": {
                "global_batch_size": 8,
                "lr": {"type": "double", "minval": 0.1, "maxval": 1.0},
            },
            "searcher": {
                "name": "pbt",
                "metric": "loss",
                "population_size": 2,
                "num_rounds": 2,
                "length_per_round": {"batches": 4},
                "replace_function": {"truncate_fraction": 0.5},
            },
        }
    )
    return ExperimentState(1, config, state, 0, new_searcher(config))


def _copy(experiment: ExperimentState, *, awaiting_parent: bool = False) -> TrialState:
    trial = TrialState(5, experiment.id, "t2", {}, 0, T.PAUSED, target=8, parent_id=1)
    trial.search_round, trial.awaiting_parent = 1, awaiting_parent
    experiment.add_trial(trial)
    return trial


def test_a_create_from_a_checkpoint_names_its_parent_and_round() -> None:
    experiment = _experiment()

    op = Create("t2", {"lr": 0.5}, 7, checkpoint_from="t0", round=1)
    effects = experiment_life.apply_operation(experiment, op, set(), NOW)

    new = effects[0]
    assert isinstance(new, fx.NewTrial)
    assert (new.checkpoint_from, new.search_round) == ("t0", 1)


def test_a_waiting_copy_is_not_queued_by_its_first_validate_after() -> None:
    experiment = _experiment()
    copy = _copy(experiment, awaiting_parent=True)

    effects = experiment_life.apply_operation(experiment, ValidateAfter("t2", 8), set(), NOW)

    assert effects == [fx.SetTrial(copy.id, {"target": 8})]


def test_activate_and_a_restart_leave_a_waiting_copy_paused() -> None:
    paused = _experiment(E.PAUSED)
    _copy(paused, awaiting_parent=True)
    effects = experiment_life.act(paused, "activate", {}, NOW)
    assert not any(isinstance(e, fx.Enqueue) for e in effects)

    active = _experiment()
    _copy(active, awaiting_parent=True)
    effects = trial_life.after_restart(active, set(), NOW)
    assert not any(isinstance(e, fx.Enqueue) for e in effects)


def test_once_released_a_copy_is_requeued_like_any_paused_trial() -> None:
    experiment = _experiment(E.PAUSED)
    _copy(experiment)

    effects = experiment_life.act(experiment, "activate", {}, NOW)

    assert fx.Enqueue(5) in effects


def test_a_cancel_ends_a_waiting_copy() -> None:
    experiment = _experiment(E.STOPPING_CANCELED)
    _copy(experiment, awaiting_parent=True)

    effects = trial_life.after_restart(experiment, set(), NOW)

    assert fx.SetTrial(5, {"state": T.CANCELED, "end_time": NOW}) in effects
