"""A trial's transitions: its start on slots, its harness's reports, a master's restart."""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any, get_args

from assay.config import searcher_in_batches
from assay.errors import InvalidConfigError
from assay.master.lifecycle._effects import (
    Effect,
    SetExperiment,
    Settle,
    SetTrial,
    StartRun,
    Tell,
)
from assay.master.lifecycle._model import (
    RELEASED,
    STOP_OF_EXPERIMENT,
    ExperimentState,
    ExperimentStatus,
    Placement,
    Run,
    StopKind,
    TrialState,
    TrialStatus,
)
from assay.master.lifecycle._orders import StartRun as AgentStart
from assay.master.lifecycle.experiment import close_paused
from assay.master.lifecycle.run import end_trial, requeue

E, T = ExperimentStatus, TrialStatus
STOP_KINDS: tuple[StopKind, ...] = get_args(StopKind)


def start(
    trial: TrialState,
    experiment: ExperimentState,
    placement: Placement,
    *,
    allocation_id: str,
    token: str,
    addresses: Mapping[str, str],
    port: int,
    model: bytes,
    trial_api: str,
    checkpoint_root: str,
    now: dt.datetime,
) -> list[Effect]:
    """A queued trial's next run on `placement`: one `AgentStart` per agent, ranks in
    placement order, rank 0's agent the rendezvous (`addresses`: agent id -> host)."""
    restore = trial.checkpoint
    run_id = trial.run_id + 1
    fields: dict[str, Any] = {"run_id": run_id, "state": T.RUNNING}
    if trial.start_time is None:
        fields["start_time"] = now
    # A run starts where its checkpoint left off, or from scratch: either way the batches
    # counted past that point are not the trial's any more.
    fields["total_batches"] = restore.total_batches if restore is not None else 0
    if trial.total_batches > fields["total_batches"] and trial.best_validation is not None:
        # Its best may have been reported past that point: StartRun has the store find
        # the best of what is left, and takes it into memory too.
        fields["best_validation"] = None
    world = sum(len(slots) for _, slots in placement)
    config_json = experiment.config_json
    hparams_json = json.dumps(dict(trial.hparams))
    chief = addresses[placement[0][0]] or "127.0.0.1"
    messages = []
    rank = 0
    for agent_id, slots in placement:
        ranks = tuple(range(rank, rank + len(slots)))
        rank += len(slots)
        part = AgentStart(
            allocation_id=allocation_id,
            trial_id=trial.id,
            run_id=run_id,
            experiment_id=trial.experiment_id,
            slots=slots,
            ranks=ranks,
            world_size=world,
            master_addr=chief,
            master_port=port,
            model_definition=model,
            config_json=config_json,
            checkpoint_uuid=restore.uuid if restore else "",
            checkpoint_location=restore.location if restore else "",
            checkpoint_sha256=dict(restore.sha256) if restore else {},
            trial_api=trial_api,
            token=token,
            hparams_json=hparams_json,
            trial_seed=trial.seed,
            checkpoint_root=checkpoint_root,
        )
        messages.append((agent_id, part))
    run = Run(allocation_id, trial.id, run_id, trial.experiment_id, placement, token)
    # Metrics an earlier run reported past that point leave the curves.
    superseded = fields["total_batches"] if trial.run_id else None
    return [SetTrial(trial.id, fields), StartRun(run, tuple(messages), superseded)]


def awaited_run(
    allocation_id: str,
    run_id: int,
    placement: Placement,
    trial: TrialState,
    experiment: ExperimentState,
    *,
    token: str,
    deadline: float,
    stopping: str | None = None,
) -> Run | None:
    """A run a restarted master found in the store, kept for its agents to confirm until
    `deadline`; None when its trial has moved on (the run is over).

    `stopping` is the kind of stop the store recorded for the run when it was asked to
    stop: that stop goes on (a user's `trial kill` stays a kill). A row written before
    the store kept it has none: the stop is then inferred from the experiment's state.
    `RELEASED` there says the master had told the run "no more": its exit 0 ends a step
    (a promotion or a pbt round may have set the trial's next target since), not a run
    that failed."""
    if trial.run_id != run_id or trial.state not in (T.RUNNING, T.STOPPING):
        return None
    stop = _stored_stop(stopping) or _inferred_stop(trial, experiment)
    return Run(
        allocation_id,
        trial.id,
        trial.run_id,
        trial.experiment_id,
        placement,
        token,
        stopping=stop,
        awaiting={agent_id for agent_id, _ in placement},
        deadline=deadline,
        released=stopping == RELEASED and stop is None,  # a stop decides the end first
    )


def _stored_stop(stopping: str | None) -> StopKind | None:
    return next((kind for kind in STOP_KINDS if kind == stopping), None)


def _inferred_stop(trial: TrialState, experiment: ExperimentState) -> StopKind | None:
    """The stop of a run whose row does not say: the experiment's, else a STOPPING trial
    of an experiment that is not stopping was being preempted."""
    preempted: StopKind | None = "preempt" if trial.state == T.STOPPING else None
    return STOP_OF_EXPERIMENT.get(experiment.state, preempted)


def next_target(run: Run, trial: TrialState | None) -> int | None:
    """The batch count the harness trains to next, or None: it checkpoints and exits."""
    if run.stopping is not None or trial is None or trial.closed:
        return None
    return trial.target


def validated(
    trial: TrialState,
    experiment: ExperimentState,
    total_batches: int,
    metric: float | Sequence[float | None],
    *,
    stop_requested: bool,
) -> list[Effect]:
    """The harness validated at (or past) its target, or its code asked to stop. A
    retry, a report short of the target, or one after a stop is a no-op."""
    if stop_requested:
        if trial.closed:
            return []
        effects: list[Effect] = []
        target = trial.target
        if target is not None and total_batches >= target:
            # It finished its target first: the searcher gets that result.
            effects.append(SetTrial(trial.id, {"target": None}))
            effects.append(_told(experiment, trial, "on_validation_completed", metric, target))
        effects.append(SetTrial(trial.id, {"target": None, "closed": True}))
        effects.append(_told(experiment, trial, "on_trial_exited_early", "user_canceled"))
        return effects
    if trial.target is None or total_batches < trial.target:
        return []
    # A script may validate past its target (on its own schedule): the searcher's rung
    # is the target it asked for.
    return [
        SetTrial(trial.id, {"target": None}),
        _told(experiment, trial, "on_validation_completed", metric, trial.target),
    ]


def _told(experiment: ExperimentState, trial: TrialState, event: Any, *args: Any) -> Tell:
    return Tell(experiment.id, trial.request_id, event, args)


def experiment_best(experiment: ExperimentState) -> float | None:
    """The best searcher-metric value any trial of the experiment has reported."""
    values = [
        t.best_validation
        for t in experiment.trials.values()
        if t.best_validation is not None and math.isfinite(t.best_validation)
    ]
    if not values:
        return None
    return min(values) if experiment.config.searcher.smaller_is_better else max(values)


def progress_trained(experiment: ExperimentState, trial: TrialState) -> list[Effect]:
    """A `single` search's progress as its one trial trains: its batches over
    `searcher.max_length`, moved by whole percents (a write at most every 1%), below 1
    until the experiment completes. None for a length without a bound."""
    if experiment.config.searcher.name != "single":
        return []
    try:
        length = searcher_in_batches(experiment.config).max_length
    except InvalidConfigError:  # refused when the experiment was created
        return []
    if not length.bounded:
        return []
    percent = min(100 * trial.total_batches // max(length.value, 1), 99)
    if percent / 100 <= experiment.progress:
        return []
    return [SetExperiment(experiment.id, {"progress": percent / 100})]


def progress_reported(experiment: ExperimentState, progress: float) -> list[Effect]:
    """A script's own estimate (0..1) is its experiment's progress when the experiment is
    that one trial (`single`); a search's progress is the searcher's budget spent."""
    if experiment.config.searcher.name != "single" or progress <= experiment.progress:
        return []
    return [SetExperiment(experiment.id, {"progress": min(progress, 0.99)})]


def after_restart(
    experiment: ExperimentState, running: Collection[int], now: dt.datetime
) -> list[Effect]:
    """A restarted master's decision for each trial of a live experiment that has no run
    awaiting its agents (`running`): resume, pause or finish the stop under way."""
    stopping = experiment.state in (E.STOPPING_CANCELED, E.STOPPING_KILLED)
    effects: list[Effect] = []
    for trial in experiment.trials.values():
        if trial.id in running:
            continue  # still running, we hope: its agent will say
        if trial.state not in (T.RUNNING, T.QUEUED, T.STOPPING, T.PAUSED):
            continue
        if stopping:
            # A cancel or kill was under way: finish it rather than resume.
            effects += end_trial(trial, T.CANCELED, now)
        elif trial.awaiting_parent:
            continue  # it starts when its parent's run ends
        elif trial.state == T.PAUSED and trial.closed and experiment.state == E.ACTIVE:
            effects += close_paused(experiment, trial, now)
        elif trial.state == T.PAUSED and (trial.target is None or experiment.state != E.ACTIVE):
            continue
        elif experiment.state == E.ACTIVE:
            effects += requeue(trial)
        else:
            effects.append(SetTrial(trial.id, {"state": T.PAUSED}))
    effects.append(Settle(experiment.id))
    return effects
