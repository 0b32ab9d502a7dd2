"""An experiment's transitions: the user's actions, the search's operations, its end."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Mapping, Set

from assay.master.errors import ConflictError
from assay.master.lifecycle._effects import (
    CollectGarbage,
    Dequeue,
    Drop,
    Effect,
    Kill,
    NewTrial,
    SetExperiment,
    Settle,
    SetTrial,
    Tell,
)
from assay.master.lifecycle._model import (
    TERMINAL_EXPERIMENT,
    TERMINAL_TRIAL,
    ExperimentState,
    ExperimentStatus,
    Run,
    StopKind,
    TrialState,
    TrialStatus,
)
from assay.master.lifecycle.run import end_trial, killed, requeue
from assay.master.searcher import Close, Create, Operation, Shutdown, ValidateAfter

E, T = ExperimentStatus, TrialStatus

ALLOWED_ACTIONS: Mapping[str, Set[ExperimentStatus]] = {
    "pause": {E.ACTIVE},
    "activate": {E.PAUSED},
    "cancel": {E.ACTIVE, E.PAUSED},
    "kill": {E.ACTIVE, E.PAUSED, E.STOPPING_CANCELED, E.STOPPING_KILLED},
    "archive": TERMINAL_EXPERIMENT,
    "unarchive": TERMINAL_EXPERIMENT,
    "continue": TERMINAL_EXPERIMENT,
}


def check_action(experiment_id: int, state: str, action: str) -> None:
    """`ConflictError` unless `action` applies to an experiment in `state`."""
    allowed = ALLOWED_ACTIONS[action]
    if state not in allowed:
        raise ConflictError(
            f"cannot {action} experiment {experiment_id}: it is {state}; {action} "
            f"applies to {', '.join(sorted(allowed))} experiments"
        )


def check_deletable(experiment_id: int, live: ExperimentState | None) -> None:
    """`ConflictError` when the experiment whose files are gone is `live` again (an
    `experiment continue` made it so, in memory first, then in the store): its rows stay,
    rather than be half-deleted under a batch that writes to them."""
    if live is not None:
        raise ConflictError(
            f"experiment {experiment_id} is {live.state} again (continued): kill it "
            "first, or wait for it to end"
        )


def act(
    experiment: ExperimentState, action: str, runs: Mapping[int, Run], now: dt.datetime
) -> list[Effect]:
    """A user's pause, activate, cancel or kill of a live experiment (`runs`: the running
    trials' runs, by trial id)."""
    check_action(experiment.id, experiment.state, action)
    if action == "pause":
        return [
            SetExperiment(experiment.id, {"state": E.PAUSED}),
            *_stop(experiment, "pause", T.PAUSED, runs, now),
        ]
    if action == "activate":
        effects: list[Effect] = [SetExperiment(experiment.id, {"state": E.ACTIVE})]
        for trial in experiment.trials.values():
            if trial.state != T.PAUSED or trial.awaiting_parent:
                continue
            if trial.closed:
                effects += close_paused(experiment, trial, now)
            elif trial.target is not None:
                # Trials waiting for a promotion stay paused until the searcher asks for more.
                effects += requeue(trial)
        return [*effects, Settle(experiment.id)]  # its last trial may have ended meanwhile
    how: StopKind = "cancel" if action == "cancel" else "kill"
    state = E.STOPPING_CANCELED if how == "cancel" else E.STOPPING_KILLED
    return [
        SetExperiment(experiment.id, {"state": state}),
        *_stop(experiment, how, T.CANCELED, runs, now),
        Settle(experiment.id),
    ]


def trial_has_ended(trial_id: int, state: str) -> ConflictError:
    """The refusal of a kill of a trial that has ended (`state`: its terminal state)."""
    return ConflictError(f"cannot kill trial {trial_id}: it has ended ({state})")


def kill_trial(
    experiment: ExperimentState, trial: TrialState, run: Run | None, now: dt.datetime
) -> list[Effect]:
    """A user's kill of one trial of a live experiment (`assay trial kill`; `run`: the
    trial's run, if it has one): a running trial is killed and ends CANCELED when its
    processes are gone (`Outcome.KILLED`); one without a run ends CANCELED now. Either way
    the searcher sees it exit early, and the experiment goes on with its other trials."""
    if experiment.state not in (E.ACTIVE, E.PAUSED):
        raise ConflictError(
            f"cannot kill trial {trial.id}: its experiment {experiment.id} is "
            f"{experiment.state} and stops all its trials already"
        )
    if trial.state in TERMINAL_TRIAL:
        raise trial_has_ended(trial.id, trial.state)
    if run is not None:
        if run.stopping == "kill_trial":
            return []  # being killed already
        return [
            SetTrial(trial.id, {"state": T.STOPPING}),
            Kill(run.allocation_id, graceful=False, stopping="kill_trial"),
        ]
    return [Dequeue(trial.id), *killed(trial, now), Settle(experiment.id)]


def continue_trial(experiment: ExperimentState, trial: TrialState, length: int) -> list[Effect]:
    """`experiment continue`: a finished single-trial experiment is active again and its
    trial queued, to resume from its latest checkpoint and train on to `length` batches
    (the searcher of the continued config sets the target). The trial's restarts count
    afresh; its checkpoint is where the run starts, so no batch is trained twice."""
    check_action(experiment.id, experiment.state, "continue")
    if set(experiment.trials) != {trial.id}:
        raise ConflictError(
            f"experiment {experiment.id} has {len(experiment.trials)} trials: continue "
            f"applies to a single-trial experiment (use `assay experiment fork {experiment.id}`)"
        )
    if experiment.config.searcher.name != "single":
        raise ConflictError(
            f"experiment {experiment.id} is a {experiment.config.searcher.name} search: "
            "continue applies to a single-trial (searcher: single) experiment; `assay "
            f"experiment fork {experiment.id}` starts a new search from its config"
        )
    restore = trial.checkpoint
    if restore is None:
        raise ConflictError(
            f"experiment {experiment.id}'s trial {trial.id} has no checkpoint to continue "
            f"from: `assay experiment fork {experiment.id}` trains a new one from scratch"
        )
    if length <= restore.total_batches:
        raise ConflictError(
            f"trial {trial.id}'s latest checkpoint is at batch {restore.total_batches}: "
            f"continue to a longer searcher.max_length (it is {length} batches), e.g. "
            f"--config searcher.max_length.batches={2 * restore.total_batches}"
        )
    progress = min(restore.total_batches / length, 0.99)
    return [
        SetExperiment(experiment.id, {"state": E.ACTIVE, "end_time": None, "progress": progress}),
        *requeue(trial, end_time=None, restarts=0, closed=False, target=None),
    ]


def close_paused(experiment: ExperimentState, trial: TrialState, now: dt.datetime) -> list[Effect]:
    """A paused trial the searcher has closed has nothing left to run: it completes (its
    run ended, or it waited in the queue, while its experiment was paused)."""
    return [
        *end_trial(trial, T.COMPLETED, now),
        Tell(experiment.id, trial.request_id, "on_trial_closed"),
    ]


def _stop(
    experiment: ExperimentState,
    how: StopKind,
    queued_state: TrialStatus,
    runs: Mapping[int, Run],
    now: dt.datetime,
) -> list[Effect]:
    """Stop every trial that has not ended: running ones at a checkpoint (or killed)."""
    effects: list[Effect] = []
    for trial in experiment.trials.values():
        if trial.state in TERMINAL_TRIAL:
            continue
        run = runs.get(trial.id)
        if run is not None and run.stopping == "kill_trial" and how == "pause":
            continue  # a user's kill of the trial lands as it was
        if run is not None:
            effects.append(SetTrial(trial.id, {"state": T.STOPPING}))
            effects.append(Kill(run.allocation_id, graceful=how != "kill", stopping=how))
        else:
            effects.append(Dequeue(trial.id))
            if queued_state in TERMINAL_TRIAL:
                effects += end_trial(trial, queued_state, now)
            else:
                effects.append(SetTrial(trial.id, {"state": queued_state}))
    return effects


def apply_operation(
    experiment: ExperimentState, op: Operation, running: Collection[int], now: dt.datetime
) -> list[Effect]:
    """One searcher operation (`running`: ids of trials with a run)."""
    if isinstance(op, Create):
        created = Tell(experiment.id, op.request_id, "on_trial_created")
        if op.request_id in experiment.by_request:  # adopted at start-up
            return [created]
        state = T.QUEUED if experiment.state == E.ACTIVE else T.PAUSED
        new = NewTrial(
            experiment.id,
            op.request_id,
            op.hparams,
            op.seed,
            state,
            checkpoint_from=op.checkpoint_from,
            search_round=op.round,
        )
        return [new, created]
    if isinstance(op, ValidateAfter):
        trial = experiment.by_request[op.request_id]
        effects: list[Effect] = [SetTrial(trial.id, {"target": op.length})]
        waiting = trial.state == T.PAUSED and trial.id not in running
        if waiting and experiment.state == E.ACTIVE and not trial.awaiting_parent:
            effects += requeue(trial)  # a promotion: it resumes from its checkpoint
        return effects
    if isinstance(op, Close):
        trial = experiment.by_request[op.request_id]
        effects = [SetTrial(trial.id, {"closed": True, "target": None})]
        if trial.id not in running and trial.state not in TERMINAL_TRIAL:
            # Not running: nothing to stop. A running one stops at its next question.
            effects.append(Dequeue(trial.id))
            effects += end_trial(trial, T.COMPLETED, now)
            effects.append(Tell(experiment.id, op.request_id, "on_trial_closed"))
        return effects
    if isinstance(op, Shutdown):
        return [SetExperiment(experiment.id, {"shutdown": True})]
    return []


def _end_of_search(states: Collection[TrialStatus]) -> ExperimentStatus:
    """How an experiment whose search is over ends, by its trials' ends: COMPLETED when
    one completed; CANCELED when a user killed every one (`trial kill`: nothing failed,
    as when the experiment itself is killed); ERROR when none completed and one failed."""
    if T.COMPLETED in states:
        return E.COMPLETED
    return E.CANCELED if states and set(states) <= {T.CANCELED} else E.ERROR


def settle(
    experiment: ExperimentState, queued: Collection[int], now: dt.datetime
) -> tuple[list[Effect], str | None]:
    """End the experiment when its search is over and every trial has ended; the second
    value is an error to log (a searcher that stopped without finishing)."""
    trials = experiment.trials.values()
    if experiment.state == E.PAUSED or any(t.state not in TERMINAL_TRIAL for t in trials):
        return [], None
    states = {t.state for t in trials}
    problem = None
    if experiment.state in (E.STOPPING_CANCELED, E.STOPPING_KILLED):
        final = E.CANCELED
    else:
        if not experiment.shutdown:
            if any(t in queued for t in experiment.trials):
                return [], None
            if experiment.config.searcher.name == "custom":
                return [], None  # its runner decides what comes next, whenever it is back
            # Every trial has ended and the searcher asks for nothing more, yet has not
            # said it is done: end here rather than wait for ever.
            problem = f"experiment {experiment.id}: the searcher stopped without finishing"
        final = _end_of_search(states)
    progress = 1.0 if final == E.COMPLETED else experiment.progress
    effects: list[Effect] = [
        SetExperiment(experiment.id, {"state": final, "end_time": now, "progress": progress})
    ]
    if any(t.checkpointed for t in trials):
        effects.append(CollectGarbage(experiment.id, experiment_ended=True))
    effects.append(Drop(experiment.id))
    return effects, problem
