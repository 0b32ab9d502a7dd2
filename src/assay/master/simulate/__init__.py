"""A seeded fake cluster around a real `Master`: agents, trial processes, users and
restarts played at random, with the master's invariants checked after every step.

`simulate(seed, events)` builds a `Master` on an in-memory store (`MemoryStore`; or with
`store="sqlite"` on a SQLite file), its files in a temporary directory (no gRPC, no
processes, no clock), and plays `events` steps chosen by `random.Random(seed)`:
agents join, disconnect, die silently and come back with what they still run; trial
processes ask for work, report metrics and checkpoints, complete operations, fail, exit
with an invalid-hyperparameters or a preempted code, and obey kills; users create
experiments (single, grid, random, asha, adaptive_asha), pause, activate, cancel and kill
them, and disable agents; the master is restarted on its store. A drain phase then lets
every run finish and requires every experiment to end on its own.

After each step the master's state is taken as a plain `Snapshot` and checked (no slot is
held twice, states move along the allowed edges, the queue holds only queued trials of
active experiments, a RUNNING trial has a run, a STOPPING one a run being stopped, no
trial its searcher closed is PAUSED); a fake agent also checks that a start never lands
on slots its processes still use and restores the trial's newest checkpoint, and a
restarted master must rebuild what the old one held. A breach raises `InvariantError`
naming the seed and the step, so `simulate(seed, events)` replays it.

The reconnect window is 0 (a lost agent's runs are given up at once) or endless (they
wait until the agent is back), chosen by the seed: either way nothing waits on a clock.

The modules, from the bottom up: `_snapshot` (the master's state as plain data, and the
moves its states may make), `_checks` (the invariants on snapshots), `_adapter` (every
call into the master goes through `MasterAdapter`), `_cluster` (the fake agents and their
processes), `_workload` (what users submit), `_simulation` (the loop, the users'
actions, restarts and the drain).
"""

from assay.master.simulate._adapter import MasterAdapter, Outbox, StoreKind
from assay.master.simulate._checks import (
    check_move,
    check_progress,
    check_queue,
    check_restart,
    check_runs,
    check_slots,
    check_snapshot,
    check_trials,
)
from assay.master.simulate._cluster import (
    FakeAgent,
    Process,
    check_restore,
    check_start,
)
from assay.master.simulate._simulation import Stats, simulate
from assay.master.simulate._snapshot import (
    EXPERIMENT_EDGES,
    EXPERIMENT_MOVES,
    TRIAL_EDGES,
    TRIAL_MOVES,
    ExperimentView,
    InvariantError,
    RunView,
    Snapshot,
    TrialView,
)
from assay.master.simulate._workload import experiment_config, model_archive

__all__ = [
    "EXPERIMENT_EDGES",
    "EXPERIMENT_MOVES",
    "TRIAL_EDGES",
    "TRIAL_MOVES",
    "ExperimentView",
    "FakeAgent",
    "InvariantError",
    "MasterAdapter",
    "Outbox",
    "Process",
    "RunView",
    "Snapshot",
    "Stats",
    "StoreKind",
    "TrialView",
    "check_move",
    "check_progress",
    "check_queue",
    "check_restart",
    "check_restore",
    "check_runs",
    "check_slots",
    "check_snapshot",
    "check_start",
    "check_trials",
    "experiment_config",
    "model_archive",
    "simulate",
]
