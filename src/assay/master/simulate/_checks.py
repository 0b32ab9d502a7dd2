"""The invariants, checked on plain data: one snapshot of the master, two in a row, a
state's move, and a restarted master against the one before it.

Each check raises `InvariantError` naming what broke; the simulation adds the seed and
step. They read `Snapshot`s only, so each is shown to fail on a hand-made state
(tests/lifecycle/test_simulate.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from assay.master.simulate._snapshot import (
    TERMINAL,
    InvariantError,
    Snapshot,
    TrialView,
)


def check_slots(s: Snapshot) -> None:
    """No slot is given twice, and the scheduler holds exactly what the runs use."""
    owner: dict[tuple[str, int], int] = {}
    for trial_id, placement in s.allocations.items():
        for agent_id, slots in placement:
            size = s.agents.get(agent_id)
            if size is None:
                raise InvariantError(f"trial {trial_id} holds slots of unknown agent {agent_id}")
            for slot in slots:
                if not 0 <= slot < size:
                    raise InvariantError(f"trial {trial_id} holds slot {slot} of {agent_id}")
                if (agent_id, slot) in owner:
                    raise InvariantError(
                        f"slot {agent_id}/{slot} is given to trials {owner[agent_id, slot]} "
                        f"and {trial_id}"
                    )
                owner[agent_id, slot] = trial_id
        if trial_id not in s.runs:
            raise InvariantError(
                f"the scheduler holds slots for trial {trial_id}, which has no run"
            )
    for trial_id, run in s.runs.items():
        for agent_id, slots in run.placement:
            if agent_id in run.gone or agent_id in run.awaiting:
                continue
            for slot in slots:
                if owner.get((agent_id, slot)) != trial_id:
                    raise InvariantError(
                        f"run {run.allocation_id} of trial {trial_id} uses slot {agent_id}/{slot},"
                        f" which the scheduler gives to {owner.get((agent_id, slot))}"
                    )


def check_queue(s: Snapshot) -> None:
    """The queue holds exactly the QUEUED trials, all of active experiments."""
    for trial_id in s.queue:
        trial = s.trials.get(trial_id)
        if trial is None:
            raise InvariantError(f"queued trial {trial_id} is not a trial of a live experiment")
        experiment = s.experiments[trial.experiment_id].state
        if trial.state != "QUEUED" or experiment != "ACTIVE" or trial_id in s.runs:
            raise InvariantError(
                f"queued trial {trial_id} is {trial.state} (experiment {experiment}"
                f"{', with a run' if trial_id in s.runs else ''})"
            )
    for trial_id, trial in s.trials.items():
        if trial.state == "QUEUED" and trial_id not in s.queue:
            raise InvariantError(f"trial {trial_id} is QUEUED but not in the queue")


def check_runs(s: Snapshot) -> None:
    """A trial has a run exactly when it is RUNNING or STOPPING; live experiments are
    not over."""
    for trial_id, trial in s.trials.items():
        running = trial.state in ("RUNNING", "STOPPING")
        if running != (trial_id in s.runs):
            has = "has" if trial_id in s.runs else "has no"
            raise InvariantError(f"trial {trial_id} is {trial.state} and {has} run")
        experiment = s.experiments.get(trial.experiment_id)
        if experiment is None or trial_id not in experiment.trials:
            raise InvariantError(f"trial {trial_id} belongs to no live experiment")
        if trial.restarts > experiment.max_restarts:
            raise InvariantError(
                f"trial {trial_id} restarted {trial.restarts} times; its experiment allows "
                f"{experiment.max_restarts}"
            )
    for trial_id in s.runs:
        if trial_id not in s.trials:
            raise InvariantError(f"a run of trial {trial_id}, which is not live")
    for experiment_id, experiment in s.experiments.items():
        if experiment.state in TERMINAL:
            raise InvariantError(f"experiment {experiment_id} is {experiment.state} yet live")
        trials = [s.trials[t] for t in experiment.trials]
        over = all(t.state in TERMINAL for t in trials)
        if over and experiment.state != "PAUSED" and (experiment.shutdown or trials):
            raise InvariantError(
                f"experiment {experiment_id} is {experiment.state} with every trial ended"
            )


def check_trials(s: Snapshot) -> None:
    """A STOPPING trial's run is being stopped, and a trial its searcher closed is PAUSED
    only while its experiment is (activation ends it; nothing else would)."""
    for trial_id, trial in s.trials.items():
        run = s.runs.get(trial_id)
        if trial.state == "STOPPING" and run is not None and run.stopping is None:
            raise InvariantError(f"trial {trial_id} is STOPPING but its run is not stopped")
        experiment = s.experiments.get(trial.experiment_id)
        paused = experiment is not None and experiment.state == "PAUSED"
        if trial.closed and trial.state == "PAUSED" and not paused:
            raise InvariantError(
                f"trial {trial_id} is PAUSED after its searcher closed it: nothing will end it"
            )


def check_progress(old: Snapshot, new: Snapshot) -> None:
    """What only grows: an experiment's progress, a trial's run number and restarts."""
    for experiment_id, experiment in new.experiments.items():
        was = old.experiments.get(experiment_id)
        if was is not None and experiment.progress < was.progress:
            raise InvariantError(
                f"experiment {experiment_id}'s progress fell from {was.progress} to "
                f"{experiment.progress}"
            )
    for trial_id, trial in new.trials.items():
        before = old.trials.get(trial_id)
        if before is not None and (
            trial.run_id < before.run_id or trial.restarts < before.restarts
        ):
            raise InvariantError(f"trial {trial_id} went back from {before} to {trial}")


def check_snapshot(s: Snapshot) -> None:
    """Every check of one snapshot."""
    check_slots(s)
    check_queue(s)
    check_runs(s)
    check_trials(s)


def check_usage_closed(open_records: Sequence[tuple[str, str]]) -> None:
    """Once every run has ended (after the drain), so has every usage record: each
    allocation's records are closed exactly when it ends, or at the latest by a restart."""
    if open_records:
        raise InvariantError(
            f"{len(open_records)} usage record(s) still open after every run ended: "
            f"{list(open_records)[:5]} (allocation, agent)"
        )


def check_move(
    what: str, key: int, old: str, new: str, moves: Mapping[str, frozenset[str]]
) -> None:
    if new not in moves.get(old, frozenset()):
        raise InvariantError(f"{what} {key} moved from {old} to {new}")


def check_restart(old: Snapshot, new: Snapshot, *, keep_runs: bool) -> None:
    """A master started on the store of `old` holds the same experiments and trials.

    Documented differences (`Interpreter.recover`): a trial that was running keeps its run
    when `keep_runs` (the run awaits its agents), else it is requeued (PAUSED in a paused
    experiment); a stopping experiment's trials without a run end CANCELED, and the
    experiment ends once none is left.
    """
    expected_live: set[int] = set()
    for experiment_id, experiment in old.experiments.items():
        stopping = experiment.state.startswith("STOPPING_")
        states: dict[int, str] = {}
        for trial_id in experiment.trials:
            trial = old.trials[trial_id]
            states[trial_id] = _recovered_state(
                trial, experiment.state, keep_run=keep_runs and trial_id in old.runs
            )
        if not (stopping and all(s in TERMINAL for s in states.values())):
            expected_live.add(experiment_id)
        mine = new.experiments.get(experiment_id)
        if mine is None:
            continue
        if mine != experiment:
            raise InvariantError(f"experiment {experiment_id} was {experiment}, restored {mine}")
        for trial_id, state in states.items():
            was = old.trials[trial_id]
            now, wanted = new.trials.get(trial_id), replace(was, state=state)
            if now is not None and (state in TERMINAL or stopping):
                # The stored search keeps no target or closed mark up to date once a trial
                # has ended or its experiment's search is over (it is being stopped).
                now = replace(now, target=was.target, closed=was.closed)
            if now != wanted:
                raise InvariantError(f"trial {trial_id} was {was}, restored {now}")
            if state in ("RUNNING", "STOPPING"):
                run, mine_run = old.runs[trial_id], new.runs.get(trial_id)
                awaiting = frozenset(a for a, _ in run.placement)
                # The experiment's stop, else a preemption under way goes on; a run told
                # "no more" stays so (the store keeps both).
                stop = _STOP_AFTER_RESTART.get(experiment.state, run.stopping)
                expected = replace(run, gone=frozenset(), awaiting=awaiting, stopping=stop)
                if mine_run != replace(expected, released=run.released and stop is None):
                    raise InvariantError(f"run of trial {trial_id} was {run}, restored {mine_run}")
    if set(new.experiments) != expected_live:
        raise InvariantError(
            f"live experiments after the restart: {sorted(new.experiments)}, expected "
            f"{sorted(expected_live)}"
        )
    if new.allocations:
        raise InvariantError(f"a restarted master holds slots before any agent: {new.allocations}")


# The stop a restarted master finishes for a run of an experiment in each state.
_STOP_AFTER_RESTART = {"PAUSED": "pause", "STOPPING_CANCELED": "cancel", "STOPPING_KILLED": "kill"}


def _recovered_state(trial: TrialView, experiment: str, *, keep_run: bool) -> str:
    if trial.state in TERMINAL or keep_run:
        return trial.state
    if experiment.startswith("STOPPING_"):
        return "CANCELED"
    if trial.state == "PAUSED" and (trial.target is None or experiment != "ACTIVE"):
        return "PAUSED"
    return "QUEUED" if experiment == "ACTIVE" else "PAUSED"
