"""The master's decisions as pure code: experiment, trial, run and agent transitions.

Each transition is a function over plain data (`TrialStatus`, `ExperimentStatus`, the
core's state dataclasses) that returns effects; the `Interpreter` (`_interpreter.py`)
applies them to memory, the write batch and the agents' outboxes, and `Master`
(`_core.py`) is the shell that holds the lock around it and commits. `simulate` drives
the master through a seeded fake cluster and checks the invariants at every step, as
`searcher/simulate.py` does for search.

What a decision orders an agent to do (`StartRun`, `KillRun`) is plain data here too;
the lifecycle reads no store, sends nothing and imports nothing of the shell.
"""

from assay.master.lifecycle import _effects as effects
from assay.master.lifecycle._model import (
    CONTINUE_EDGES,
    EXPERIMENT_EDGES,
    LIVE_EXPERIMENT,
    MEMORY_ONLY,
    RELEASED,
    STOP_OF_EXPERIMENT,
    TERMINAL_EXPERIMENT,
    TERMINAL_TRIAL,
    TRIAL_EDGES,
    ExperimentState,
    ExperimentStatus,
    Failure,
    Placement,
    Restore,
    Run,
    StopKind,
    TrialState,
    TrialStatus,
)
from assay.master.lifecycle._orders import AgentMessage, KillRun, StartRun
from assay.master.lifecycle.run import Outcome, RunEnd, finish_run, run_end, run_outcome

__all__ = [
    "AgentMessage",
    "KillRun",
    "StartRun",
    "CONTINUE_EDGES",
    "EXPERIMENT_EDGES",
    "LIVE_EXPERIMENT",
    "MEMORY_ONLY",
    "RELEASED",
    "STOP_OF_EXPERIMENT",
    "TERMINAL_EXPERIMENT",
    "TERMINAL_TRIAL",
    "TRIAL_EDGES",
    "ExperimentState",
    "ExperimentStatus",
    "Failure",
    "Outcome",
    "Placement",
    "Restore",
    "Run",
    "RunEnd",
    "StopKind",
    "TrialState",
    "TrialStatus",
    "effects",
    "finish_run",
    "run_end",
    "run_outcome",
]
