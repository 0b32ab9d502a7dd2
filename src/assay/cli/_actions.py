"""`assay experiment pause|activate|cancel|kill|archive|unarchive`: the action, then one
line saying what it did to the experiment's trials."""

from __future__ import annotations

import time

from assay.client import (
    TERMINAL_EXPERIMENT_STATES,
    TERMINAL_TRIAL_STATES,
    Client,
    MasterError,
    experiment_state,
    poll_seconds,
    trial_state,
)

# How long `kill` waits for its trials to end before it says they are still stopping.
KILL_WAIT_S = 30.0


def _live_trials(api: Client, experiment_id: int) -> list[int] | None:
    """The ids of the experiment's trials that have not ended (queued ones included);
    None when they cannot be read (the action itself then says why, if it fails)."""
    try:
        trials = api.get_experiment(experiment_id).trials
    except MasterError:
        return None
    return sorted(t.id for t in trials if trial_state(t.state) not in TERMINAL_TRIAL_STATES)


def _trials(ids: list[int] | None) -> str:
    """`2 trials (4, 5)`, `1 trial (4)`; `its trials` when not known."""
    if ids is None:
        return "its trials"
    named = ", ".join(str(i) for i in ids[:8]) + (", ..." if len(ids) > 8 else "")
    return f"{len(ids)} trial{'s' if len(ids) != 1 else ''} ({named})"


def run_action(api: Client, experiment_id: int, action: str) -> str:
    """Do `action` to the experiment; the line that says what happened."""
    from assay.proto import api_pb2

    live = _live_trials(api, experiment_id) if action in ("pause", "cancel", "kill") else None
    kind = api_pb2.ExperimentActionKind.Value(f"EXPERIMENT_ACTION_{action.upper()}")
    state = experiment_state(api.experiment_action(experiment_id, kind).state)
    wait = f"`assay experiment wait {experiment_id}` waits for them"
    if action == "kill":
        return _killed(api, experiment_id, state, live)
    if action == "cancel":
        if live == []:
            return f"experiment {experiment_id} canceled: it had no trials left to stop"
        return (
            f"experiment {experiment_id} canceling: {_trials(live)} checkpoint, then stop; {wait}"
        )
    if action == "pause":
        if live == []:
            return f"experiment {experiment_id} paused: it had no trials running or queued"
        return (
            f"experiment {experiment_id} paused: {_trials(live)} checkpoint and give back their "
            f"slots; `assay experiment activate {experiment_id}` resumes them"
        )
    done = {"activate": "activated", "archive": "archived", "unarchive": "unarchived"}[action]
    return f"experiment {experiment_id} {done} (now {state})"


def _killed(api: Client, experiment_id: int, state: str, live: list[int] | None) -> str:
    """Wait (up to KILL_WAIT_S) for the killed experiment to end, and say how many of
    its trials the kill stopped."""
    deadline = time.monotonic() + KILL_WAIT_S
    while state not in TERMINAL_EXPERIMENT_STATES and time.monotonic() < deadline:
        time.sleep(poll_seconds())
        state = experiment_state(api.get_experiment(experiment_id).experiment.state)
    if state not in TERMINAL_EXPERIMENT_STATES:
        return (
            f"experiment {experiment_id} is being killed: {_trials(live)} still stopping; "
            f"`assay experiment wait {experiment_id}` waits for them"
        )
    if live == []:
        return f"experiment {experiment_id} killed ({state}): it had no trials left to stop"
    return f"experiment {experiment_id} killed ({state}): {_trials(live)} stopped"


__all__ = ["KILL_WAIT_S", "run_action"]
