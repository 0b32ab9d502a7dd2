"""A run's end: what becomes of its trial (`run_outcome`), and the effects of that.

`run_outcome` is the whole table of how a run can end, in order of precedence: the
first row whose condition holds decides. It reads plain facts only, so the table is
tested row by row (tests/lifecycle/test_run_outcome.py).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from assay.config import LogPolicy
from assay.errors import INVALID_HP_EXIT_CODE, PERMANENT_ERROR_EXIT_CODE, PREEMPTED_EXIT_CODE
from assay.master.lifecycle._effects import (
    CollectGarbage,
    Effect,
    Enqueue,
    Kill,
    Log,
    RecordSearch,
    Settle,
    SetTrial,
    Tell,
)
from assay.master.lifecycle._model import (
    ExperimentStatus,
    Failure,
    Run,
    StopKind,
    TrialState,
    TrialStatus,
)
from assay.master.lifecycle.log_policy import Matched, matched


class Outcome(Enum):
    """What a run's end makes of its trial."""

    CANCELED = "canceled: its experiment was canceled or killed"
    KILLED = "canceled: a user killed the trial; the searcher sees it exit, the others go on"
    COMPLETED = "completed: the searcher closed it"
    PREEMPTED = "requeued: stopped at a checkpoint to free its slots (preempted, agent disabled)"
    PAUSED = "paused: its experiment was paused"
    RESUMED = "requeued: its experiment was activated while the pause landed"
    LOST = "requeued: an agent of the run was lost (not a restart)"
    AT_RUNG = "paused: validated at its rung, waiting for a promotion"
    PROMOTED = "requeued: promoted while it stopped at its rung"
    SCRIPT_DONE = "completed: a script exited 0 before its target"
    STOPPED = "requeued: stopped at a checkpoint when asked (SIGTERM)"
    INVALID_HP = "canceled: its hyperparameters are unusable (InvalidHP)"
    PERMANENT = "error: failed in a way every run would repeat (not restarted)"
    LOG_POLICY = "error: failed, and a line of its log matched a cancel_retries log policy"
    REPEATED = "error: failed as the run before it did, with no progress between"
    RESTART = "requeued: failed, with restarts left"
    ERROR = "error: failed, with no restarts left"


@dataclass(frozen=True)
class RunEnd:
    """What is known when the last part of a run is gone."""

    exit_codes: tuple[int, ...]  # every rank's, of every agent
    stopping: StopKind | None = None
    lost: bool = False
    released: bool = False
    # The trial's side.
    closed: bool = False
    target: int | None = None
    restarts: int = 0
    # The experiment's side.
    experiment_active: bool = True
    is_script: bool = False
    max_restarts: int = 5
    metric: str | None = None  # searcher.metric, for the messages
    # How it failed (None: it did not say, or it did not fail), and the trial's failure
    # before it, which it may repeat.
    failure: Failure | None = None
    last_failure: Failure | None = None
    # What its log lines that matched the experiment's log_policies do.
    matched: Matched = field(default_factory=Matched)

    @property
    def repeated(self) -> bool:
        return self.failure is not None and self.failure.repeats(self.last_failure)

    @property
    def ok(self) -> bool:
        return bool(self.exit_codes) and all(c == 0 for c in self.exit_codes)

    @property
    def preempted(self) -> bool:
        codes = self.exit_codes
        return PREEMPTED_EXIT_CODE in codes and all(c in (0, PREEMPTED_EXIT_CODE) for c in codes)


def run_outcome(end: RunEnd) -> Outcome:
    """The first row that applies, in this order."""
    if end.stopping in ("cancel", "kill"):
        return Outcome.CANCELED
    if end.stopping == "kill_trial":
        return Outcome.KILLED
    if end.closed and (end.ok or end.preempted):
        # Done: the searcher closed it, whatever stop was landing as it exited (a pause
        # or preemption that stopped it at a checkpoint leaves nothing more to run).
        return Outcome.COMPLETED
    if end.stopping == "preempt":
        return Outcome.PREEMPTED  # resumes from its checkpoint later
    if end.stopping == "pause":
        return Outcome.RESUMED if end.experiment_active else Outcome.PAUSED
    if end.lost:
        return Outcome.LOST
    if end.ok and end.target is None:
        return Outcome.AT_RUNG  # validated at its rung and not promoted (yet)
    if end.ok and end.released:
        return Outcome.PROMOTED  # told to stop at its rung, then promoted on its way out
    if end.ok and end.is_script:
        # As in Determined: a script that exits 0 has finished; its code decided so, and
        # running it again would decide the same.
        return Outcome.SCRIPT_DONE
    if end.preempted:
        return Outcome.STOPPED  # e.g. its agent shutting down: not the user's failure
    if INVALID_HP_EXIT_CODE in end.exit_codes:
        return Outcome.INVALID_HP
    if PERMANENT_ERROR_EXIT_CODE in end.exit_codes:
        # The harness exits 78 only for what a restart would repeat (its entrypoint, its
        # construction, a validation without searcher.metric): restarts would be wasted.
        return Outcome.PERMANENT
    if end.restarts + 1 > end.max_restarts:
        return Outcome.ERROR
    if end.matched.cancel is not None:
        return Outcome.LOG_POLICY  # the user's word that such a failure would repeat
    if end.repeated:
        # The same error at the same batch from the same checkpoint, twice in a row: a
        # missing file, a bad record, a wrong path. The next run would only repeat it.
        return Outcome.REPEATED
    return Outcome.RESTART


def run_end(
    run: Run,
    trial: TrialState,
    experiment_state: ExperimentStatus,
    *,
    is_script: bool,
    max_restarts: int,
    metric: str | None = None,
    policies: Sequence[LogPolicy] = (),
) -> RunEnd:
    failure = None
    if run.failure:
        checkpoint = trial.checkpoint.uuid if trial.checkpoint is not None else None
        failure = Failure(run.failure, trial.total_batches, checkpoint, run.run_id)
    return RunEnd(
        exit_codes=tuple(c for codes in run.exit_codes.values() for c in codes),
        stopping=run.stopping,
        lost=run.lost,
        released=run.released,
        closed=trial.closed,
        target=trial.target,
        restarts=trial.restarts,
        experiment_active=experiment_state == ExperimentStatus.ACTIVE,
        is_script=is_script,
        max_restarts=max_restarts,
        metric=metric,
        failure=failure,
        last_failure=trial.last_failure,
        matched=matched(run, policies),
    )


def end_trial(trial: TrialState, state: TrialStatus, now: dt.datetime) -> list[Effect]:
    """A trial's end; a trial that checkpointed leaves checkpoints to collect."""
    effects: list[Effect] = [SetTrial(trial.id, {"state": state, "end_time": now})]
    if trial.checkpointed:
        effects.append(CollectGarbage(trial.experiment_id, ended_trial_ids=(trial.id,)))
    return effects


def killed(trial: TrialState, now: dt.datetime) -> list[Effect]:
    """A trial a user killed ends CANCELED, and its searcher sees it exit early (as
    Determined's does: a search asks for what it still needs)."""
    return [
        *end_trial(trial, TrialStatus.CANCELED, now),
        Tell(trial.experiment_id, trial.request_id, "on_trial_exited_early", ("user_canceled",)),
    ]


def requeue(trial: TrialState, **fields: object) -> list[Effect]:
    return [SetTrial(trial.id, {"state": TrialStatus.QUEUED, **fields}), Enqueue(trial.id)]


def finish_run(
    run: Run, trial: TrialState, end: RunEnd, now: dt.datetime
) -> tuple[Outcome, list[Effect]]:
    """The outcome of a run whose every part is gone, and its effects on the trial,
    the searcher and the experiment."""
    outcome = run_outcome(end)
    O, T = Outcome, TrialStatus  # noqa: E741, N806 - the table's row and state names
    exp, req = run.experiment_id, trial.request_id
    # Before it is requeued: its request avoids the agents its log_policies exclude.
    effects: list[Effect] = [] if outcome in _ENDS_TRIAL else _exclusions(run, trial, end)
    if outcome is O.CANCELED:
        effects += end_trial(trial, T.CANCELED, now)
    elif outcome is O.KILLED:
        effects += killed(trial, now)
    elif outcome is O.COMPLETED:
        effects += end_trial(trial, T.COMPLETED, now)
        effects.append(Tell(exp, req, "on_trial_closed"))
    elif outcome in (O.PREEMPTED, O.RESUMED, O.PROMOTED, O.STOPPED):
        effects += requeue(trial)
    elif outcome in (O.PAUSED, O.AT_RUNG):
        effects.append(SetTrial(trial.id, {"state": T.PAUSED}))
    elif outcome is O.LOST:
        message = f"assay: run {run.run_id} lost its agent; requeued (not a restart)"
        effects.append(Log(trial.id, run.run_id, message))
        effects += requeue(trial)
    elif outcome is O.SCRIPT_DONE:
        message = script_done_message(run.run_id, trial, end.metric)
        effects.append(Log(trial.id, run.run_id, message))
        effects += end_trial(trial, T.COMPLETED, now)
        effects.append(Tell(exp, req, "on_trial_exited_early", ("user_canceled",)))
    elif outcome is O.INVALID_HP:
        message = f"assay: run {run.run_id}: its hyperparameters are unusable (InvalidHP)"
        effects.append(Log(trial.id, run.run_id, message))
        effects += end_trial(trial, T.CANCELED, now)
        effects.append(Tell(exp, req, "on_trial_exited_early", ("invalid_hp",)))
    else:
        effects += _failed(run, trial, end, outcome, now)
    effects.append(Settle(exp))
    return outcome, effects


def script_done_message(run_id: int, trial: TrialState, metric: str | None = None) -> str:
    """What the trial's log says when its script exited 0 with its searcher target open:
    the searcher takes a target's result from a validation of `searcher.metric` reported
    at or after the target's batch, so say which of the two was missing."""
    at = f"assay: run {run_id} exited 0 at batch {trial.total_batches}"
    if trial.best_validation is None:
        named = f"{metric!r} (searcher.metric)" if metric else "searcher.metric"
        why = (
            f"without reporting the searcher's metric {named} in any validation, so the "
            "searcher has no result from it"
        )
    elif trial.target is not None and trial.total_batches >= trial.target:
        why = (
            f"without a validation at or after its searcher target {trial.target} (the "
            f"searcher takes its result from a validation reported at batch >= "
            f"{trial.target}; validate once more before exiting)"
        )
    else:
        why = f"before its searcher target {trial.target}"
    return f"{at}, {why}: the trial ends as completed"


def _failed(
    run: Run, trial: TrialState, end: RunEnd, outcome: Outcome, now: dt.datetime
) -> list[Effect]:
    restarts, limit = trial.restarts + 1, end.max_restarts
    why = "; ".join(run.messages) or f"exit codes {list(end.exit_codes)}"
    if end.ok:
        why = f"its process exited 0 before training to batch {trial.target}"
    stopped = _not_restarted(end, outcome)
    error = f"run {run.run_id}{f' ({stopped})' if stopped else ''}: {why}"
    effects: list[Effect] = [SetTrial(trial.id, {"last_error": error})]
    if end.failure != trial.last_failure:  # the next failure is compared with this one
        effects += [
            SetTrial(trial.id, {"last_failure": end.failure}),
            RecordSearch(run.experiment_id),
        ]
    if outcome is Outcome.RESTART:
        source = "its latest checkpoint" if trial.checkpoint else "the start (no checkpoint yet)"
        what = f"restart {restarts} of {limit} from {source}"
        effects.append(SetTrial(trial.id, {"state": TrialStatus.QUEUED, "restarts": restarts}))
        # A failing trial goes to the back; the others keep their place.
        effects.append(Enqueue(trial.id, to_back=True))
    else:
        if outcome is Outcome.PERMANENT:
            what = "every run would fail the same way: the trial ends in ERROR, not restarted"
        elif stopped:
            left = limit - trial.restarts
            what = f"{stopped}: the trial ends in ERROR ({left} of max_restarts {limit} unused)"
        else:
            what = f"no restarts left (max_restarts: {limit}): the trial ends in ERROR"
        effects += end_trial(trial, TrialStatus.ERROR, now)
        effects.append(
            Tell(run.experiment_id, trial.request_id, "on_trial_exited_early", ("errored",))
        )
    message = f"assay: run {run.run_id} failed ({why}); {what}"
    effects.append(Log(trial.id, run.run_id, message, level="ERROR"))
    return effects


# The outcomes after which the trial has no next run (for exclude_node to steer).
_ENDS_TRIAL = frozenset(
    {
        Outcome.CANCELED,
        Outcome.KILLED,
        Outcome.COMPLETED,
        Outcome.SCRIPT_DONE,
        Outcome.INVALID_HP,
        Outcome.PERMANENT,
        Outcome.LOG_POLICY,
        Outcome.REPEATED,
        Outcome.ERROR,
    }
)


def _not_restarted(end: RunEnd, outcome: Outcome) -> str | None:
    """Why a failed run with restarts left is not restarted, as its trial's last_error and
    log say it; None when that is not why it ends."""
    if outcome is Outcome.LOG_POLICY:
        return f"not restarted: {end.matched.cancel} (cancel_retries)"
    if outcome is Outcome.REPEATED and end.last_failure is not None:
        batch = f"batch {end.failure.total_batches}" if end.failure else "the same batch"
        return (
            f"not restarted: it failed as run {end.last_failure.run_id} did, at {batch}, "
            "with no batch or checkpoint gained since"
        )
    return None


def _exclusions(run: Run, trial: TrialState, end: RunEnd) -> list[Effect]:
    """The agents whose lines matched an exclude_node policy: the trial's next runs avoid
    them (when it has any), and its log says why."""
    new = [(agent, why) for agent, why in end.matched.exclude if agent not in trial.excluded_agents]
    if not new:
        return []
    avoided = (*trial.excluded_agents, *(agent for agent, _ in new))
    effects: list[Effect] = [
        SetTrial(trial.id, {"excluded_agents": avoided}),
        RecordSearch(run.experiment_id),
    ]
    for agent, why in new:
        message = f"assay: run {run.run_id}: {why} (exclude_node): the trial's runs avoid {agent}"
        effects.append(Log(trial.id, run.run_id, message))
    return effects


def preemption(
    request_id: str, priority: int, victims: Iterable[Run], *, fair_share: bool = False
) -> list[Effect]:
    """Stop `victims` at a checkpoint so that `request_id` fits once they are gone
    (`fair_share`: its experiment is below its fair share, theirs above)."""
    effects: list[Effect] = []
    why = "below its fair share" if fair_share else f"priority {priority}"
    for run in victims:
        effects += stop_to_requeue(run, f"preempted for trial {request_id} ({why})")
    return effects


def stop_to_requeue(run: Run, why: str) -> list[Effect]:
    """Stop `run` at a checkpoint, its trial to requeue (`Outcome.PREEMPTED`), saying why."""
    message = f"assay: run {run.run_id} {why}; it checkpoints and requeues"
    return [
        SetTrial(run.trial_id, {"state": TrialStatus.STOPPING}),
        Log(run.trial_id, run.run_id, message),
        Kill(run.allocation_id, graceful=True, stopping="preempt"),
    ]
